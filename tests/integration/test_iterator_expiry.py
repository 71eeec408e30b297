"""An iterator older than 5 minutes is re-derived without loss (on kinesis-local, whose clock
the scenario moves 5 minutes ahead: tests/support/expiry.py)."""

from tests.support import expiry


def test_iterator_older_than_five_minutes_is_re_derived_without_loss():
    result = expiry.run()
    assert result["expiries"] >= 1, "the reader's iterator never expired"
    assert result["got"] == result["sent"], "records lost or repeated across the expiry"
