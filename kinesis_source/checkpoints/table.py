"""The checkpoint table itself: creating it on demand and checking its key schema."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.errors import CheckpointTableError

log = logging.getLogger(__name__)

_WAIT = {"Delay": 1, "MaxAttempts": 300}  # table creation: poll each second, up to 5 minutes


def ensure_table(client: Any, table: str, create: bool) -> None:
    """Check the table's key schema; create it first (on-demand) if missing and allowed."""
    try:
        desc = client.describe_table(TableName=table)["Table"]
    except ClientError as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise
        if not create:
            raise CheckpointTableError(
                f"DynamoDB checkpoint table '{table}' does not exist and option "
                "'createTable' is false: create it (partition key 'app' S, sort key 'key' S) "
                "or set createTable=true"
            ) from None
        _create(client, table)
        desc = client.describe_table(TableName=table)["Table"]
    _check_schema(table, desc)


def _create(client: Any, table: str) -> None:
    log.info("creating DynamoDB checkpoint table %s (on-demand)", table)
    try:
        client.create_table(
            TableName=table,
            KeySchema=[
                {"AttributeName": "app", "KeyType": "HASH"},
                {"AttributeName": "key", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "app", "AttributeType": "S"},
                {"AttributeName": "key", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if error_code(exc) != "ResourceInUseException":  # another query created it first
            raise
    client.get_waiter("table_exists").wait(TableName=table, WaiterConfig=_WAIT)


def _check_schema(table: str, desc: Mapping[str, Any]) -> None:
    keys = {k["AttributeName"]: k["KeyType"] for k in desc.get("KeySchema", [])}
    types = {a["AttributeName"]: a["AttributeType"] for a in desc.get("AttributeDefinitions", [])}
    if keys != {"app": "HASH", "key": "RANGE"} or types.get("app") != "S" or types.get("key") != "S":
        shown = ", ".join(f"{k} {t} ({types.get(k, '?')})" for k, t in keys.items())
        raise CheckpointTableError(
            f"DynamoDB table '{table}' has key schema [{shown}], but a kinesis-ddb "
            "checkpoint table needs partition key 'app' (S) and sort key 'key' (S): set "
            "option 'checkpointTable' to another table"
        )
