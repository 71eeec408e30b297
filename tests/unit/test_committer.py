"""The checkpointer's eager commit in ``latestOffset``: written while the probe runs and on
after it (the batch's planning waits for it), its failure reported before the batch reads; the
epoch check a batch needs (the write's transaction, else a read started as ``latestOffset``
returns), never repeated; and which finished shards it drops from the table. The DynamoDB store
is replaced by an in-memory one (the store itself is tested against moto in tests/integration)."""

from __future__ import annotations

import threading

import pytest

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.driver.application import Application
from kinesis_source.driver.commits import Checkpointer
from kinesis_source.errors import CheckpointFencedError
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId

DEADLINE_S = 10


def sid(shard):
    """Shard ``shard`` of stream ``s``."""
    return ShardId("s", shard)


class MemoryStore:
    """Records calls; ``commit`` can be made to wait for an event or to raise."""

    def __init__(self) -> None:
        self.commits: list[dict] = []
        self.forgotten: list[list[ShardId]] = []
        self.epoch_checks = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail: Exception | None = None

    def commit(self, epoch, owner, positions, forget=()):
        self.started.set()
        assert self.release.wait(DEADLINE_S), "the probe never let the commit finish"
        if self.fail is not None:
            raise self.fail
        self.commits.append(dict(positions))
        self.forgotten.append(list(forget))
        return 1

    def check_epoch(self, epoch):
        self.epoch_checks += 1


@pytest.fixture
def checkpointer():
    opts = SourceOptions.parse({
        "streamName": "s", "applicationName": "app", "region": "us-east-1",
        "dynamodbEndpointUrl": "http://127.0.0.1:9",  # never contacted: the store is replaced
    })
    app = Application(opts, MemoryStore(), Listing([]), owner="test")  # type: ignore[arg-type]
    app.epoch = 3  # claimed
    c = Checkpointer(app)
    yield c
    c.close()


def offset(seq):
    return Offset({sid("shardId-0"): Position.after(seq)})


def planned(checkpointer, start, probe):
    """``latestOffset(start)`` as the source makes it: the probe inside ``committing``."""
    with checkpointer.committing(start):
        return probe()


def test_the_commit_runs_while_the_probe_runs(checkpointer):
    store = checkpointer.app.store
    store.release.clear()

    def probe():
        # The commit must already be under way, and it cannot finish before the probe does.
        assert store.started.wait(DEADLINE_S), "the commit did not start during the probe"
        assert store.commits == []
        store.release.set()
        return "end"

    assert planned(checkpointer, offset("10"), probe) == "end"
    checkpointer.before_batch()
    assert store.commits == [{sid("shardId-0"): Position.after("10")}]
    assert checkpointer.commit_calls == 1


def test_latest_offset_returns_before_the_write_and_the_batch_waits_for_it(checkpointer):
    """Spark writes its offset log after ``latestOffset``: the DynamoDB write goes on beside it
    instead of before it, and the batch's planning (``partitions``) waits for it."""
    store = checkpointer.app.store
    store.release.clear()  # the write cannot finish until released
    assert planned(checkpointer, offset("10"), lambda: "end") == "end"
    assert store.started.wait(DEADLINE_S), "the write did not start"
    assert checkpointer.commit_calls == 0 and sid("shardId-0") not in checkpointer.app.stored
    store.release.set()
    checkpointer.before_batch()
    assert store.commits == [{sid("shardId-0"): Position.after("10")}]
    assert checkpointer.commit_calls == 1 and checkpointer.app.stored[sid("shardId-0")] == Position.after("10")
    assert store.epoch_checks == 0  # the write's transaction checked the epoch


def test_a_failed_write_fails_the_batch_before_it_reads(checkpointer):
    checkpointer.app.store.fail = CheckpointFencedError("claimed by another query")
    assert planned(checkpointer, offset("10"), lambda: "end") == "end"
    with pytest.raises(CheckpointFencedError):
        checkpointer.before_batch()
    assert checkpointer.commit_calls == 0
    # not recorded as stored: the next call writes it again
    checkpointer.app.store.fail = None
    planned(checkpointer, offset("10"), lambda: "end")
    checkpointer.before_batch()
    assert checkpointer.app.store.commits == [{sid("shardId-0"): Position.after("10")}]


