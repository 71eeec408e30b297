"""Parent-before-child reading and retiring finished shards from the offset."""

import itertools

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.lineage import droppable, probe_starts, retire_finished, superseded
from kinesis_source.positions import Position, ShardId

TH, END = Position.trim_horizon(), Position.shard_end()


def sid(shard, stream="s"):
    """Shard ``shard`` of stream ``s`` (or of ``stream``)."""
    return ShardId(stream, shard)

# p split into c1 and c2; a and b merged into m
SPLIT = [
    ShardInfo("p", ending_seq="100"),
    ShardInfo("c1", parent="p"),
    ShardInfo("c2", parent="p"),
]
MERGE = [
    ShardInfo("a", ending_seq="50"),
    ShardInfo("b", ending_seq="60"),
    ShardInfo("m", parent="a", adjacent_parent="b"),
]


def starts(shards, positions):
    return {shard for (_, shard) in probe_starts({"s": shards}, {sid(k): v for k, v in positions.items()})}


def test_children_wait_until_the_parent_is_at_shard_end():
    assert starts(SPLIT, {"p": TH, "c1": TH, "c2": TH}) == {"p"}
    assert starts(SPLIT, {"p": Position.after("99"), "c1": TH, "c2": TH}) == {"p"}
    assert starts(SPLIT, {"p": END, "c1": TH, "c2": TH}) == {"c1", "c2"}


def test_new_children_start_at_trim_horizon_once_the_parent_ended():
    out = probe_starts({"s": SPLIT}, {sid("p"): END})
    assert out == {sid("c1"): TH, sid("c2"): TH}
    assert probe_starts({"s": SPLIT}, {sid("p"): Position.after("5")}) == {sid("p"): Position.after("5")}


def test_merge_child_waits_for_both_parents():
    assert starts(MERGE, {"a": END, "b": Position.after("1")}) == {"b"}
    assert starts(MERGE, {"a": END, "b": END}) == {"m"}


def test_retired_parent_is_finished_and_not_read_again():
    # p left the offset once c1 and c2 were in it: it must not restart at TRIM_HORIZON
    assert starts(SPLIT, {"c1": Position.after("7"), "c2": TH}) == {"c1", "c2"}


def test_expired_parent_counts_as_finished():
    assert starts([ShardInfo("c1", parent="gone")], {}) == {"c1"}


def test_shards_at_shard_end_are_not_probed():
    assert starts(SPLIT, {"p": END, "c1": END, "c2": Position.after("3")}) == {"c2"}


def retired(listing, positions, committed=None):
    """``retire_finished`` for a batch starting at ``committed`` (default: ``positions``)."""
    return retire_finished(listing, positions, positions if committed is None else committed)


def test_parent_retires_once_all_children_are_tracked():
    listing = {"s": SPLIT}
    assert retired(listing, {sid("p"): END, sid("c1"): TH}) == {sid("p"): END, sid("c1"): TH}
    assert retired(listing, {sid("p"): END, sid("c1"): TH, sid("c2"): Position.after("1")}) == {
        sid("c1"): TH,
        sid("c2"): Position.after("1"),
    }
    # not at its end yet: stays
    assert sid("p") in retired(listing, {sid("p"): Position.after("1"), sid("c1"): TH, sid("c2"): TH})


def test_a_parent_that_ends_in_this_batch_stays_until_its_end_is_committed():
    """Issue 14 item 1: a query that first starts after a split tracks parent and children
    from its initial offset. When the probe sees the parent end, the parent must stay in the
    end offset at SHARD_END (so the commit of that batch writes it to DynamoDB); it leaves the
    offset in the next batch. Retired at once, its SHARD_END never reached DynamoDB."""
    listing = {"s": SPLIT}
    start = {sid("p"): Position.after("99"), sid("c1"): TH, sid("c2"): TH}
    end = {sid("p"): END, sid("c1"): TH, sid("c2"): Position.after("150")}
    assert retired(listing, end, committed=start) == end
    assert retired(listing, end, committed=end) == {sid("c1"): TH, sid("c2"): Position.after("150")}


def test_unlisted_shard_at_its_end_leaves_the_offset():
    assert retired({"s": SPLIT[1:]}, {sid("gone"): END, sid("c1"): TH}) == {sid("c1"): TH}


