"""Streams given by ARN (``streamARN``): every call that names such a stream names it by ARN.

A stream shared from another account (by its resource policy) is reachable only by its ARN: a
name is looked up in the caller's own account. The source keeps the stream's name as its key
(offsets, checkpoints, the ``streamName`` column), and its Kinesis clients address the streams
given by ARN by their ARN: one handler on botocore's ``before-parameter-build`` event turns
``StreamName`` into ``StreamARN`` for them, so no call site has to know which way a stream was
given. ``GetRecords`` names no stream (its iterator does) but takes the ARN as well, which AWS
uses to authorise a reader of another account's stream: the readers pass it (:func:`arn_arg`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_ARN_RE = re.compile(r"^arn:(aws[a-z-]*):kinesis:([a-z0-9-]+):(\d{12}):stream/([a-zA-Z0-9_.-]{1,128})$")


@dataclass(frozen=True)
class StreamArn:
    """One stream's ARN, taken apart."""

    arn: str
    region: str
    account: str
    name: str

    @staticmethod
    def parse(text: str) -> StreamArn:
        """Parse ``arn:aws:kinesis:<region>:<account>:stream/<name>``; ``ValueError`` otherwise."""
        match = _ARN_RE.match(text.strip())
        if match is None:
            raise ValueError(
                f"{text.strip()!r} is not a Kinesis stream ARN "
                "(arn:aws:kinesis:<region>:<12-digit account>:stream/<name>)"
            )
        return StreamArn(text.strip(), match.group(2), match.group(3), match.group(4))


def arn_arg(arns: Mapping[str, str], stream: str) -> dict[str, str]:
    """``{"StreamARN": ...}`` for a call about ``stream`` that takes the ARN beside an iterator
    (``GetRecords``), when the stream was given by ARN; else nothing."""
    arn = arns.get(stream)
    return {"StreamARN": arn} if arn else {}


def address_by_arn(client: Any, arns: Mapping[str, str]) -> None:
    """Make ``client`` (a Kinesis client, boto3 or aiobotocore) name the streams of ``arns``
    (name -> ARN) by ARN in every call."""
    if not arns:
        return
    by_name = dict(arns)

    def to_arn(params: dict[str, Any], **_: Any) -> None:
        name = params.get("StreamName")
        if name in by_name:
            del params["StreamName"]
            params["StreamARN"] = by_name[name]

    client.meta.events.register("before-parameter-build.kinesis", to_arn, unique_id="kinesis-ddb-stream-arns")
