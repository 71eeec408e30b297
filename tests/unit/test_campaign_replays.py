"""The chaos campaign's count of identical replays (tests/chaos/campaign.py) on hand-made
deliveries: a restart that keeps the Spark checkpoint after a kill inside the sink must replay
that batch, identically, and the campaign must say so when it did not.

Mutant caught: ``_bounds`` taking the wrong runs as the ones that kept the checkpoint (no
replay is then counted, and before this check a campaign with none passed).
"""

from __future__ import annotations

import pytest

from tests.support.checker import Delivery, check

A = "shardId-000000000000"


def d(run, batch, *rows):
    return Delivery(run, batch, tuple(rows))


def campaign_outcome(kills, deliveries, runs):
    from tests.chaos.campaign import Outcome, _bounds

    outcome = Outcome(
        report=check([], deliveries), kills=kills, runs=runs, sent=0,
        sink_rows=0, sink_duplicates=0, sink_skipped=0,
    )
    _bounds(outcome, deliveries, runs)
    return outcome


def kill(run, hit, keep):
    from tests.chaos.campaign import Kill

    return Kill(run, hit, hit, 1.0, "local[2,4]", keep_checkpoint_next=keep)


def test_a_restart_keeping_the_checkpoint_after_a_sink_kill_must_replay_identically():
    from tests.chaos.campaign import assert_replayed_where_due, replays_due

    runs = ["run00", "run01", "run02"]
    kills = [kill("run00", "sink-before-db", True), kill("run01", "reading", False)]
    replayed = [
        d("run00", 0, (A, "1")), d("run00", 1, (A, "2")),  # killed in batch 1's sink
        d("run01", 1, (A, "2")), d("run01", 2, (A, "3")),  # batch 1 again, the same rows
        d("run02", 0, (A, "3")),  # a new checkpoint: batch numbers start over, no replay
    ]
    outcome = campaign_outcome(kills, replayed, runs)
    assert replays_due(outcome) == ["run01"]
    assert outcome.replays_by_run == {"run01": 1} and outcome.replays_identical == 1
    assert_replayed_where_due(outcome)

    not_replayed = [d("run00", 0, (A, "1")), d("run00", 1, (A, "2")), d("run01", 2, (A, "3"))]
    outcome = campaign_outcome(kills, not_replayed, runs)
    with pytest.raises(AssertionError, match=r"no identical replay in \['run01'\]"):
        assert_replayed_where_due(outcome)


def test_no_replay_is_required_where_none_was_due():
    from tests.chaos.campaign import assert_replayed_where_due, replays_due

    runs = ["run00", "run01", "run02"]
    # a kill while planning (nothing delivered yet), and a sink kill followed by a dropped
    # checkpoint: neither restart must replay a batch
    kills = [kill("run00", "planning", True), kill("run01", "sink-after-db", False)]
    outcome = campaign_outcome(kills, [d("run00", 0, (A, "1")), d("run01", 1, (A, "2"))], runs)
    assert replays_due(outcome) == []
    assert_replayed_where_due(outcome)


def test_a_restart_killed_before_its_first_delivery_owes_no_replay_it_could_not_show():
    from tests.chaos.campaign import assert_replayed_where_due, replays_due

    runs = ["run00", "run01", "run02"]
    # run01 keeps the checkpoint after a sink kill, and is killed before delivering anything
    # (a slow fan-out start): its replay cannot be seen, run02 drops the checkpoint
    kills = [kill("run00", "sink-before-db", True), kill("run01", "partitions", False)]
    outcome = campaign_outcome(kills, [d("run00", 0, (A, "1")), d("run02", 0, (A, "1"), (A, "2"))], runs)
    assert replays_due(outcome) == []
    assert_replayed_where_due(outcome)


def test_a_dropped_checkpoint_may_read_again_only_what_dynamodb_had_not_committed():
    """Found by scenario 12's long form: when the runs between a delivery and a restart were all
    killed before their first commit, the restart from DynamoDB reads that older delivery
    again. That is allowed (DynamoDB never held it), a re-read of a committed row is not."""
    from kinesis_source.positions import Position
    from tests.chaos.campaign import Outcome, _bounds

    runs = ["run00", "run01", "run02"]
    deliveries = [
        d("run00", 0, (A, "1"), (A, "2")),  # killed in the sink: never committed
        d("run01", 0, (A, "3")),  # a kept-checkpoint restart's batch, killed before committing
        d("run02", 0, (A, "2"), (A, "3"), (A, "4")),  # resumes from DynamoDB: after "1" only
    ]

    def outcome_with(committed):
        outcome = Outcome(report=check([], deliveries), kills=[], runs=runs, sent=0, sink_rows=0,
                          sink_duplicates=0, sink_skipped=0,
                          committed_at_start={"run01": {}, "run02": {A: committed}})
        _bounds(outcome, deliveries, runs)
        return outcome

    allowed = outcome_with(Position.after("1"))
    assert allowed.beyond_bound == [] and allowed.redelivered["run02"] == 2
    assert allowed.uncommitted_older["run02"] == 1  # "2": before the last batch, never committed
    # DynamoDB held "2": reading it again would be a regression of the resume point
    refused = outcome_with(Position.after("2"))
    assert refused.beyond_bound == [
        "run02: 1 rows read again beyond the in-flight batch (run02 dropped the checkpoint)"
    ]
