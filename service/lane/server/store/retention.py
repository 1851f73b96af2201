"""Retention of the event log and of stored answers.

Event log: the declared promise is at least 24 h AND the last 10,000 events of every lane,
whichever keeps more. Only whole commit groups are removed, so the retention floor (the highest
removed revision) always sits on a group boundary: resuming after the floor never starts inside
a commit.

Answers (the ``requests`` table, one per request id, for idempotent retries): kept for
``LANE_REQUEST_RETENTION_SECONDS`` (default 24 h), and longer while the operation they belong to
is open. A retry whose answer was deleted is a new request.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import AsyncConnectionPool

from lane.server.store.lane_ref import LANE_SCAN, LaneRef

KEEP_EVENTS = 10_000
KEEP_AGE = timedelta(hours=24)
#: The default of ``LANE_REQUEST_RETENTION_SECONDS``.
KEEP_ANSWERS = timedelta(hours=24)
#: How many answers one DELETE removes: each batch is its own short transaction.
PRUNE_BATCH = 1000
#: Answers of a lane's open operation are kept if created after the operation started, less
#: this. The operation's start is the service's clock when the command ran, its answer's
#: creation the database's at the transaction's start (before the command waited for the lane
#: lock): the margin covers that wait and the difference between the clocks.
OPEN_OPERATION_MARGIN = timedelta(minutes=10)


async def enforce_retention(
    pool: AsyncConnectionPool,
    *,
    keep_events: int = KEEP_EVENTS,
    keep_age: timedelta = KEEP_AGE,
) -> dict[LaneRef, int]:
    """Delete events outside the retention window; return the new floor of each lane changed."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            LANE_SCAN + "WITH doomed AS ("
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


async def prune_answers(
    pool: AsyncConnectionPool,
    keep: timedelta = KEEP_ANSWERS,
    *,
    batch: int = PRUNE_BATCH,
    margin: timedelta = OPEN_OPERATION_MARGIN,
) -> int:
    """Delete stored answers older than ``keep``, except those of a lane's open operation (the
    lane's current operation started at most ``margin`` after the answer was created); return
    how many were deleted. Deletes ``batch`` rows per statement, each its own transaction, so
    no pass holds locks for long; a row a command is updating at that moment is skipped."""
    deleted = 0
    while True:
        async with pool.connection() as conn:
            cur = await conn.execute(
                LANE_SCAN + "DELETE FROM requests WHERE ctid = ANY(ARRAY("
                "  SELECT r.ctid FROM requests r"
                "  LEFT JOIN lanes l ON l.namespace = r.namespace AND l.lane_id = r.lane_id"
                "  LEFT JOIN operations o ON o.namespace = l.namespace AND o.lane_id = l.lane_id"
                "    AND o.operation_id = l.current_operation_id"
                "  WHERE r.created_time < now() - %(keep)s"
                "    AND (o.started_time IS NULL OR o.started_time > r.created_time + %(margin)s)"
                "  LIMIT %(batch)s))",
                {"keep": keep, "margin": margin, "batch": batch},
            )
            count = cur.rowcount
        deleted += count
        if count < batch:
            return deleted
