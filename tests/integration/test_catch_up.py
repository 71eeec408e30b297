"""Catching up a backlog within the shard's byte budget, on the quota-enforcing server: reads
are paced by the model of the shard's 2 MiB/s and 10 MiB burst instead of being throttled, and
``maxReadRatePerShard`` caps what the source reads. (How fast, against the physical limit, is a
benchmark figure: ``python -m benchmarks --only catchup``.)"""

from __future__ import annotations

import pytest

from kinesis_source.read_rate import CAP_BURST_S
from tests.support.quota import QuotaProxy, as_users_run
from tests.support.spark_query import Collector, read_available_now

pytestmark = pytest.mark.spark

RECORD_BYTES = 1000
PUT_BATCH = 500


def fill(kinesis, stream: str, records: int) -> tuple[str, list[str]]:
    """``records`` records of ``RECORD_BYTES`` into the stream's one shard: (shard, seqs)."""
    seqs, shard = [], ""
    for start in range(0, records, PUT_BATCH):
        batch = [
            {"Data": f"{i:08d}".encode().ljust(RECORD_BYTES, b"x"), "PartitionKey": "k"}
            for i in range(start, min(records, start + PUT_BATCH))
        ]
        resp = kinesis.put_records(StreamName=stream, Records=batch)
        assert not resp.get("FailedRecordCount")
        for rec in resp["Records"]:
            shard = rec["ShardId"]
            seqs.append(rec["SequenceNumber"])
    return shard, seqs


def catch_up(spark, quota, options, checkpoint) -> Collector:
    return read_available_now(spark, {**options, "endpointUrl": quota.url}, checkpoint, timeout_s=300)


def data_calls(quota: QuotaProxy) -> list:
    """The source's GetRecords calls (its access key), in time order."""
    return sorted(quota.calls("GetRecords", where=lambda s: s.access_key == "local"), key=lambda s: s.at)


@pytest.mark.backends("moto")  # kinesis-local takes minutes to take and serve 23 MiB
def test_a_backlog_past_the_burst_is_read_without_a_throttle(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    # ~22.9 MiB: three full pages and more. Read without the model, the third page (a second
    # after two of ~9.5 MiB) finds the bucket overdrawn and is refused.
    records = 24_000
    shard, seqs = fill(kinesis, stream, records)
    options = {**as_users_run(source_options), "streamName": stream, "initialPosition": "TRIM_HORIZON"}
    with QuotaProxy(kinesis_backend) as quota:
        sink = catch_up(spark, quota, options, tmp_path / "ck")
    assert [r.seq for r in sink.rows()] == seqs  # every record once, in order
    ours = data_calls(quota)
    refused = [s for s in ours if s.injected is not None]
    assert refused == [], f"{len(refused)} of the source's GetRecords were refused"
    # the bucket ran dry: the read waited for its refill instead of being refused
    read = quota.bytes_read_by
    source_bytes = sum(b for (key, _, st, sh), b in read.items() if key == "local" and (st, sh) == (stream, shard))
    assert source_bytes >= records * RECORD_BYTES
    assert source_bytes <= 1.1 * records * (RECORD_BYTES + 1)  # nothing read twice


def test_max_read_rate_per_shard_caps_the_bytes_read(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    records = 1_500  # ~1.4 MiB at 256 KiB/s: a few seconds of capped reads
    _, seqs = fill(kinesis, stream, records)
    cap = 256 * 1024
    options = {
        **as_users_run(source_options), "streamName": stream, "initialPosition": "TRIM_HORIZON",
        "maxReadRatePerShard": "256KiB",
    }

    class Sizes(QuotaProxy):
        """Records each GetRecords answer's bytes with its time."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.answers: list[tuple[float, int, str | None]] = []

        def _transform(self, call, body, status, data):
            before = sum(self.bytes_read_by.values())
            out = super()._transform(call, body, status, data)
            spent = sum(self.bytes_read_by.values()) - before
            if call.operation == "GetRecords" and spent:
                self.answers.append((call.at, spent, call.access_key))
            return out

    with Sizes(kinesis_backend) as quota:
        sink = catch_up(spark, quota, options, tmp_path / "ck")
    assert [r.seq for r in sink.rows()] == seqs
    answers = sorted((at, spent) for at, spent, key in quota.answers if key == "local")
    assert len(answers) >= 4, answers
    # the cap's bucket is CAP_BURST_S deep: any window holds at most that much of the cap more
    # than the cap's rate over it (the first answer included)
    for i, (first, _) in enumerate(answers):
        for j in range(i + 1, len(answers)):
            span = answers[j][0] - first
            taken = sum(spent for _, spent in answers[i:j + 1])
            assert taken <= cap * (span + CAP_BURST_S) + 2 * (RECORD_BYTES + 1), (i, j, taken, span)
