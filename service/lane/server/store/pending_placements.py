"""The lanes whose open batch has a ready prefix left unplaced, found for the reconciler.

A ready prefix is outcome_ready calls with no planned or effect_pending call before them in
their batch. StageToolOutcome places it in the commit after the staging; one that stays is a
placement whose commit failed (pending_placement.py in service/lane/server/commands finishes it).
Only lanes quiet for a while are candidates: a placement about to commit is not taken from its
command.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from psycopg_pool import AsyncConnectionPool

from lane.server.store.lane_ref import LANE_SCAN, LaneRef

_PENDING = (
    LANE_SCAN + "SELECT DISTINCT t.namespace, t.lane_id FROM tool_calls t"
    " JOIN lanes l ON l.namespace = t.namespace AND l.lane_id = t.lane_id"
    " JOIN events e ON e.namespace = l.namespace AND e.lane_id = l.lane_id"
    "  AND e.revision = l.revision"
    " WHERE t.status = 'outcome_ready'"
    " AND NOT EXISTS (SELECT 1 FROM tool_calls b"
    "  WHERE b.namespace = t.namespace AND b.operation_id = t.operation_id"
    "  AND b.source_index < t.source_index AND b.status IN ('planned', 'effect_pending'))"
    " AND e.commit_time <= %s - %s"
    " LIMIT %s"
)


async def quiet_pending_placements(
    pool: AsyncConnectionPool, quiet_for: timedelta, now: datetime, limit: int = 100
) -> list[LaneRef]:
    """Lanes with a ready prefix unplaced whose last commit is at least ``quiet_for`` old at
    ``now`` (the store's clock, which wrote the commit times; at most ``limit``; each is decided
    again by the domain in its own command)."""
    async with pool.connection() as conn:
        cur = await conn.execute(_PENDING, (now, quiet_for, limit))
        rows = await cur.fetchall()
    return [LaneRef(namespace, lane_id) for namespace, lane_id in rows]
