"""The install-route environments' fixtures (``tests/support/install.py``), shared by the
single-host and the cluster route tests."""

from tests.support.install import clean, wheel, wheel_env  # noqa: F401
