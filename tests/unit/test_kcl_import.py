"""KCL lease items (1.x to 3.5, single- and multi-stream) become positions: other entities are
skipped, AT_TIMESTAMP needs its timestamp, closed ancestors without leases are finished, a
re-created stream is refused."""

import pytest

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.errors import CheckpointError, OptionError
from kinesis_source.tools.kcl_import import check_streams, positions, read_leases
from tests.support.kcl_leases import kcl35_other_entities, v2_lease, v3_lease


def test_v2_and_v3_leases_side_by_side_and_other_entities_skipped():
    items = [v2_lease("shardId-000000000001", "4959", 3), v3_lease("shardId-000000000000", "SHARD_END"),
             v3_lease("shardId-000000000002", "LATEST"), *kcl35_other_entities()]
    leases, skipped = read_leases(items, ["orders"])
    assert positions(leases, {}, None) == {
        "orders/shardId-000000000000": "SHARD_END",
        "orders/shardId-000000000001": "AFTER:4959:3",
        "orders/shardId-000000000002": "LATEST",
    }
    assert skipped == {"entityType LEADER": 1, "entityType WORKER_METRIC_STATS": 1,
                       "entityType TABLE_MIGRATION": 1, "entityType STREAM": 1, "no checkpoint": 1}


def test_single_stream_leases_need_exactly_one_stream():
    with pytest.raises(OptionError, match="give its stream with exactly one --stream"):
        read_leases([v2_lease("shardId-000000000001", "5")], [])
    with pytest.raises(OptionError, match="exactly one --stream"):
        read_leases([v2_lease("shardId-000000000001", "5")], ["a", "b"])


def test_multi_stream_leases_of_the_streams_asked_for_only():
    items = [v3_lease("shardId-000000000001", "77", stream="orders", epoch=1700000000),
             v3_lease("shardId-000000000001", "88", stream="clicks", epoch=1700000001)]
    leases, skipped = read_leases(items, ["orders"])
    assert positions(leases, {}, None) == {"orders/shardId-000000000001": "AFTER:77:0"}
    assert skipped == {"other stream": 1}
    everything, _ = read_leases(items, [])
    assert {lease.stream for lease in everything} == {"orders", "clicks"}


def test_a_re_created_stream_is_refused():
    leases, _ = read_leases([v3_lease("shardId-000000000001", "77", stream="orders", epoch=1700000000)], [])
    check_streams(leases, {"orders": 1700000000.25})  # the same stream: whole seconds in the key
    with pytest.raises(CheckpointError, match="deleted and re-created"):
        check_streams(leases, {"orders": 1800000000.0})


def test_at_timestamp_needs_its_timestamp():
    leases, _ = read_leases([v3_lease("shardId-000000000001", "AT_TIMESTAMP")], ["orders"])
    with pytest.raises(OptionError, match="--at-timestamp"):
        positions(leases, {}, None)
    assert positions(leases, {}, "2026-11-01T00:00:00Z") == {
        "orders/shardId-000000000001": "AT_TIMESTAMP:2026-11-01T00:00:00Z"}


def test_a_checkpoint_that_is_no_position_is_refused():
    leases, _ = read_leases([v2_lease("shardId-000000000001", "PENDING")], ["orders"])
    with pytest.raises(CheckpointError, match="'shardId-000000000001' has checkpoint 'PENDING'"):
        positions(leases, {}, None)


def test_closed_ancestors_without_leases_are_finished():
    # g split into p and q; p split into c1 and c2; KCL deleted g's and p's leases
    listing = {"orders": [
        ShardInfo("g", ending_seq="10"),
        ShardInfo("p", parent="g", ending_seq="20"), ShardInfo("q", parent="g"),
        ShardInfo("c1", parent="p"), ShardInfo("c2", parent="p"),
        ShardInfo("m", parent="q", adjacent_parent="x"), ShardInfo("x", ending_seq="5"),
    ]}
    leases, _ = read_leases([v3_lease("c1", "25"), v3_lease("c2", "TRIM_HORIZON"), v3_lease("q", "15")],
                            ["orders"])
    assert positions(leases, listing, None) == {
        "orders/c1": "AFTER:25:0", "orders/c2": "TRIM_HORIZON", "orders/g": "SHARD_END",
        "orders/p": "SHARD_END", "orders/q": "AFTER:15:0",
    }
