"""Event-log retention: the declared promise is at least 24 h AND the last 10,000 events of
every lane, whichever keeps more.

Only whole commit groups are removed, so the retention floor (the highest removed revision)
always sits on a group boundary: resuming after the floor never starts inside a commit.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import AsyncConnectionPool

from service.store.lane_ref import LaneRef

KEEP_EVENTS = 10_000
KEEP_AGE = timedelta(hours=24)


async def enforce_retention(
    pool: AsyncConnectionPool,
    *,
    keep_events: int = KEEP_EVENTS,
    keep_age: timedelta = KEEP_AGE,
) -> dict[LaneRef, int]:
    """Delete events outside the retention window; return the new floor of each lane changed."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "WITH doomed AS ("
            "  DELETE FROM events e USING lanes l"
            "  WHERE e.namespace = l.namespace AND e.lane_id = l.lane_id"
            "    AND e.group_end <= l.revision - %(keep)s AND e.commit_time < now() - %(age)s"
            "  RETURNING e.namespace, e.lane_id, e.group_end),"
            " floors AS (SELECT namespace, lane_id, max(group_end) AS floor FROM doomed"
            "  GROUP BY namespace, lane_id)"
            " UPDATE lanes l SET retention_floor = greatest(l.retention_floor, floors.floor)"
            " FROM floors WHERE l.namespace = floors.namespace AND l.lane_id = floors.lane_id"
            " RETURNING l.namespace, l.lane_id, l.retention_floor",
            {"keep": keep_events, "age": keep_age},
        )
        return {LaneRef(ns, lane): floor for ns, lane, floor in await cur.fetchall()}
