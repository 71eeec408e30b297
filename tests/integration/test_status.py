"""`kinesis-ddb status` against moto, on the table of a query that ran: per shard the committed
position, its state and the lag behind the tip, counted."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.positions import Position
from kinesis_source.tools.status import CLOSED, FINISHED, GONE, NOT_STARTED, OPEN, shard_state
from tests.support.cli import cli
from tests.support.committed import wait_committed
from tests.support.producer import Producer
from tests.support.spark_query import running
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("moto")]


def test_status_shows_each_shards_position_and_lag(spark, kinesis, ddb, make_stream, source_options, tmp_path):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(60)
    options = {**source_options, "streamName": stream}
    app = options["applicationName"]
    with running(spark, options, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= 60, timeout=90, what="60 rows")
        wait_committed(ddb, app, stream, producer.sent)
    later = producer.put(25)  # written while no query runs: the lag
    where = ["--app", app, "--endpoint-url", source_options["dynamodbEndpointUrl"], "--region", "us-east-1"]

    shards = json.loads(cli("status", *where, "--json").stdout)
    lag = Counter(p.shard_id for p in later)
    last = {p.shard_id: p.seq for p in producer.sent[:60]}
    assert {s["shard"] for s in shards} == set(last)
    for s in shards:
        assert s["stream"] == stream and s["state"] == OPEN
        assert s["position"] == f"AFTER:{last[s['shard']]}"
        assert s["behind_records"] == lag[s["shard"]] and s["behind_exact"] is True
        assert s["behind_ms"] is not None and s["committed_at"]

    text = cli("status", *where).stdout
    first = sorted(last)[0]
    assert f"{stream}/{first}" in text and f"{lag[first]} records," in text and "behind the tip" in text
    # what the last commits cost, as their log entries hold it (each at least the transaction's
    # floor: 2 units for the epoch check and 2 for the entry)
    line = next(x for x in text.splitlines() if x.startswith("DynamoDB write units of the last"))
    units = [int(u) for u in line.split(": ", 1)[1].split(" (")[0].split(", ")]
    assert units and all(u >= 4 for u in units), line

    few = json.loads(cli("status", *where, "--json", "--max-records", "2").stdout)
    assert all(s["behind_records"] == min(2, lag[s["shard"]]) for s in few)
    assert all(s["behind_exact"] is (lag[s["shard"]] < 2) for s in few)

    kinesis.delete_stream(StreamName=stream)  # deleted since: its committed shards are gone
    wait_for(lambda: stream not in kinesis.list_streams()["StreamNames"], timeout=30, what="the deletion")
    gone = json.loads(cli("status", *where, "--json").stdout)
    assert {s["shard"] for s in gone} == set(last) and {s["state"] for s in gone} == {GONE}


@pytest.mark.parametrize(("info", "position", "state"), [
    (None, Position.after("5"), GONE),
    (ShardInfo("s"), None, NOT_STARTED),
    (ShardInfo("s"), Position.after("5"), OPEN),
    (ShardInfo("s", ending_seq="9"), Position.after("5"), CLOSED),
    (ShardInfo("s", ending_seq="9"), Position.after("9"), FINISHED),
    (ShardInfo("s", ending_seq="9"), Position.at("9"), CLOSED),
    (ShardInfo("s", ending_seq="9"), Position.shard_end(), FINISHED),
])
def test_states(info, position, state):
    assert shard_state(info, position) == state
