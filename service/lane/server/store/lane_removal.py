"""Deleting a lane: every row that names it, in the caller's transaction.

Every table keyed by a lane is listed here (tests/integration/test_delete_lane.py checks the
list against the schema), so a table added later and forgotten here fails that test rather
than leaving rows of deleted lanes behind.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from lane.server.store.codec import encode
from lane.server.store.lane_ref import LaneRef
from lane.server.store.lane_writes import RecordedAnswer

#: The tables holding a lane's rows, children first (tool calls and the inbox keep foreign
#: keys to operations and lanes).
LANE_TABLES = ("tool_calls", "operations", "inbox", "entries", "usage_rows", "events", "requests")


async def delete_lane_rows(conn: AsyncConnection[Any], lane: LaneRef) -> None:
    """Delete the lane and every row of it (the caller holds the lane row lock)."""
    async with conn.pipeline():
        for table in LANE_TABLES:
            await conn.execute(
                f"DELETE FROM {table} WHERE namespace = %(ns)s AND lane_id = %(lane)s",
                lane.params,
            )
        await conn.execute(
            "DELETE FROM lanes WHERE namespace = %(ns)s AND lane_id = %(lane)s", lane.params
        )


async def record_answer(conn: AsyncConnection[Any], lane: LaneRef, answer: RecordedAnswer) -> None:
    """Keep ``answer`` under its request id for the lane's key, with no lane row to join."""
    await conn.execute(
        "INSERT INTO requests (namespace, lane_id, request_id, method, request_hash, response)"
        " VALUES (%(ns)s, %(lane)s, %(request)s, %(method)s, %(digest)s, %(response)s)",
        {
            **lane.params,
            "request": answer.request_id,
            "method": answer.method,
            "digest": answer.digest,
            "response": encode(answer.answer),
        },
    )
