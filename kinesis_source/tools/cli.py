"""The ``kinesis-ddb`` command: ``status``, ``checkpoints show|reset|export|import-kcl``,
``consumers deregister``, ``produce``, ``options`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from datetime import datetime, timezone

from kinesis_source import __version__
from kinesis_source.aws.clients import AwsSettings
from kinesis_source.checkpoints.format import Snapshot
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.errors import CheckpointError, KinesisSourceError, OptionError
from kinesis_source.option_values import parse_initial_position
from kinesis_source.tools.status import age, table

DEFAULT_TABLE = "kinesis_ddb_checkpoints"


def _needs_extra(module: str, extra: str, command: str) -> bool:
    """True (after saying what to install) when ``module`` of an extra is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return False
    print(
        f"kinesis-ddb: '{command}' needs the [{extra}] extra: pip install 'kinesis-ddb[{extra}]' "
        f"(from a checkout: pip install '.[{extra}]')",
        file=sys.stderr,
    )
    return True


def _demo(args: argparse.Namespace) -> int:
    if _needs_extra("rich", "demo", "kinesis-ddb demo") or _needs_extra("moto", "demo", "kinesis-ddb demo"):
        return 2
    from kinesis_source.tools.demo import run

    return run(args.shards, args.records, args.rate, args.endpoint_url, args.keep, args.deadline)


def _produce(args: argparse.Namespace) -> int:
    if _needs_extra("rich", "demo", "kinesis-ddb produce"):
        return 2
    from rich.progress import Progress

    from kinesis_source.tools.produce import LoadProducer

    settings = AwsSettings(region=args.region, endpoint_url=args.endpoint_url, profile=args.profile)
    producer = LoadProducer(
        settings.boto3_client("kinesis"),
        args.stream,
        size=args.size,
        keys=args.keys,
        aggregate=args.aggregate,
        prefix=args.prefix,
    )
    with Progress() as progress:
        task = progress.add_task(f"putting to {args.stream}", total=args.records)
        done = producer.run(args.records, args.rate, lambda n: progress.update(task, completed=n))
    shards = len({s.shard_id for s in producer.snapshot()})
    print(f"put {done} records to stream {args.stream} ({shards} shards)")
    return 0


def _deregister(args: argparse.Namespace) -> int:
    from kinesis_source.tools.consumers import deregister

    return deregister(args, _settings(args))


def _settings(args: argparse.Namespace) -> AwsSettings:
    """The flags' AWS settings. A command is one short conversation with an endpoint: one it
    cannot connect to fails in a second (a wrong or missing ``--endpoint-url``), not after a
    minute of retries."""
    return AwsSettings(
        region=args.region, endpoint_url=args.endpoint_url, profile=args.profile
    ).failing_fast()


def _store(args: argparse.Namespace) -> CheckpointStore:
    return CheckpointStore(_settings(args).boto3_client("dynamodb"), args.table, args.app)


def _options(args: argparse.Namespace) -> int:
    from kinesis_source.options import options_markdown
    from kinesis_source.sink import options as sink

    print(options_markdown(), end="")
    print("\n# Options for writing (docs/sink.md)\n")
    print(sink.options_markdown(), end="")
    return 0


# The query's option names in the library's messages, and the flags that set them here.
_FLAGS = {
    "set options 'awsAccessKeyId' and 'awsSecretKey', or 'profile', or": "use --profile, or",
    "'dynamodbEndpointUrl'/'dynamodbRegion'": "--endpoint-url/--region",
    "'dynamodbEndpointUrl'": "--endpoint-url",
    "'dynamodbRegion'/'region'": "--region",
    "'endpointUrl'": "--endpoint-url",
    "'region'": "--region",
    "'applicationName'": "--app",
    "'profile'": "--profile",
    "'checkpointTable'": "--table",
    "'streamName'": "--stream",
    "Option 'initialPosition'": "--to",
}


