"""The retry rule's waits: the documented formula, its bounds and its cap."""

import pytest

from kinesis_source.aws.retries import MAX_DELAY_S, RetryRule


@pytest.mark.parametrize("retry", [1, 2, 3, 4])
def test_throttled_retry_waits_between_half_and_all_of_the_doubling_base(retry):
    rule = RetryRule(max_retries=10, base_ms=300)
    step = 0.3 * 2 ** (retry - 1)
    assert rule.delay(retry, throttled=True, rand=lambda: 0.0) == pytest.approx(step / 2)
    assert rule.delay(retry, throttled=True, rand=lambda: 1.0) == pytest.approx(step)


def test_other_errors_wait_a_twentieth():
    rule = RetryRule(max_retries=10, base_ms=1000)
    assert rule.delay(1, throttled=False, rand=lambda: 1.0) == pytest.approx(0.05)
    assert rule.delay(3, throttled=False, rand=lambda: 0.0) == pytest.approx(0.1)


def test_waits_are_capped():
    rule = RetryRule(max_retries=100, base_ms=60000)
    assert rule.delay(30, throttled=True, rand=lambda: 1.0) == MAX_DELAY_S
    assert rule.delay(30, throttled=True, rand=lambda: 0.0) == MAX_DELAY_S / 2


def test_a_smaller_base_waits_less():
    fast, slow = RetryRule(3, 1), RetryRule(3, 1000)
    for retry in (1, 2, 3):
        assert fast.delay(retry, True, lambda: 1.0) < slow.delay(retry, True, lambda: 0.0)


def test_a_rate_refused_subscription_waits_one_to_two_seconds_at_random():
    """Two callers of one consumer and shard that each waited exactly a second after a rate
    refusal would refuse each other's every call: the wait after one is random."""
    from botocore.exceptions import ClientError

    from kinesis_source.aws.subscribe import CALL_GAP_S, rule_wait

    def refusal(code):
        return ClientError({"Error": {"Code": code, "Message": ""}}, "SubscribeToShard")

    waits = [rule_wait(refusal("LimitExceededException")) for _ in range(200)]
    assert all(CALL_GAP_S <= w <= 2 * CALL_GAP_S for w in waits)
    assert max(waits) - min(waits) > 0.5 * CALL_GAP_S
    assert rule_wait(refusal("ResourceInUseException")) == CALL_GAP_S
