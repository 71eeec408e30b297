"""Split, merge and UpdateShardCount while a query runs (kinesis-local: moto's resharding keeps writing to closed
parents). Every record once, and per partition key in the order put, across parents and
children; finished shards leave the DynamoDB table and a resume from it reads none again."""

from __future__ import annotations

import json
import threading
from collections import defaultdict

import pytest

from kinesis_source.positions import Position, ShardId
from tests.support.checker import per_shard
from tests.support.cli import cli
from tests.support.committed import stored, tips
from tests.support.producer import Producer
from tests.support.proxy import FaultProxy
from tests.support.spark_query import probes_of, running
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("kinesis-local")]


class KeyedProducer:
    """Writes ``<key>:<n>`` records for fixed partition keys from a thread until stopped."""

    def __init__(self, client, stream, keys=12, burst=24):
        self.client, self.stream = client, stream
        self.keys = [f"key-{i}" for i in range(keys)]
        self.burst = burst
        self.counters = defaultdict(int)
        self.sent: list[tuple[str, str, bytes]] = []  # (shard, seq, data)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self):
        try:
            i = 0
            while not self._stop.wait(0.05):
                batch = []
                for _ in range(self.burst):
                    key = self.keys[i % len(self.keys)]
                    batch.append({"Data": f"{key}:{self.counters[key]}".encode(), "PartitionKey": key})
                    self.counters[key] += 1
                    i += 1
                resp = self.client.put_records(StreamName=self.stream, Records=batch)
                assert resp.get("FailedRecordCount", 0) == 0, resp
                for rec, res in zip(batch, resp["Records"], strict=True):
                    self.sent.append((res["ShardId"], res["SequenceNumber"], rec["Data"]))
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=30)


