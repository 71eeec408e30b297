"""Who uses an EFO consumer, kept in the checkpoint table so that a stopping query does not
deregister a consumer another query still reads through.

A consumer is shared whenever two query runs name it: two runs of one application (the newer
fences the older, which then stops), or two applications with the same ``consumerName``. Each
run that reads through a consumer writes one item under the consumer's partition (app
``consumer/<stream ARN>/<consumer name>``, which no application name can be: those have no
``/``), sort key ``user#<application>``, holding the run's epoch. A run leaves on a clean stop by
deleting its item only while it still holds the epoch it joined with (a newer run of the same
application has overwritten it otherwise), and ``deregisterConsumer=true`` deregisters only once
no item is left.

Keyed by the consumer's name, not its ARN: a consumer deregistered and registered again has a
new ARN, and the same users.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.checkpoints.format import now_iso

log = logging.getLogger(__name__)

USER_PREFIX = "user#"


@dataclass(frozen=True)
class ConsumerUser:
    """One run's claim on a consumer: its application, epoch, host and when it joined."""

    application: str
    epoch: int
    host: str
    since: str

    def __str__(self) -> str:
        return f"application '{self.application}' (epoch {self.epoch} on {self.host}, since {self.since})"


class ConsumerUsers:
    """The users of one EFO consumer (``consumer_name`` of the stream ``stream_arn``) in the
    checkpoint table ``table``."""

    def __init__(self, client: Any, table: str, stream_arn: str, consumer_name: str) -> None:
        self._client = client
        self._table = table
        self._partition = f"consumer/{stream_arn}/{consumer_name}"

    def _key(self, application: str) -> dict[str, dict[str, str]]:
        return {"app": {"S": self._partition}, "key": {"S": USER_PREFIX + application}}

    def join(self, application: str, epoch: int, host: str) -> None:
        """Record that ``application``'s run ``epoch`` reads through the consumer (replacing
        what an older run of it recorded)."""
        self._client.put_item(
            TableName=self._table,
            Item={
                **self._key(application),
                "epoch": {"N": str(epoch)},
                "host": {"S": host},
                "since": {"S": now_iso()},
            },
        )

    def leave(self, application: str, epoch: int) -> bool:
        """Remove the run's item; False (nothing removed) when a newer run of the application
        has joined since, which still uses the consumer."""
        try:
            self._client.delete_item(
                TableName=self._table,
                Key=self._key(application),
                ConditionExpression="attribute_not_exists(epoch) OR epoch = :e",
                ExpressionAttributeValues={":e": {"N": str(epoch)}},
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def clear(self) -> None:
        """Forget every user (the consumer was deregistered by hand)."""
        for user in self.users():
            self._client.delete_item(TableName=self._table, Key=self._key(user.application))

    def users(self) -> list[ConsumerUser]:
        """Every run recorded as using the consumer (consistent read)."""
        found: list[ConsumerUser] = []
        paginator = self._client.get_paginator("query")
        pages = paginator.paginate(
            TableName=self._table,
            KeyConditionExpression="app = :p AND begins_with(#k, :u)",
            ExpressionAttributeNames={"#k": "key"},
            ExpressionAttributeValues={":p": {"S": self._partition}, ":u": {"S": USER_PREFIX}},
            ConsistentRead=True,
        )
        for page in pages:
            for item in page.get("Items", []):
                found.append(
                    ConsumerUser(
                        application=item["key"]["S"][len(USER_PREFIX):],
                        epoch=int(item.get("epoch", {}).get("N", "0")),
                        host=item.get("host", {}).get("S", "?"),
                        since=item.get("since", {}).get("S", "?"),
                    )
                )
        return found
