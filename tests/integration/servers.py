"""Kept for the tests that import it: :func:`extra_server` lives in :mod:`tests.support.servers`."""

from tests.support.servers import extra_server

__all__ = ["extra_server"]
