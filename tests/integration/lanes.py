"""Kept for the tests that import it: the helpers live in :mod:`tests.support.lanes`, and so
does the one list of their names."""

from tests.support.lanes import *  # noqa: F403
from tests.support.lanes import __all__ as __all__