def test_a_write_under_way_is_waited_for_by_the_next_call_and_at_stop(checkpointer, caplog):
    """Without a batch in between (no new data), the next ``latestOffset`` or ``commit`` waits
    for the write first, so positions are written in order and none twice; at stop a failed
    last write is reported, not raised."""
    store = checkpointer.app.store
    planned(checkpointer, offset("10"), lambda: "end")
    checkpointer.commit(offset("10"))  # Spark's commit of the same end: already written
    assert store.commits == [{sid("shardId-0"): Position.after("10")}]
    planned(checkpointer, offset("20"), lambda: "end")
    planned(checkpointer, offset("30"), lambda: "end")  # waited for the write of 20 first
    checkpointer.settle()
    assert store.commits[1:] == [{sid("shardId-0"): Position.after(s)} for s in ("20", "30")]
    store.fail = RuntimeError("DynamoDB unreachable")
    planned(checkpointer, offset("40"), lambda: "end")
    checkpointer.close()
    assert checkpointer.app.stored[sid("shardId-0")] == Position.after("30")
    assert "not written to DynamoDB table" in caplog.text and "DynamoDB unreachable" in caplog.text


def test_a_failed_probe_still_records_the_commit_it_waited_for(checkpointer):
    def probe():
        raise RuntimeError("Kinesis down")

    with pytest.raises(RuntimeError, match="Kinesis down"):
        planned(checkpointer, offset("10"), probe)
    assert checkpointer.app.store.commits == [{sid("shardId-0"): Position.after("10")}]
    planned(checkpointer, offset("10"), lambda: "end")
    assert len(checkpointer.app.store.commits) == 1  # nothing moved since: no second write


def test_the_epoch_is_read_only_when_no_commit_checked_it_in_this_call(checkpointer):
    store = checkpointer.app.store
    planned(checkpointer, offset("10"), lambda: "end")
    checkpointer.after_planning(batch_follows=True)
    checkpointer.before_batch()
    assert store.epoch_checks == 0  # the commit's transaction checked it
    planned(checkpointer, offset("10"), lambda: "end")  # nothing moved: no write
    checkpointer.after_planning(batch_follows=True)
    checkpointer.before_batch()
    assert store.epoch_checks == 1
    checkpointer.before_batch()  # a check is good for one batch only (a replay after a restart)
    assert store.epoch_checks == 2


def test_a_batch_after_a_call_with_nothing_to_write_checks_the_epoch_beside_the_offset_log():
    """After a trigger that found nothing new, ``latestOffset`` has nothing to write: the epoch
    check its batch needs starts when it returns (``after_planning``), not in ``partitions``, and
    a fenced query still fails there, before it reads; no commit callback runs for a check."""
    opts = SourceOptions.parse({
        "streamName": "s", "applicationName": "app", "region": "us-east-1",
        "dynamodbEndpointUrl": "http://127.0.0.1:9",
    })
    store = SlowCheck()
    app = Application(opts, store, Listing([]), owner="test")  # type: ignore[arg-type]
    app.epoch = 3
    seen = []
    c = Checkpointer(app, seen.append)
    try:
        planned(c, offset("10"), lambda: "end")
        c.after_planning(batch_follows=True)
        c.before_batch()
        assert seen and store.epoch_checks == 0  # the write checked it
        seen.clear()
        planned(c, offset("10"), lambda: "end")  # nothing to write
        c.after_planning(batch_follows=True)
        assert store.checking.wait(DEADLINE_S), "the check did not start when latestOffset returned"
        store.release_check.set()
        c.before_batch()
        assert store.epoch_checks == 1 and seen == []
        store.check_fails = CheckpointFencedError("claimed by another query")
        planned(c, offset("10"), lambda: "end")
        c.after_planning(batch_follows=True)
        with pytest.raises(CheckpointFencedError):
            c.before_batch()
    finally:
        c.close()


