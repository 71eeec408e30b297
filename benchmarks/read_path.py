"""Read path without a server: botocore's parsing alone vs our whole read path.

Canned ``GetRecords`` responses (as Kinesis serializes them; plain records, or KPL aggregates of
user records) go through botocore's default JSON parser (a: the floor of a plain boto3-based
reader) and through our executors' parser (``aws/parsing.py``: a page decoded in one pass,
epoch-float timestamps) plus what ``read()`` does per page: ``user_records`` (de-aggregation)
and ``to_record_batch`` (b).
Prints user records/s on one core for each, median and spread over repeated runs, and the ratio
b/a.

    python -m benchmarks.read_path [--records 10000] [--size 100] [--repeats 7]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from typing import Any

import botocore.session
from botocore.parsers import create_parser

from benchmarks.common import describe, summary, timed
from kinesis_source.aws.parsing import KinesisParserFactory
from kinesis_source.executor.arrow import to_record_batch, user_records
from kinesis_source.positions import Position, ShardRange

_BASE_SEQ = 49590338271490256608559692538361571095921575989136588898
# The KPL's default AggregationMaxSize: aggregates hold ~50 KB of user records.
KPL_AGGREGATE_BYTES = 51200


def _response(datas: list[bytes]) -> bytes:
    body = {
        "Records": [
            {
                "Data": base64.b64encode(d).decode(),
                "PartitionKey": f"key-{i % 64}",
                "SequenceNumber": str(_BASE_SEQ + i * 97),
                "ApproximateArrivalTimestamp": 1_790_000_000.123 + i / 1000,
            }
            for i, d in enumerate(datas)
        ],
        "NextShardIterator": "AAAA" * 64,
        "MillisBehindLatest": 0,
    }
    return json.dumps(body).encode()


def canned_response(records: int, size: int) -> bytes:
    """A GetRecords response body with ``records`` plain records of ``size`` bytes each."""
    payload = os.urandom(size)
    return _response([payload] * records)


def canned_aggregated_response(users: int, size: int) -> bytes:
    """A GetRecords response body whose records are KPL aggregates (made by aws-kinesis-agg,
    at most ``KPL_AGGREGATE_BYTES`` each) holding ``users`` user records of ``size`` bytes."""
    from aws_kinesis_agg.aggregator import RecordAggregator

    agg = RecordAggregator(max_size=KPL_AGGREGATE_BYTES)
    blobs = []
    payload = os.urandom(size)
    for i in range(users):
        full = agg.add_user_record(f"pk-{i % 50}", payload)
        if full:
            blobs.append(full.get_contents()[2])
    if agg.get_num_user_records():
        blobs.append(agg.clear_and_get().get_contents()[2])
    return _response(blobs)


def run(records: int, size: int, repeats: int, aggregated: bool = False) -> dict[str, Any]:
    """Both measurements for one page kind and record size; user records/s as summaries."""
    body = (canned_aggregated_response if aggregated else canned_response)(records, size)
    shape = botocore.session.get_session().get_service_model("kinesis").operation_model(
        "GetRecords"
    ).output_shape
    floor = create_parser("json")  # what a plain boto3 client does
    ours = KinesisParserFactory().create_parser("json")  # what kinesis-ddb's executors' clients do
    rng = ShardRange("stream", "shardId-000000000000", Position.trim_horizon(), str(_BASE_SEQ * 2))
    http = {"body": body, "headers": {}, "status_code": 200}

    def parse() -> Any:
        return floor.parse(http, shape)

    def full() -> Any:
        resp = ours.parse(http, shape)
        users = user_records(resp["Records"], rng, "fail")
        return to_record_batch(rng.stream, rng.shard_id, users)

    assert full().num_rows == records
    a = summary(records / t for t in timed(parse, repeats))
    b = summary(records / t for t in timed(full, repeats))
    return {
        "kind": "kpl" if aggregated else "plain",
        "user_records": records,
        "kinesis_records": len(json.loads(body)["Records"]),
        "record_bytes": size,
        "botocore_parse_rps": a,
        "read_path_rps": b,
        "ratio_b_over_a": b["median"] / a["median"],
    }


def run_suite(quick: bool) -> list[dict[str, Any]]:
    """Every combination (plain/KPL x 100 B/1 KB), printed as it goes."""
    records, repeats = (2000, 3) if quick else (10000, 7)
    out = []
    for aggregated in (False, True):
        for size in (100, 1024):
            r = run(records, size, repeats, aggregated)
            print(
                f"  read path {r['kind']:5} {size:>5} B: botocore parse "
                f"{describe(r['botocore_parse_rps'])} rec/s; full read path "
                f"{describe(r['read_path_rps'])} rec/s; b/a {r['ratio_b_over_a']:.2f}",
                flush=True,
            )
            out.append(r)
    return out


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--size", type=int, action="append")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for aggregated in (False, True):
        for size in args.size or [100, 1024]:
            r = run(args.records, size, args.repeats, aggregated)
            print(
                f"{r['kind']:5} {size:>5} B records: botocore parse "
                f"{describe(r['botocore_parse_rps'])} rec/s; full read path "
                f"{describe(r['read_path_rps'])} rec/s; ratio {r['ratio_b_over_a']:.2f}"
            )


if __name__ == "__main__":
    main()