def test_split_merge_and_rescale_keep_every_record_once_and_keys_in_order(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(3)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    by_id = {s["ShardId"]: s for s in shards}
    first, second, third = sorted(by_id)
    options = {**source_options, "streamName": stream, "shardDiscoveryIntervalMs": "500"}
    ck = tmp_path / "ck"
    deliveries = []
    with KeyedProducer(kinesis, stream) as producer:
        with running(spark, options, ck) as (_, sink):
            wait_for(lambda: sink.count() >= 150, timeout=120, what="rows before resharding")
        deliveries += sink.deliveries
        # While no query runs, the parent builds a backlog, is split, and its children fill:
        # the restarted query finds unread records in parent and children at once.
        written = len(producer.sent)
        wait_for(lambda: len(producer.sent) >= written + 100, timeout=60, what="parent backlog")
        lo = int(by_id[first]["HashKeyRange"]["StartingHashKey"])
        hi = int(by_id[first]["HashKeyRange"]["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=first, NewStartingHashKey=str((lo + hi) // 2))
        written = len(producer.sent)
        wait_for(lambda: len(producer.sent) >= written + 100, timeout=60, what="children data")
        with running(spark, options, ck) as (query, sink):
            wait_for(lambda: len(deliveries) + len(sink.deliveries) > 3, timeout=120, what="batches")
            # and a merge while the query runs
            kinesis.merge_shards(StreamName=stream, ShardToMerge=second, AdjacentShardToMerge=third)
            seen = sink.count()
            wait_for(lambda: sink.count() >= seen + 150, timeout=120, what="rows after the merge")
            # and a whole-stream rescale (splits and merges of its own)
            kinesis.update_shard_count(StreamName=stream, TargetShardCount=2, ScalingType="UNIFORM_SCALING")
            seen = sink.count()
            wait_for(lambda: sink.count() >= seen + 150, timeout=120, what="rows after rescaling")
            producer.stop()
            assert producer.error is None, producer.error
            # A stop between the sink and Spark's commit log makes the restart deliver that
            # batch again, by design with the same rows: it counts once.
            first_run = dict(deliveries)
            total = len(producer.sent) - sum(len(r) for _, r in deliveries)

            def new_rows():
                return sum(len(r) for b, r in list(sink.deliveries) if b not in first_run)

            wait_for(lambda: new_rows() >= total, timeout=120, what="every record")
            assert query.isActive
        for batch_id, batch_rows in sink.deliveries:
            if batch_id in first_run:
                assert per_shard(batch_rows) == per_shard(first_run[batch_id]), (
                    f"batch {batch_id} replayed differently")
            else:
                deliveries.append((batch_id, batch_rows))
    after = kinesis.list_shards(StreamName=stream)["Shards"]
    open_now = [s for s in after if "EndingSequenceNumber" not in s["SequenceNumberRange"]]
    assert len(open_now) == 2 and len(after) > 6, "expected the split, merge and rescale"
    rows = [r for _, batch_rows in deliveries for r in batch_rows]
    got = [(r.shard_id, r.seq, r.data) for r in rows]
    assert len(got) == len(set(got)), "duplicated rows"
    assert sorted(got) == sorted(producer.sent)
    children = {s["ShardId"] for s in after} - set(by_id)
    assert children & {r.shard_id for r in rows}, "no child shard was read"
    # parent before child: a child's first batch comes after its parents' last batch
    batches = defaultdict(set)
    for batch_id, batch_rows in deliveries:
        for r in batch_rows:
            batches[r.shard_id].add(batch_id)
    # which reshard made each child: the split of `first`, the merge of `second` and `third`,
    # and the rescale (every other new shard)
    made_by = {}
    for shard in after:
        parents = {shard.get("ParentShardId"), shard.get("AdjacentParentShardId")} - {None}
        if shard["ShardId"] in children:
            made_by[shard["ShardId"]] = (
                "split" if parents == {first} else "merge" if parents == {second, third} else "rescale"
            )
    assert sorted(made_by.values()).count("split") == 2 and "merge" in made_by.values()
    checked = defaultdict(int)  # parent/child pairs checked, per reshard
    for child in after:
        for parent in (child.get("ParentShardId"), child.get("AdjacentParentShardId")):
            if parent and batches[child["ShardId"]] and batches[parent]:
                assert min(batches[child["ShardId"]]) > max(batches[parent]), (
                    f"child {child['ShardId']} read in batch {min(batches[child['ShardId']])} "
                    f"with parent {parent} still read in batch {max(batches[parent])}"
                )
                checked[made_by[child["ShardId"]]] += 1
    # each reshard had a parent and a child that were both read (else the order went unchecked)
    assert {name: checked[name] >= 1 for name in ("split", "merge", "rescale")} == {
        "split": True, "merge": True, "rescale": True,
    }, dict(checked)
    last = {}
    for r in rows:  # delivery order: batch by batch, each shard's range in order
        key, n = r.data.decode().split(":")
        assert int(n) == last.get(key, -1) + 1, f"{key}: {n} after {last.get(key)}"
        last[key] = int(n)


def split_in_two(kinesis, stream, shard_id):
    """Split a shard at the middle of its hash range; returns its children's ``(id, start
    hash key)`` once the stream is ACTIVE again."""
    shards = {s["ShardId"]: s for s in kinesis.list_shards(StreamName=stream)["Shards"]}
    lo = int(shards[shard_id]["HashKeyRange"]["StartingHashKey"])
    hi = int(shards[shard_id]["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((lo + hi) // 2))
    wait_for(
        lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
            "StreamStatus"
        ] == "ACTIVE",
        timeout=30,
        what=f"{stream} ACTIVE after splitting {shard_id}",
    )
    return [
        (s["ShardId"], s["HashKeyRange"]["StartingHashKey"])
        for s in kinesis.list_shards(StreamName=stream)["Shards"]
        if s.get("ParentShardId") == shard_id
    ]


def rows_of_a_new_run(spark, options, checkpoint, count):
    """Run a query on a new Spark checkpoint until it delivered ``count`` rows and probed 3
    more times (anything read again would be in those batches at the latest); its rows."""
    with running(spark, options, checkpoint) as (query, sink):
        wait_for(lambda: sink.count() >= count, timeout=90, what=f"{count} rows")
        seen = probes_of(query)
        wait_for(lambda: probes_of(query) >= seen + 3, timeout=60, what="3 more probes")
        return sink.rows()


def test_a_finished_child_leaves_the_table_and_a_resume_from_dynamodb_reads_nothing_twice(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    (root,) = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    options = {**source_options, "streamName": stream, "shardDiscoveryIntervalMs": "300"}
    app = options["applicationName"]
    producer = Producer(kinesis, stream)
    producer.put(30)
    with running(spark, options, tmp_path / "ck1") as (query, sink):
        wait_for(lambda: sink.count() >= 30, timeout=90, what="the root shard's records")
        (a, a_key), (b, b_key) = split_in_two(kinesis, stream, root)
        producer.put(20, hash_key=a_key)
        producer.put(20, hash_key=b_key)
        wait_for(lambda: sink.count() >= 70, timeout=90, what="the children's records")
        # ``a`` was created after the application started: once it is finished and a child of
        # it is committed, it has no reason to stay in the table
        (ga, ga_key), (gb, gb_key) = split_in_two(kinesis, stream, a)
        producer.put(20, hash_key=ga_key)
        producer.put(20, hash_key=gb_key)
        wait_for(lambda: sink.count() >= len(producer.sent), timeout=90, what="every record")
        keys = {ShardId(stream, s) for s in (root, b, ga, gb)}
        # the open shards' tips committed too, or the resume below would rightly re-read
        # the last batch
        open_tips = {
            ShardId(stream, sh): pos for sh, pos in tips(producer.sent).items() if sh in (b, ga, gb)
        }

        def table_settled():
            table = stored(ddb, app)
            return set(table) == keys and all(table[k] == v for k, v in open_tips.items())

        wait_for(
            table_settled,
            timeout=60,
            what=f"DynamoDB to hold exactly {sorted(keys)} (without {a}) at the open shards' tips",
        )
        assert query.isActive
    first = sink.rows()
    table = stored(ddb, app)
    assert table[ShardId(stream, root)].is_shard_end  # in the stored initial positions: it stays
    assert ShardId(stream, a) not in table

    # A new Spark checkpoint: the query resumes from DynamoDB alone, and must find ``a``
    # finished through its committed children instead of reading it again.
    new = producer.put(15, hash_key=b_key) + producer.put(15, hash_key=ga_key)
    again = rows_of_a_new_run(spark, options, tmp_path / "ck2", len(new))
    assert sorted((r.shard_id, r.seq) for r in again) == sorted((p.shard_id, p.seq) for p in new)
    assert len(first) == len(producer.sent) - len(new)

    # The round trip through a file: `export` no longer lists ``a``, and `reset --to-file`
    # must not start it again at TRIM_HORIZON (its children are named past their start).
    wait_for(
        lambda: all(stored(ddb, app).get(ShardId(stream, sh)) == pos
                    for sh, pos in tips(producer.sent).items() if sh in (b, ga)),
        timeout=60,
        what="DynamoDB to hold the new records' tips",
    )
    where = ["--app", app, "--endpoint-url", options["dynamodbEndpointUrl"], "--region", "us-east-1"]
    exported = tmp_path / "positions.json"
    cli("checkpoints", "export", *where, "-o", str(exported))
    assert f"{stream}/{a}" not in json.loads(exported.read_text())
    cli("checkpoints", "reset", *where, "--to-file", str(exported), "--yes")
    last = producer.put(10, hash_key=gb_key)
    after_reset = rows_of_a_new_run(spark, options, tmp_path / "ck3", len(last))
    assert sorted((r.shard_id, r.seq) for r in after_reset) == sorted(
        (p.shard_id, p.seq) for p in last
    )


def test_a_parent_in_the_initial_offset_is_committed_finished_so_a_resume_after_it_expired_reads_on(
    spark, kinesis, kinesis_backend, ddb, make_stream, source_options, tmp_path
):
    """Issue 14 item 1: a query that first starts after a split tracks the closed parent and
    its children from the initial offset. The parent's end must reach DynamoDB; it did not
    (the parent left the offset in the probe that saw it end), so once retention took the
    parent out of ListShards, a resume without the Spark checkpoint failed with a false
    data-loss error naming it, and `checkpoints export` showed it at its last record."""
    stream = make_stream(1)
    (root,) = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    producer = Producer(kinesis, stream)
    producer.put(20)
    (a, a_key), (b, b_key) = split_in_two(kinesis, stream, root)
    producer.put(10, hash_key=a_key)
    producer.put(10, hash_key=b_key)
    with FaultProxy(kinesis_backend) as proxy:
        options = {**source_options, "streamName": stream, "endpointUrl": proxy.url,
                   "shardDiscoveryIntervalMs": "300", "initialPosition": "TRIM_HORIZON"}
        app = options["applicationName"]
        with running(spark, options, tmp_path / "ck1") as (query, sink):
            wait_for(lambda: sink.count() >= 40, timeout=90, what="every record")
            children_tips = {ShardId(stream, sh): pos for sh, pos in tips(producer.sent).items()
                             if sh in (a, b)}

            def settled():
                table = stored(ddb, app)
                return all(table.get(k) == v for k, v in children_tips.items())

            wait_for(settled, timeout=60, what="the children's tips in DynamoDB")
            assert query.isActive
        table = stored(ddb, app)
        assert table.get(ShardId(stream, root), Position.shard_end()).is_shard_end, table

        where = ["--app", app, "--endpoint-url", options["dynamodbEndpointUrl"],
                 "--region", "us-east-1"]
        exported = tmp_path / "positions.json"
        cli("checkpoints", "export", *where, "-o", str(exported))
        assert json.loads(exported.read_text()).get(f"{stream}/{root}", "SHARD_END") == "SHARD_END"

        proxy.expire(stream, root)  # retention: the parent leaves ListShards
        new = producer.put(5, hash_key=a_key) + producer.put(5, hash_key=b_key)
        again = rows_of_a_new_run(spark, options, tmp_path / "ck2", len(new))
        assert sorted((r.shard_id, r.seq) for r in again) == sorted(
            (p.shard_id, p.seq) for p in new
        )
        cli("checkpoints", "reset", *where, "--to-file", str(exported), "--yes")
        last = producer.put(5, hash_key=b_key)
        after_reset = rows_of_a_new_run(spark, options, tmp_path / "ck3", len(new) + len(last))
    # the reset went back to the exported positions: the 10 new records again, then the last
    assert sorted((r.shard_id, r.seq) for r in after_reset) == sorted(
        (p.shard_id, p.seq) for p in new + last
    )
    assert len(sink.rows()) == 40