def _in_flags(message: str) -> str:
    """``message`` with the query's option names replaced by this command's flags."""
    for option, flag in _FLAGS.items():
        message = message.replace(f"option {option}", flag).replace(option, flag)
    return message


def _existing(store: CheckpointStore) -> Snapshot:
    store.ensure_table(create=False)
    snapshot = store.snapshot()
    if snapshot.meta is None and not snapshot.shards:
        raise CheckpointError(
            f"No checkpoints for application '{store.app}' in DynamoDB table '{store.table}'"
        )
    return snapshot


def _show(args: argparse.Namespace) -> int:
    store = _store(args)
    snapshot = _existing(store)
    now = datetime.now(timezone.utc)
    meta = snapshot.meta
    if meta is not None:
        print(
            f"application {store.app} in table {store.table}: epoch {meta.epoch}, owner "
            f"{meta.owner} on {meta.owner_host}, claimed {age(meta.claimed_at, now)} ago; "
            f"initial position {meta.initial_spec or '-'}"
        )
    rows = [["shard", "position", "owner", "epoch", "committed", "age"]]
    for sid, shard in sorted(snapshot.shards.items(), key=lambda item: str(item[0])):
        rows.append(
            [
                str(sid),
                shard.position.to_str(),
                shard.owner or "-",
                str(shard.epoch),
                shard.committed_at or "-",
                age(shard.committed_at, now),
            ]
        )
    if len(rows) == 1:
        print("no shard positions committed yet")
    else:
        table(rows, sys.stdout)
    return 0


def _status(args: argparse.Namespace) -> int:
    from kinesis_source.tools.status import collect, render

    arns = _stream_arns(args.stream_arn or [])
    snapshot = _existing(_store(args))
    kinesis = AwsSettings(
        region=args.region, endpoint_url=args.kinesis_endpoint_url or args.endpoint_url, profile=args.profile,
        stream_arns=tuple(arns.items()),
    ).failing_fast().boto3_client("kinesis")
    shards = collect(snapshot, kinesis, args.max_records, arns=arns)
    if args.json:
        print(json.dumps([s.to_dict() for s in shards], indent=2, sort_keys=True))
    else:
        render(shards, sys.stdout, writes=snapshot)
    return 0


def _stream_arns(texts: list[str]) -> dict[str, str]:
    """``--stream-arn`` values as name -> ARN (the table keys streams by name)."""
    from kinesis_source.aws.streams import StreamArn

    try:
        arns = [StreamArn.parse(t) for t in texts]
    except ValueError as exc:
        raise OptionError(f"--stream-arn: {exc}") from None
    return {a.name: a.arn for a in arns}


def _export_positions(snapshot: Snapshot) -> dict[str, str]:
    positions = dict(snapshot.meta.resolved.shards) if snapshot.meta and snapshot.meta.resolved else {}
    positions.update(snapshot.positions())
    return dict(sorted((str(sid), pos.to_str()) for sid, pos in positions.items()))


def _export(args: argparse.Namespace) -> int:
    positions = _export_positions(_existing(_store(args)))
    text = json.dumps(positions, indent=2, sort_keys=True) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _reset(args: argparse.Namespace) -> int:
    if args.to_file:
        with open(args.to_file, encoding="utf-8") as fh:
            spec_text = fh.read().strip()
    else:
        spec_text = args.to
    parse_initial_position(spec_text)  # a bad target is named before any AWS call
    store = _store(args)
    store.ensure_table(create=False)
    return _apply_reset(store, spec_text, args.yes)


def _apply_reset(store: CheckpointStore, spec_text: str, yes: bool) -> int:
    spec = parse_initial_position(spec_text)
    if not yes:
        if not sys.stdin.isatty():
            print(
                f"Refusing to reset application '{store.app}' without --yes: standard input is "
                "not a terminal to confirm on.",
                file=sys.stderr,
            )
            return 2
        answer = input(
            f"Reset application '{store.app}' in table '{store.table}' to {spec}? Running "
            "queries of it will stop. Type the application name to confirm: "
        )
        if answer.strip() != store.app:
            print("Not reset.", file=sys.stderr)
            return 2
    meta = store.reset(str(spec), by=socket.gethostname())
    print(f"application {store.app} reset to {spec} (epoch {meta.epoch})")
    return 0


