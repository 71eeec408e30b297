"""The chaos suite's delivery checker (tests/support/checker.py) on hand-made inputs, each
figure written out for a few records.

Mutants caught: sequence numbers compared as strings (a 9 -> 10 digit step counted out of
order); duplicates counted per record instead of per extra delivery; a restart's step back
counted out of order; lost records counted as invented.
"""

from __future__ import annotations

import json

from tests.support.checker import Delivery, ShardFigures, check, key_order_violations, load_deliveries
from tests.support.producer import Put

A, B = "shardId-000000000000", "shardId-000000000001"


def d(run, batch, *rows):
    return Delivery(run, batch, tuple(rows))


def figures(report):
    return {shard: vars(f) for shard, f in report.shards.items()}


def fig(**kw):
    return vars(ShardFigures(**kw))


SENT = [(A, "1"), (A, "2"), (A, "3"), (B, "999999999"), (B, "1000000000")]


def test_everything_once_in_order_counts_nothing():
    report = check(SENT, [
        d("run00", 0, (A, "1"), (B, "999999999"), (A, "2")),
        d("run00", 1, (A, "3"), (B, "1000000000")),  # 9 -> 10 digits is forward
    ])
    assert figures(report) == {A: fig(sent=3, delivered=3), B: fig(sent=2, delivered=2)}
    assert report.totals() == {
        "sent": 5, "delivered": 5, "lost": 0, "invented": 0, "duplicated": 0, "out_of_order": 0,
    }


def test_a_record_never_delivered_is_lost():
    report = check(SENT, [d("run00", 0, (A, "1"), (A, "3"), (B, "999999999"), (B, "1000000000"))])
    assert figures(report)[A] == fig(sent=3, delivered=2, lost=1)
    assert report.total("lost") == 1


def test_each_extra_delivery_is_one_duplicate_and_a_restart_may_go_back():
    report = check(SENT, [
        d("run00", 0, (A, "1"), (A, "2"), (A, "3"), (B, "999999999")),
        # the restart goes back to A's 2 (a step back: allowed across runs), reads it twice
        d("run01", 0, (A, "2"), (A, "2"), (A, "3"), (B, "1000000000")),
    ])
    assert figures(report) == {
        A: fig(sent=3, delivered=6, duplicated=3),
        B: fig(sent=2, delivered=2),
    }


def test_a_record_never_put_is_invented_also_on_an_unknown_shard():
    report = check(SENT, [
        d("run00", 0, (A, "1"), (A, "2"), (A, "3"), (A, "4")),
        d("run00", 1, (B, "999999999"), (B, "1000000000"), ("shardId-000000000009", "5")),
    ])
    assert figures(report)[A] == fig(sent=3, delivered=4, invented=1)
    assert figures(report)["shardId-000000000009"] == fig(delivered=1, invented=1)
    assert report.total("lost") == 0


def test_within_a_run_each_row_after_a_higher_one_is_out_of_order():
    report = check(SENT, [
        d("run00", 0, (A, "2"), (A, "1")),  # 1 after 2
        d("run00", 1, (A, "3")),
        d("run00", 2, (B, "1000000000")),
        d("run00", 3, (B, "999999999")),  # across batches of one run: out of order
    ])
    assert figures(report) == {
        A: fig(sent=3, delivered=3, out_of_order=1),
        B: fig(sent=2, delivered=2, out_of_order=1),
    }


def test_the_table_lists_each_shard_with_its_figures():
    report = check(SENT, [d("run00", 0, (A, "1"), (A, "1"), (B, "7"))])
    lines = report.table().splitlines()
    assert lines[0].split() == ["shard", "sent", "delivered", "lost", "invented", "duplicated", "out-of-order"]
    assert lines[1].split() == [A, "3", "2", "2", "0", "1", "0"]
    assert lines[2].split() == [B, "2", "1", "2", "1", "0", "0"]


def test_deliveries_load_in_run_order_then_batch_order(tmp_path):
    def write(run, batch, *rows):
        body = {"run": run, "batch": batch, "rows": [["s", shard, seq, 0, "x"] for shard, seq in rows]}
        (tmp_path / f"{run}-{batch:06d}.json").write_text(json.dumps(body))

    write("run01", 2, (A, "3"))
    write("run00", 10, (A, "2"))
    write("run00", 9, (A, "1"), (B, "5"))
    write("run07", 0, (A, "9"))  # a run not asked for
    got = load_deliveries(tmp_path, ["run00", "run01"])
    assert got == [
        d("run00", 9, (A, "1"), (B, "5")),
        d("run00", 10, (A, "2")),
        d("run01", 2, (A, "3")),
    ]


def test_a_replay_is_the_same_rows_in_the_same_order_per_shard():
    from tests.support.checker import per_shard

    first = [("a", "1"), ("b", "7"), ("a", "2"), ("b", "8")]
    interleaved_otherwise = [("b", "7"), ("a", "1"), ("b", "8"), ("a", "2")]
    assert per_shard(first) == per_shard(interleaved_otherwise)
    assert per_shard(first) != per_shard([("a", "2"), ("a", "1"), ("b", "7"), ("b", "8")])
    assert per_shard(first) != per_shard(first[:3])


# a parent A (split) with child B: key "k" was put on A at 1, 2, then on B at 7, 8; key "j" on B
KEYED = [Put(b"", "k", A, "1"), Put(b"", "k", A, "2"), Put(b"", "j", B, "5"),
         Put(b"", "k", B, "7"), Put(b"", "k", B, "8")]


def test_a_child_record_before_its_parents_is_out_of_key_order_within_a_run_only():
    in_order = [d("run00", 0, (A, "1"), (B, "5")), d("run00", 1, (A, "2")), d("run00", 2, (B, "7"), (B, "8"))]
    assert key_order_violations(KEYED, in_order) == 0
    # the child's first record of "k" in the batch before the parent's last: one violation
    child_first = [d("run00", 0, (A, "1"), (B, "7")), d("run00", 1, (A, "2"), (B, "8"))]
    assert key_order_violations(KEYED, child_first) == 1
    # each row after the key's highest so far counts once, like the per-shard check
    assert key_order_violations(KEYED, [d("run00", 0, (B, "8"), (A, "1"), (A, "2"), (B, "7"))]) == 3
    # a restart may go back (the batch in flight again); another key never interferes
    again = in_order + [d("run01", 2, (A, "2"), (B, "7"), (B, "8"))]
    assert key_order_violations(KEYED, again) == 0
    # rows never put are the checker's "invented", not key order
    assert key_order_violations(KEYED, [d("run00", 0, (A, "9"), (A, "1"))]) == 0
