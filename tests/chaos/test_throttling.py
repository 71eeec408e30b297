"""Scenario 12: a throttling storm under kills (issue 19, item 4), on both Kinesis implementations.

The campaign of scenario 1 through the quota-enforcing server (5 `GetRecords` and 5
`GetShardIterator` calls per shard and second, every caller together) while

- a neighbour application polls every shard 2.5 times a second (half the shared quota), and
- on top of the quotas, 40% of every `GetRecords` and `GetShardIterator` call (anyone's) is
  answered `ProvisionedThroughputExceededException`, as when more applications share the
  stream than the quota holds.

The query must slow down, never fail, lose nothing (rows read again only from the batch in
flight), and its calls, retries and refused calls included, must stay within its per-shard
budget (by default 2 `GetRecords` and 1 `GetShardIterator` per shard and second, in any 10-s
window): retrying must not turn a storm into more load on the shard.
"""

from __future__ import annotations

import pytest

from tests.chaos import harness
from tests.chaos.campaign import run_campaign
from tests.chaos.test_kills import assert_campaign
from tests.support.proxy import THROTTLED
from tests.support.quota import Neighbour, QuotaProxy, as_users_run

pytestmark = [pytest.mark.spark, pytest.mark.backends(*harness.backends("kinesis-local"))]

STORM = 0.4  # the fraction of calls refused on top of the quotas
BUDGET = {"GetRecords": 2.0, "GetShardIterator": 1.0}  # the source's defaults, per shard and second


@pytest.mark.timeout(max(900, 300 + 200 * (harness.KILLS + 1)))
def test_a_throttling_storm_under_kills_slows_the_query_and_stays_in_its_budget(
    kinesis, kinesis_backend, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(4)
    shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    with QuotaProxy(kinesis_backend, seed=harness.SEED) as quota, Neighbour(
        quota.url, stream, shards, rate=2.5
    ) as neighbour:
        quota.throttle({"GetRecords", "GetShardIterator"}, STORM)
        options = as_users_run(source_options)
        options.update(streamName=stream, endpointUrl=quota.url)

        def ours(call) -> bool:
            return call.access_key == options["awsAccessKeyId"]

        outcome = run_campaign(
            kinesis=kinesis, ddb=ddb, stream=stream, options=options, out=tmp_path,
            kills=harness.KILLS if harness.LONG else min(harness.KILLS, 2), rng=harness.rng_for("sigkill-storm"),
        )
        calls = {op: len(quota.calls(op, where=ours)) for op in BUDGET}
        refused = {op: len(quota.calls(op, where=ours, refused=True)) for op in BUDGET}
        storm = {op: sum(1 for s in quota.calls(op, where=ours) if s.injected == THROTTLED) for op in BUDGET}
        peaks = {op: quota.peak_rate(op, 10.0, where=ours) for op in BUDGET}
    harness.publish("throttling-storm", calls=calls, refused=refused, peaks_per_shard_s=peaks,
                    neighbour_calls=neighbour.calls, neighbour_refused=neighbour.refused, **outcome.figures())
    assert_campaign(outcome, harness.SEED)
    # the storm happened to the query: about STORM of its data calls refused
    assert refused["GetRecords"] >= 0.25 * calls["GetRecords"] > 0, (refused, calls, storm)
    for op, budget in BUDGET.items():
        assert peaks[op] <= budget, (
            f"{op}: {peaks[op]:.2f} calls per shard per second in the busiest 10 s, refused calls and "
            f"retries included, over the budget of {budget}"
        )
