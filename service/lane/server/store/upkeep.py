"""What the service's background work asks of the database as a whole, not of one lane:
retention, stored answers to prune, lanes with a placement left pending, the NOTIFY queue, the
connections the server allows, and whether it is reachable and takes writes. One part of
:class:`~lane.server.store.lane_store.Store`, which offers these as its own methods."""

from __future__ import annotations

from datetime import timedelta

from lane.server.store.clock import Clock
from lane.server.store.lane_ref import LaneRef
from lane.server.store.pending_placements import quiet_pending_placements
from lane.server.store.pool import LanePool, unready_reason
from lane.server.store.retention import KEEP_ANSWERS, enforce_retention, prune_answers

# Connections a client other than a superuser may open (what a service's pools share).
_CONNECTIONS_ALLOWED = (
    "SELECT current_setting('max_connections')::int"
    " - current_setting('superuser_reserved_connections')::int"
)


class Upkeep:
    """The store's upkeep queries (module docstring), on its pool and clock."""

    def __init__(self, pool: LanePool, clock: Clock) -> None:
        self._pool = pool
        self._clock = clock

    async def enforce_retention(self) -> dict[LaneRef, int]:
        """Delete the events outside the retention window (retention.py); the new floor of
        each lane changed."""
        return await enforce_retention(self._pool)

    async def prune_answers(self, keep: timedelta = KEEP_ANSWERS) -> int:
        """Delete the stored answers older than ``keep`` but those of open operations
        (retention.py); how many were deleted."""
        return await prune_answers(self._pool, keep)

    async def lanes_awaiting_placement(self, quiet_for: timedelta) -> list[LaneRef]:
        """Lanes whose open batch has a ready prefix left unplaced and that committed nothing
        for ``quiet_for`` (pending_placements.py; a page of them)."""
        return await quiet_pending_placements(self._pool, quiet_for, self._clock())

    async def notification_queue_usage(self) -> float | None:
        """The share of the cluster's NOTIFY queue in use (0 to 1)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT pg_notification_queue_usage()")
            row = await cur.fetchone()
        return None if row is None else float(row[0])

    async def connections_allowed(self) -> int | None:
        """How many connections the database allows clients that are not superusers."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CONNECTIONS_ALLOWED)
            row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def unready_reason(self, within: float) -> str | None:
        """Why commands cannot be served now, None when they can (pool.unready_reason)."""
        return await unready_reason(self._pool, within=within)

    def reachable(self) -> bool:
        """False while the last attempt to connect to the database failed."""
        return self._pool.reachable

    async def wait_unreachable(self) -> None:
        """Return once an attempt to connect has failed (at once if the last one did)."""
        await self._pool.wait_unreachable()