class SlowCheck(MemoryStore):
    """A store whose epoch check waits to be released, and can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.checking = threading.Event()
        self.release_check = threading.Event()
        self.check_fails: Exception | None = None

    def check_epoch(self, epoch):
        self.checking.set()
        assert self.release_check.wait(DEADLINE_S), "the check was never released"
        if self.check_fails is not None:
            raise self.check_fails
        super().check_epoch(epoch)


class Listing:
    """The planner, as far as the checkpointer asks it: the last shard listing."""

    def __init__(self, shards):
        self.shards = {"s": shards}

    def listed(self):
        return self.shards


# shardId-0 existed at the first start; it split into 1 and 2, and 1 split into 3 and 4
RESHARDED = [
    ShardInfo("shardId-0", ending_seq="100"),
    ShardInfo("shardId-1", parent="shardId-0", ending_seq="200"),
    ShardInfo("shardId-2", parent="shardId-0"),
    ShardInfo("shardId-3", parent="shardId-1"),
    ShardInfo("shardId-4", parent="shardId-1"),
]
END = Position.shard_end()


def resharded(checkpointer, resolved):
    checkpointer.app.catalogue = Listing(RESHARDED)
    checkpointer.app.resolved = resolved
    checkpointer.app.stored = {sid("shardId-0"): END, sid("shardId-1"): END, sid("shardId-2"): Position.after("5")}
    return checkpointer


def test_a_retired_shard_created_after_the_start_is_forgotten_once_a_child_is_committed(
    checkpointer,
):
    c = resharded(checkpointer, Offset({sid("shardId-0"): Position.trim_horizon()}))
    # shardId-1 left the offset, but its children are empty (not committed): it stays
    c.commit(Offset({sid("shardId-2"): Position.after("6"), sid("shardId-3"): Position.trim_horizon(),
                     sid("shardId-4"): Position.trim_horizon()}))
    assert c.app.store.forgotten[-1] == []
    # shardId-3 has its first record: shardId-1 goes in that same write
    planned(
        c,
        Offset({sid("shardId-2"): Position.after("6"), sid("shardId-3"): Position.after("300"),
                sid("shardId-4"): Position.trim_horizon()}),
        lambda: "end",
    )
    c.settle()
    assert c.app.store.commits[-1] == {sid("shardId-3"): Position.after("300")}
    assert c.app.store.forgotten[-1] == [sid("shardId-1")]
    # shardId-0 stays: a resume starts from the stored initial positions (TRIM_HORIZON for it)
    assert set(c.app.stored) == {sid("shardId-0"), sid("shardId-2"), sid("shardId-3")}


def test_nothing_is_forgotten_without_stored_initial_positions(checkpointer):
    c = resharded(checkpointer, None)
    c.commit(Offset({sid("shardId-2"): Position.after("6"), sid("shardId-3"): Position.after("300")}))
    assert c.app.store.forgotten == [[]]
    assert sid("shardId-1") in c.app.stored


def test_a_shard_still_in_the_offset_is_not_forgotten(checkpointer):
    c = resharded(checkpointer, Offset({}))  # no shard in the stored initial positions
    c.commit(Offset({sid("shardId-1"): END, sid("shardId-3"): Position.after("300")}))
    # shardId-0 (out of the offset, a child committed) goes; shardId-1, still in it, stays
    assert c.app.store.forgotten == [[sid("shardId-0")]]


def test_a_finished_shard_that_dynamodb_holds_short_of_its_end_is_committed_at_its_end(
    checkpointer,
):
    """Issue 14 item 1, healing tables written before the fix: shardId-1 left the offset
    (retired, its children tracked) while DynamoDB still holds it at its last record. The
    next commit writes its SHARD_END, so a resume after it expires finds it finished; a shard
    still in the offset, or with no descendant in it, is left alone."""
    c = resharded(checkpointer, Offset({sid("shardId-0"): Position.trim_horizon()}))
    c.app.stored[sid("shardId-1")] = Position.after("190")
    c.app.stored[sid("other")] = Position.after("7")  # not listed: nothing is known of it
    c.commit(Offset({sid("shardId-2"): Position.after("6"), sid("shardId-3"): Position.trim_horizon(),
                     sid("shardId-4"): Position.trim_horizon()}))
    assert c.app.store.commits[-1] == {sid("shardId-1"): END, sid("shardId-2"): Position.after("6")}
    assert c.app.stored[sid("other")] == Position.after("7")
