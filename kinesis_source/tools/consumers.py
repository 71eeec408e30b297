"""``kinesis-ddb consumers``: enhanced fan-out consumers by hand."""

from __future__ import annotations

import argparse
import sys

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import AwsSettings, error_code
from kinesis_source.aws.kinesis import NOT_FOUND
from kinesis_source.checkpoints.consumer_users import ConsumerUser, ConsumerUsers
from kinesis_source.driver.consumers import deregister_consumer, stream_arn


def deregister(args: argparse.Namespace, settings: AwsSettings) -> int:
    """``consumers deregister``: each stream's consumer ``--name``, unless the checkpoint table
    records runs that use it (``--force`` deregisters anyway and forgets them); 1 if any was
    left for that reason."""
    client, ddb = settings.boto3_client("kinesis"), settings.boto3_client("dynamodb")
    refused = 0
    for stream in args.stream:
        users = ConsumerUsers(ddb, args.table, stream_arn(client, stream), args.name)
        recorded = _recorded_users(users)
        if recorded and not args.force:
            print(f"not deregistering EFO consumer {args.name} of stream {stream}: table {args.table} "
                  f"records it as used by {', '.join(map(str, recorded))}. Stop those queries first, or "
                  "pass --force (their reads then fail until they restart).", file=sys.stderr)
            refused += 1
            continue
        if deregister_consumer(client, stream, args.name, timeout_s=args.wait):
            print(f"deregistered EFO consumer {args.name} of stream {stream}")
        else:
            print(f"stream {stream} has no EFO consumer {args.name}")
        if recorded:
            users.clear()
    return 1 if refused else 0


def _recorded_users(users: ConsumerUsers) -> list[ConsumerUser]:
    """The runs recorded as using a consumer; none when the checkpoint table does not exist."""
    try:
        return users.users()
    except ClientError as exc:
        if error_code(exc) == NOT_FOUND:  # the checkpoint table does not exist
            return []
        raise
