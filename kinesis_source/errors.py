"""The one root of every error kinesis-ddb raises, and the data-loss reports.

Every exception the package raises derives from :class:`KinesisDdbError`; its ``retriable``
attribute says whether the same operation may succeed when tried again (a subscription that
ended early, say), as opposed to an error the user must act on. Option, position and aggregate
errors stay ``ValueError``s and runtime errors ``RuntimeError``s, so code that catches those
keeps working.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # positions imports this module
    from kinesis_source.positions import Position

log = logging.getLogger(__name__)


# What to do when botocore finds no credentials, for every service's message.
NO_CREDENTIALS = (
    "set options 'awsAccessKeyId' and 'awsSecretKey', or 'profile', or make them available to "
    "boto3's default chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, an "
    "instance or container role)."
)


class KinesisDdbError(Exception):
    """Root of every error kinesis-ddb raises."""

    retriable = False


class OptionError(KinesisDdbError, ValueError):
    """A bad option value: the message names the option, the value and the rule."""


class PositionError(KinesisDdbError, ValueError):
    """A position or offset that cannot be parsed."""


class CorruptAggregateError(KinesisDdbError, ValueError):
    """An aggregate (magic and MD5 match) whose protobuf body does not decode."""


class KinesisSourceError(KinesisDdbError, RuntimeError):
    """An error the user can act on; the message names the stream and shard."""


class StreamNotFoundError(KinesisSourceError):
    """The stream does not exist (the message says which option names it)."""


class RangeIncompleteError(KinesisSourceError):
    """A planned range could not be read to its end."""


class DataLossError(KinesisSourceError):
    """Records after a position are gone (trimmed by retention, or the shard deleted)."""


class ShardNotFoundError(KinesisSourceError):
    """The stream exists but no longer has the shard (expired past the stream's retention, or
    its stream was re-created meanwhile): raised by the clients, and turned into a data-loss
    report by :func:`report_shard_gone` where the position being read is known."""

    def __init__(self, stream: str, shard_id: str) -> None:
        super().__init__(f"Kinesis stream '{stream}' has no shard '{shard_id}'")
        self.stream = stream
        self.shard_id = shard_id


class ConsumerError(KinesisSourceError):
    """The EFO consumer cannot be registered, found or made ACTIVE."""


class SubscriptionEndedEarly(KinesisDdbError):
    """A subscription ended before sending a single event (counted as a failed attempt, so a
    server that keeps doing it cannot make the reader loop forever)."""

    retriable = True


class CheckpointError(KinesisDdbError, RuntimeError):
    """A checkpoint-store error the user can act on; names the application and table."""


class CheckpointFencedError(CheckpointError):
    """Another query claimed the application after this one."""


class CheckpointTableError(CheckpointError):
    """The table is missing or has the wrong shape."""


class CommitCallbackError(KinesisDdbError, RuntimeError):
    """A commit callback raised (with ``onCommitErrors=fail``)."""


class SinkInputError(KinesisDdbError, ValueError):
    """Rows the sink cannot write: a missing or mistyped column, or a row that breaks a
    Kinesis record rule. The message names the column (and row) and says what to change."""


class SinkWriteError(KinesisSourceError):
    """Records Kinesis kept refusing after their retries: names the stream, the count and the
    error codes."""


class WriteCallbackError(KinesisDdbError, RuntimeError):
    """An ``onWrite`` callback raised (the rows were written)."""


def report_data_loss(
    stream: str, shard_id: str, start: Position, landed: str | None, fail: bool
) -> None:
    """Records after ``start`` are gone: raise :class:`DataLossError` (``failOnDataLoss=true``)
    or log a warning and go on. The message names stream, shard, position and remedy."""
    where = f"the oldest record left is {landed}" if landed else "the position was rejected"
    message = (
        f"Records of Kinesis stream '{stream}' shard '{shard_id}' after position {start} are no "
        f"longer in the stream (older than its retention period, or trimmed): {where}. Set "
        "option failOnDataLoss=false to go on from the oldest record left, or move the "
        "application with `kinesis-ddb checkpoints reset`."
    )
    if fail:
        raise DataLossError(message)
    log.warning("%s Going on (failOnDataLoss=false).", message)


def report_shard_gone(stream: str, shard_id: str, position: Position, fail: bool) -> None:
    """A tracked shard is gone while records after ``position`` were still to be read: raise
    :class:`DataLossError` (``failOnDataLoss=true``) or log a warning and go on without it."""
    message = (
        f"Kinesis stream '{stream}' no longer has shard '{shard_id}', which was read only up to "
        f"{position}: its unread records are lost (the shard expired past the stream's "
        "retention, or was deleted)."
    )
    if fail:
        raise DataLossError(f"{message} Set option failOnDataLoss=false to go on without it.")
    log.warning("%s Going on without it (failOnDataLoss=false).", message)
