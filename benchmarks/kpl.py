"""KPL de-aggregation without a server: our decoder vs aws-kinesis-agg's (and protobuf's bare
parse, when installed), user records/s on one core, median and spread of repeated runs.

    python -m benchmarks.kpl [--records 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime

from benchmarks.common import describe, summary, timed
from kinesis_source import kpl


def make_aggregates(records: int, size: int) -> list[bytes]:
    """Aggregates (as aws-kinesis-agg encodes them) holding ``records`` user records."""
    from aws_kinesis_agg.aggregator import RecordAggregator

    agg = RecordAggregator()
    out = []
    for i in range(records):
        full = agg.add_user_record(f"pk-{i % 50}", os.urandom(size))
        if full:
            out.append(full.get_contents()[2])
    out.append(agg.clear_and_get().get_contents()[2])
    return out


def measure(records: int, size: int, repeats: int) -> dict:
    """User records/s of each decoder on aggregates of ``size``-byte user records."""
    from aws_kinesis_agg import deaggregator, messages_pb2

    blobs = make_aggregates(records, size)
    users = sum(len(kpl.decode(b)) for b in blobs)
    now = datetime.now()
    boto_style = [
        {"Data": b, "PartitionKey": "x", "SequenceNumber": "1", "ApproximateArrivalTimestamp": now}
        for b in blobs
    ]

    def ours():
        for b in blobs:
            kpl.decode(b)

    def theirs():
        list(deaggregator.iter_deaggregate_records(boto_style, data_format="Boto3"))

    def bare():
        for b in blobs:
            msg = messages_pb2.AggregatedRecord()
            msg.ParseFromString(b[4:-16])
            [(msg.partition_key_table[r.partition_key_index], r.data) for r in msg.records]

    figures = {}
    for name, fn in [("kinesis-ddb", ours), ("aws-kinesis-agg", theirs), ("protobuf bare", bare)]:
        figures[name] = summary(users / t for t in timed(fn, repeats))
    return {"record_bytes": size, "user_records": users, "decoders": figures}


def run_suite(quick: bool) -> list[dict]:
    """Both record sizes, printed as it goes."""
    records, repeats = (2000, 3) if quick else (20000, 7)
    out = []
    for size in (100, 1024):
        r = measure(records, size, repeats)
        print(f"  kpl {size:>5} B: " + "; ".join(
            f"{name} {describe(s)}/s" for name, s in r["decoders"].items()
        ), flush=True)
        out.append(r)
    return out


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for size in (100, 1024):
        r = measure(args.records, size, args.repeats)
        print(f"{size:>5} B user records: " + "; ".join(
            f"{name} {describe(s)}/s" for name, s in r["decoders"].items()
        ))

if __name__ == "__main__":
    main()
