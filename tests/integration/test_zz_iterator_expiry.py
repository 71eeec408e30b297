"""An iterator older than 5 minutes is re-derived without loss (kinesis-local).

Named to run last: the scenario started with kinesis-local (tests/support/expiry.py) and has
been waiting out the expiry while the other tests ran.
"""

import pytest

pytestmark = pytest.mark.backends("kinesis-local")


def test_iterator_older_than_five_minutes_is_re_derived_without_loss(iterator_expiry):
    result = iterator_expiry.result(timeout=600)
    assert result["expiries"] >= 1, "the reader's iterator never expired"
    assert result["waited"] >= 1  # real seconds passed on the server's clock
    assert result["got"] == result["sent"], "records lost or repeated across the expiry"
