"""Read path without a server: botocore's parsing alone vs our whole read path.

Canned ``GetRecords`` responses (as Kinesis serializes them) go through botocore's default JSON
parser (a: the floor of a plain boto3-based reader) and through our Kinesis clients' parser
(epoch-float timestamps) plus our record-to-Arrow conversion (b: what ``read()`` does per page). Prints records/s per core for each, median and
spread over repeated runs, and the ratio b/a.

    python -m benchmarks.read_path [--records 10000] [--size 100] [--repeats 7]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time

import botocore.session
from botocore.parsers import ResponseParserFactory, create_parser

from kinesis_source.aws import KINESIS_PARSER_DEFAULTS
from kinesis_source.records import to_record_batch


def canned_response(records: int, size: int) -> bytes:
    """A GetRecords response body with ``records`` records of ``size`` bytes each."""
    payload = base64.b64encode(os.urandom(size)).decode()
    base = 49590338271490256608559692538361571095921575989136588898
    body = {
        "Records": [
            {
                "Data": payload,
                "PartitionKey": f"key-{i % 64}",
                "SequenceNumber": str(base + i * 97),
                "ApproximateArrivalTimestamp": 1_790_000_000.123 + i / 1000,
            }
            for i in range(records)
        ],
        "NextShardIterator": "AAAA" * 64,
        "MillisBehindLatest": 0,
    }
    return json.dumps(body).encode()


def measure(fn, repeats: int) -> list[float]:
    """Wall seconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def run(records: int, size: int, repeats: int) -> dict:
    """Both measurements for one record size; returns figures as a dict."""
    body = canned_response(records, size)
    shape = botocore.session.get_session().get_service_model("kinesis").operation_model(
        "GetRecords"
    ).output_shape
    floor = create_parser("json")  # what a plain boto3 client does
    factory = ResponseParserFactory()
    factory.set_parser_defaults(**KINESIS_PARSER_DEFAULTS)
    ours = factory.create_parser("json")  # what kinesis-ddb's Kinesis clients do

    def parse():
        return floor.parse({"body": body, "headers": {}, "status_code": 200}, shape)

    def full():
        resp = ours.parse({"body": body, "headers": {}, "status_code": 200}, shape)
        return to_record_batch("stream", "shardId-000000000000", resp["Records"])

    assert full().num_rows == records
    a = [records / t for t in measure(parse, repeats)]
    b = [records / t for t in measure(full, repeats)]
    return {
        "records": records,
        "record_bytes": size,
        "botocore_parse_rps_median": statistics.median(a),
        "botocore_parse_rps_spread": max(a) - min(a),
        "read_path_rps_median": statistics.median(b),
        "read_path_rps_spread": max(b) - min(b),
        "ratio_b_over_a": statistics.median(b) / statistics.median(a),
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--size", type=int, action="append")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for size in args.size or [100, 1024]:
        r = run(args.records, size, args.repeats)
        print(
            f"{size:>5} B records: botocore parse {r['botocore_parse_rps_median']:>10,.0f} rec/s "
            f"(spread {r['botocore_parse_rps_spread']:,.0f}); full read path "
            f"{r['read_path_rps_median']:>10,.0f} rec/s (spread {r['read_path_rps_spread']:,.0f}); "
            f"ratio {r['ratio_b_over_a']:.2f}"
        )


if __name__ == "__main__":
    main()
