"""Where the service's "now" comes from.

Every time a command decides with (lease expiry, an event's commit time, a run's start) is the
store's clock, read once per decision and handed to the domain step; the statements that pick
candidates by time (the reconciler's expired leases, the lanes quiet long enough to place)
compare with the same clock's reading, sent as a parameter, not with PostgreSQL's ``now()``.
So a store built with another clock (a test's, moved by hand) sees its leases lapse and its
orphans age without anyone waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

#: A clock: the current time, timezone-aware (UTC).
Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The real time, in UTC: every store's clock unless it is given another."""
    return datetime.now(UTC)