def test_offset_stays_bounded_over_many_reshards():
    # a chain of 50 splits, each parent ending and its children starting in turn
    shards = [ShardInfo("g0", ending_seq="1")]
    for i in range(1, 51):
        shards.append(ShardInfo(f"g{i}", parent=f"g{i - 1}", ending_seq=None if i == 50 else "1"))
    positions = {sid("g0"): TH}
    for _ in range(200):
        todo = probe_starts({"s": shards}, positions)
        if not todo:
            break
        committed = dict(positions)
        for (_, shard) in todo:
            closed = next(s for s in shards if s.shard_id == shard).is_closed
            positions[sid(shard)] = END if closed else Position.after("5")
        positions = retired({"s": shards}, positions, committed)
        assert len(positions) <= 3
    assert positions == {sid("g50"): Position.after("5")}


def test_gone_shards_are_tracked_unfinished_and_unlisted():
    from kinesis_source.lineage import gone_shards

    listing = {"s": SPLIT[1:]}  # p no longer listed
    assert gone_shards(listing, {sid("p"): Position.after("5"), sid("c1"): TH}) == [sid("p")]
    assert gone_shards(listing, {sid("p"): END, sid("c1"): TH}) == []
    assert gone_shards(listing, {sid("x", "t"): Position.after("1")}) == []  # another stream's shard


# p split into c1 and c2, then c1 split into g1 and g2, and c2 merged with q into m
CHAIN = [
    ShardInfo("p", ending_seq="100"),
    ShardInfo("q", ending_seq="90"),
    ShardInfo("c1", parent="p", ending_seq="200"),
    ShardInfo("c2", parent="p", ending_seq="210"),
    ShardInfo("g1", parent="c1"),
    ShardInfo("g2", parent="c1"),
    ShardInfo("m", parent="c2", adjacent_parent="q"),
]


def committed_states(shards):
    """Every way a table can hold these shards: each at SHARD_END, mid-way, or absent."""
    ids = [s.shard_id for s in shards]
    for choice in itertools.product((None, "mid", "end"), repeat=len(ids)):
        state = {i: c for i, c in zip(ids, choice, strict=True) if c}
        yield {
            sid(i): (END if c == "end" else Position.after("7")) for i, c in state.items()
        }


def test_dropping_a_droppable_shard_never_changes_where_a_resume_reads():
    checked = 0
    for shards in (SPLIT, MERGE, CHAIN):
        for committed in committed_states(shards):
            ended = [k for k, v in committed.items() if v.is_shard_end]
            dropped = droppable({"s": shards}, committed, ended)
            checked += len(dropped)
            resume = probe_starts({"s": shards}, committed)
            for gone in [[key] for key in dropped] + [dropped]:  # one at a time, and all at once
                without = {k: v for k, v in committed.items() if k not in gone}
                assert probe_starts({"s": shards}, without) == resume, (
                    f"dropping {gone} from {committed} changes the resume"
                )
    assert checked > 100  # the graphs do reach states with shards to drop


def test_a_parent_stays_until_a_child_is_committed():
    listing = {"s": SPLIT}
    assert droppable(listing, {sid("p"): END}, [sid("p")]) == []
    assert droppable(listing, {sid("p"): END, sid("c1"): Position.after("3")}, [sid("p")]) == [sid("p")]
    # the merge child is committed: both of its parents can go
    merged = {sid("a"): END, sid("b"): END, sid("m"): Position.after("1")}
    assert droppable({"s": MERGE}, merged, [sid("a"), sid("b")]) == [sid("a"), sid("b")]


def test_an_expired_shard_can_go_but_nothing_of_an_unlisted_stream():
    assert droppable({"s": [ShardInfo("c1", parent="gone")]}, {sid("gone"): END}, [sid("gone")]) == [
        sid("gone")
    ]
    assert droppable({"s": []}, {sid("p"): END}, [sid("p")]) == []
    assert droppable({}, {sid("p"): END}, [sid("p")]) == []


def test_a_shard_with_a_tracked_descendant_is_superseded_and_the_rest_is_not():
    assert superseded({"s": SPLIT}, {sid("c1")}) == {sid("p")}
    assert superseded({"s": MERGE}, {sid("m")}) == {sid("a"), sid("b")}
    assert superseded({"s": CHAIN}, {sid("g1")}) == {sid("p"), sid("c1")}
    assert superseded({"s": CHAIN}, {sid("m")}) == {sid("p"), sid("q"), sid("c2")}
    assert superseded({"s": CHAIN}, {sid("p"), sid("g1")}) == {sid("c1")}  # tracked itself: not
    assert superseded({"s": CHAIN}, set()) == set()
    # and probe_starts agrees: leaving the superseded shards out changes nothing
    for tracked in ({sid("g1")}, {sid("m")}, {sid("g1"), sid("m")}):
        start = {k: Position.after("7") for k in tracked}
        with_ends = {**start, **{k: END for k in superseded({"s": CHAIN}, tracked)}}
        assert probe_starts({"s": CHAIN}, start) == probe_starts({"s": CHAIN}, with_ends)