def _import_kcl(args: argparse.Namespace) -> int:
    from kinesis_source.positions import parse_timestamp
    from kinesis_source.tools.kcl_import import check_streams, positions, read_leases, scan, stream_facts

    at = args.at_timestamp
    if at is not None:
        try:
            parse_timestamp(at)
        except ValueError as exc:
            raise OptionError(f"--at-timestamp {at!r} is invalid: {exc}") from None
    leases_db = AwsSettings(
        region=args.lease_region or args.region,
        endpoint_url=args.lease_endpoint_url or args.endpoint_url,
        profile=args.lease_profile or args.profile,
    ).failing_fast()
    leases, skipped = read_leases(scan(leases_db.boto3_client("dynamodb"), args.lease_table), args.stream or [])
    if skipped:
        print("skipped " + ", ".join(f"{n} item(s) ({why})" for why, n in sorted(skipped.items()))
              + f" of KCL lease table '{args.lease_table}'", file=sys.stderr)
    if not leases:
        raise CheckpointError(f"KCL lease table '{args.lease_table}' has no leases"
                              + (f" of stream(s) {', '.join(args.stream)}" if args.stream else ""))
    kinesis = AwsSettings(
        region=args.region, endpoint_url=args.kinesis_endpoint_url or args.endpoint_url, profile=args.profile
    ).failing_fast().boto3_client("kinesis")
    listing, created = stream_facts(kinesis, sorted({lease.stream for lease in leases}))
    check_streams(leases, created)
    store = _store(args)
    store.ensure_table(create=True)
    return _apply_reset(store, json.dumps(positions(leases, listing, at), sort_keys=True), args.yes)


