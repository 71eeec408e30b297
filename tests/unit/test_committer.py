"""The checkpointer's eager commit in ``latestOffset``: written while the probe runs, its
failure reported, and the epoch check it makes not repeated. The DynamoDB store is replaced by
an in-memory one (the store itself is tested against moto in tests/integration)."""

from __future__ import annotations

import threading

import pytest

from kinesis_source.checkpoints import CheckpointFencedError
from kinesis_source.committer import Checkpointer
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position

DEADLINE_S = 10


class MemoryStore:
    """Records calls; ``commit`` can be made to wait for an event or to raise."""

    def __init__(self) -> None:
        self.commits: list[dict] = []
        self.epoch_checks = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail: Exception | None = None

    def commit(self, epoch, owner, positions):
        self.started.set()
        assert self.release.wait(DEADLINE_S), "the probe never let the commit finish"
        if self.fail is not None:
            raise self.fail
        self.commits.append(dict(positions))
        return 1

    def check_epoch(self, epoch):
        self.epoch_checks += 1


@pytest.fixture
def checkpointer():
    opts = SourceOptions.parse({
        "streamName": "s", "applicationName": "app", "region": "us-east-1",
        "dynamodbEndpointUrl": "http://127.0.0.1:9",  # never contacted: the store is replaced
    })
    c = Checkpointer(opts, planner=None)  # type: ignore[arg-type]
    c._store = MemoryStore()
    c._epoch = 3
    c._first_start_seen = True
    yield c
    c.close()


def offset(seq):
    return Offset({"s/shardId-0": Position.after(seq)})


def test_the_commit_runs_while_the_probe_runs(checkpointer):
    store = checkpointer._store
    store.release.clear()

    def probe():
        # The commit must already be under way, and it cannot finish before the probe does.
        assert store.started.wait(DEADLINE_S), "the commit did not start during the probe"
        assert store.commits == []
        store.release.set()
        return "end"

    assert checkpointer.before_planning(offset("10"), probe) == "end"
    assert store.commits == [{"s/shardId-0": Position.after("10")}]
    assert checkpointer.commit_calls == 1


def test_a_failed_commit_fails_the_call_even_when_the_probe_succeeded(checkpointer):
    checkpointer._store.fail = CheckpointFencedError("claimed by another query")
    with pytest.raises(CheckpointFencedError):
        checkpointer.before_planning(offset("10"), lambda: "end")
    assert checkpointer.commit_calls == 0
    # not recorded as stored: the next call writes it again
    checkpointer._store.fail = None
    checkpointer.before_planning(offset("10"), lambda: "end")
    assert checkpointer._store.commits == [{"s/shardId-0": Position.after("10")}]


def test_a_failed_probe_still_records_the_commit_it_waited_for(checkpointer):
    def probe():
        raise RuntimeError("Kinesis down")

    with pytest.raises(RuntimeError, match="Kinesis down"):
        checkpointer.before_planning(offset("10"), probe)
    assert checkpointer._store.commits == [{"s/shardId-0": Position.after("10")}]
    checkpointer.before_planning(offset("10"), lambda: "end")
    assert len(checkpointer._store.commits) == 1  # nothing moved since: no second write


def test_the_epoch_is_read_only_when_no_commit_checked_it_in_this_call(checkpointer):
    store = checkpointer._store
    checkpointer.before_planning(offset("10"), lambda: "end")
    checkpointer.before_batch()
    assert store.epoch_checks == 0  # the commit's transaction checked it
    checkpointer.before_planning(offset("10"), lambda: "end")  # nothing moved: no write
    checkpointer.before_batch()
    assert store.epoch_checks == 1
    checkpointer.before_batch()  # a check is good for one batch only
    assert store.epoch_checks == 2