def build_parser() -> argparse.ArgumentParser:
    """The command-line grammar."""
    parser = argparse.ArgumentParser(prog="kinesis-ddb", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kinesis-ddb {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the local demo (kill mid-batch, resume from DynamoDB)")
    demo.add_argument("--shards", type=int, default=4, help="shards of the demo stream")
    demo.add_argument("--records", type=int, default=6000, help="records to produce")
    demo.add_argument("--rate", type=float, default=400.0, help="records per second")
    demo.add_argument("--endpoint-url", help="use this endpoint instead of the embedded one")
    demo.add_argument("--keep", action="store_true", help="leave the outputs for inspection")
    demo.add_argument(
        "--deadline", type=float, default=110.0,
        help="seconds after which the demo gives up and fails (a slow machine may need more)",
    )
    demo.set_defaults(func=_demo)

    produce = sub.add_parser("produce", help="put numbered records to a stream at a steady rate")
    produce.add_argument("--stream", required=True)
    produce.add_argument("--records", type=int, default=10000)
    produce.add_argument("--rate", type=float, default=1000.0, help="records per second")
    produce.add_argument("--size", type=int, default=100, help="bytes per record")
    produce.add_argument("--keys", type=int, default=64, help="distinct partition keys")
    produce.add_argument("--aggregate", type=int, default=0,
                         help="KPL-aggregate up to this many user records of one shard per "
                              "Kinesis record")
    produce.add_argument("--prefix", default="r", help="data is <prefix>-<n>, padded")
    produce.add_argument("--endpoint-url", help="Kinesis endpoint URL (local servers)")
    produce.add_argument("--region", help="AWS region (default: the boto3 chain)")
    produce.add_argument("--profile", help="AWS profile")
    produce.set_defaults(func=_produce)

    ck = sub.add_parser("checkpoints", help="inspect or move an application's positions")
    ck_sub = ck.add_subparsers(dest="action", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--app", required=True, help="the query's applicationName")
        p.add_argument("--table", default=DEFAULT_TABLE, help="the checkpoint table")
        p.add_argument("--endpoint-url", help="DynamoDB endpoint URL (local servers)")
        p.add_argument("--region", help="AWS region (default: the boto3 chain)")
        p.add_argument("--profile", help="AWS profile")

    show = ck_sub.add_parser("show", help="each shard's committed position, owner, epoch, age")
    common(show)
    show.set_defaults(func=_show)

    status = sub.add_parser(
        "status", help="per shard: committed position, open/closed/finished, lag behind the tip"
    )
    common(status)
    status.add_argument("--kinesis-endpoint-url", help="Kinesis endpoint URL (default: --endpoint-url)")
    status.add_argument("--stream-arn", action="append", metavar="ARN",
                        help="a stream the query reads by streamARN (repeatable): named by ARN in every call")
    status.add_argument("--json", action="store_true", help="one JSON object per shard")
    status.add_argument("--max-records", type=int, default=1000,
                        help="records read per shard to count the lag (one GetRecords; more shows as >=)")
    status.set_defaults(func=_status)

    export = ck_sub.add_parser("export", help="write positions as JSON for initialPosition")
    common(export)
    export.add_argument("--output", "-o", help="file to write (default: standard output)")
    export.set_defaults(func=_export)

    reset = ck_sub.add_parser("reset", help="move the application to a new start position")
    common(reset)
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--to", help="TRIM_HORIZON, LATEST, AT_TIMESTAMP:<ISO-8601> or a JSON object"
    )
    target.add_argument("--to-file", help="a JSON file of positions, as `export` writes")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(func=_reset)

    kcl = ck_sub.add_parser(
        "import-kcl", help="take over a KCL application's checkpoints from its lease table"
    )
    common(kcl)
    kcl.add_argument("--lease-table", required=True, help="the KCL application's lease table")
    kcl.add_argument("--stream", action="append",
                     help="a stream to import (repeatable; one is needed for single-stream leases, "
                          "keyed by bare shard ids; default for multi-stream leases: all)")
    kcl.add_argument("--at-timestamp",
                     help="the ISO-8601 timestamp of the KCL application's AT_TIMESTAMP start, for "
                          "leases still at it (the lease table does not hold it)")
    kcl.add_argument("--lease-endpoint-url", help="the lease table's DynamoDB endpoint (default: --endpoint-url)")
    kcl.add_argument("--lease-region", help="the lease table's region (default: --region)")
    kcl.add_argument("--lease-profile", help="AWS profile for the lease table (default: --profile)")
    kcl.add_argument("--kinesis-endpoint-url",
                     help="Kinesis endpoint, to list the streams' shards (default: --endpoint-url)")
    kcl.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    kcl.set_defaults(func=_import_kcl)

    options = sub.add_parser("options", help="list every option of format kinesis-ddb, for reading and for writing")
    options.set_defaults(func=_options)

    consumers = sub.add_parser("consumers", help="manage enhanced fan-out consumers")
    cons_sub = consumers.add_subparsers(dest="action", required=True)
    dereg = cons_sub.add_parser(
        "deregister", help="deregister an EFO consumer (e.g. left behind by a crashed query)"
    )
    dereg.add_argument("--stream", required=True, action="append", help="stream (repeatable)")
    dereg.add_argument("--name", required=True, help="the consumer name (consumerName option)")
    dereg.add_argument("--wait", type=float, default=None, help="seconds to wait until it is gone")
    dereg.add_argument("--table", default=DEFAULT_TABLE,
                       help="the checkpoint table whose query runs record themselves as the consumer's users")
    dereg.add_argument("--force", action="store_true",
                       help="deregister even while runs are recorded as using the consumer")
    dereg.add_argument("--endpoint-url", help="Kinesis endpoint URL (local servers)")
    dereg.add_argument("--region", help="AWS region (default: the boto3 chain)")
    dereg.add_argument("--profile", help="AWS profile")
    dereg.set_defaults(func=_deregister)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kinesis-ddb`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CheckpointError, OptionError, KinesisSourceError) as exc:
        print(f"kinesis-ddb: {_in_flags(str(exc))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

