"""Reading a lane's durable state into domain values.

Every query of a load is keyed on the lane id and sent in one pipeline, so loading a lane costs
one round trip. The first query takes the lane row lock when asked; the others run after it in
the same transaction and so see the state the lock protects.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from lane.v1 import entries_pb2, lane_service_pb2, messages_pb2, snapshot_pb2
from psycopg import AsyncConnection, AsyncCursor

from lane.server.domain.errors import Corruption
from lane.server.domain.state import (
    CallStatus,
    Continuation,
    LaneState,
    Operation,
    Phase,
    ToolBatch,
    ToolCall,
)
from lane.server.store.codec import decode, decode_optional
from lane.server.store.lane_ref import LaneRef
from lane.server.store.run_settings import settings_of

Conn = AsyncConnection[Any]

_LANE = (
    "SELECT revision, tip_id, configuration, message_count, usage_totals,"
    " current_operation_id, last_operation_id, faulted, version, incarnation FROM lanes"
    " WHERE namespace = %(ns)s AND lane_id = %(lane)s"
)
_INBOX = "SELECT body FROM inbox WHERE namespace = %(ns)s AND lane_id = %(lane)s ORDER BY position"
_OPERATION = (
    "SELECT o.operation_id, o.kind, o.started_time, o.from_tip_id, o.settings,"
    " o.cancel_requested, o.phase, o.continuation, o.turn_id, o.batch_entry_id, e.body,"
    " o.lease_token, o.lease_holder, o.lease_expires, o.recovering,"
    " o.streaming, o.retry, o.deferred, o.attempt, o.reason"
    " FROM lanes l"
    " JOIN operations o ON o.namespace = l.namespace AND o.lane_id = l.lane_id"
    "  AND o.operation_id = l.current_operation_id"
    " LEFT JOIN entries e"
    "  ON e.namespace = l.namespace AND e.lane_id = l.lane_id AND e.entry_id = o.batch_entry_id"
    " WHERE l.namespace = %(ns)s AND l.lane_id = %(lane)s"
)
_CALLS = (
    "SELECT t.source_index, t.tool_call_id, t.tool_name, t.result_entry_id, t.status,"
    " t.replay, t.arguments_json, t.progress, t.checkpoint, t.result_message, t.terminate"
    " FROM lanes l"
    " JOIN tool_calls t ON t.namespace = l.namespace AND t.lane_id = l.lane_id"
    "  AND t.operation_id = l.current_operation_id"
    " WHERE l.namespace = %(ns)s AND l.lane_id = %(lane)s ORDER BY t.source_index"
)
_LAST_RESULT = (
    "SELECT o.result FROM lanes l"
    " JOIN operations o ON o.namespace = l.namespace AND o.lane_id = l.lane_id"
    "  AND o.operation_id = l.last_operation_id"
    " WHERE l.namespace = %(ns)s AND l.lane_id = %(lane)s"
)


class VersionedLane(NamedTuple):
    """A lane's state and the version of its rows it was read at."""

    state: LaneState
    version: int


async def load_lane(
    conn: Conn, lane: LaneRef, *, lock: bool, with_last_result: bool = False
) -> LaneState | None:
    """The lane's state, or None when it does not exist. ``lock`` takes the lane row lock.

    ``with_last_result`` also loads the last operation's result record (capture needs it;
    commands do not).
    """
    loaded = await load_versioned(conn, lane, lock=lock, with_last_result=with_last_result)
    return None if loaded is None else loaded.state


async def load_versioned(
    conn: Conn, lane: LaneRef, *, lock: bool, with_last_result: bool = False
) -> VersionedLane | None:
    """:func:`load_lane` with the version of the lane's rows (see schema 0005)."""
    params = lane.params
    async with conn.pipeline():
        lane_row = await conn.execute(_LANE + (" FOR UPDATE" if lock else ""), params)
        inbox = await conn.execute(_INBOX, params)
        operation = await conn.execute(_OPERATION, params)
        calls = await conn.execute(_CALLS, params)
        last = await conn.execute(_LAST_RESULT, params) if with_last_result else None
        row = await lane_row.fetchone()
        if row is None:
            return None
        (revision, tip_id, configuration, message_count, totals, _, last_id, faulted) = row[:8]
        version, incarnation = row[8:]
        state = LaneState(
            lane_id=lane.lane_id,
            revision=revision,
            tip_id=tip_id or "",
            configuration=decode(snapshot_pb2.LaneConfiguration, configuration),
            message_count=message_count,
            usage_totals=decode(messages_pb2.Usage, totals),
            inbox=tuple(decode(snapshot_pb2.QueuedItem, b) for (b,) in await inbox.fetchall()),
            operation=await _operation(operation, calls),
            last_operation_id=last_id,
            last_result=await _last_result(last),
            faulted=faulted,
            incarnation=incarnation,
        )
        return VersionedLane(state, version)


async def _last_result(cursor: AsyncCursor[Any] | None) -> snapshot_pb2.OperationResult | None:
    row = await cursor.fetchone() if cursor is not None else None
    return decode_optional(snapshot_pb2.OperationResult, row[0]) if row else None


async def _operation(
    operation_cursor: AsyncCursor[Any], calls_cursor: AsyncCursor[Any]
) -> Operation | None:
    row = await operation_cursor.fetchone()
    call_rows = await calls_cursor.fetchall()
    if row is None:
        return None
    (
        operation_id,
        kind,
        started,
        from_tip,
        settings,
        cancelled,
        phase,
        continuation,
        turn_id,
        batch_entry_id,
        batch_entry,
        lease_token,
        lease_holder,
        lease_expires,
        recovering,
        streaming,
        retry,
        deferred,
        attempt,
        reason,
    ) = row
    batch = None
    if batch_entry_id is not None:
        assistant = decode(entries_pb2.Entry, batch_entry).message.message.assistant
        batch = ToolBatch(
            turn_id=turn_id,
            assistant_entry_id=batch_entry_id,
            assistant=assistant,
            calls=tuple(_call(call_row) for call_row in call_rows),
        )
    return Operation(
        operation_id=operation_id,
        kind=kind,
        started_time=started,
        from_tip_id=from_tip or "",
        settings=settings_of(decode(lane_service_pb2.RunSettings, settings)),
        cancel_requested=cancelled,
        phase=Phase(phase),
        continuation=Continuation(continuation),
        turn_id=turn_id,
        batch=batch,
        lease_token=lease_token,
        lease_holder=lease_holder,
        lease_expires=lease_expires,
        recovering=recovering,
        streaming=decode_optional(messages_pb2.AssistantMessage, streaming),
        retry=decode_optional(snapshot_pb2.RetryState, retry),
        attempt=attempt,
        deferred=decode_optional(snapshot_pb2.DeferredState, deferred),
        reason=reason,
    )


def _call(row: tuple[Any, ...]) -> ToolCall:
    (index, call_id, name, result_id, status, replay, arguments, progress, checkpoint,
     result_message, terminate) = row  # fmt: skip
    return ToolCall(
        source_index=index,
        tool_call_id=call_id,
        tool_name=name,
        result_entry_id=result_id,
        status=CallStatus(status),
        replay=replay,
        arguments_json=arguments,
        progress=decode_optional(messages_pb2.ToolResult, progress),
        checkpoint=decode_optional(messages_pb2.ToolResult, checkpoint),
        result_message=decode_optional(messages_pb2.ToolResultMessage, result_message),
        terminate=terminate,
    )


# The transcript: the chain of parents from the tip back to the newest compaction entry. Each
# step looks its parent up by primary key (LATERAL ... LIMIT 1): a plain join lets the planner,
# before the table has statistics, scan all of the lane's entries at every step (quadratic).
_TRANSCRIPT = (
    "WITH RECURSIVE chain AS ("
    " SELECT entry_id, parent_id, kind, 0 AS depth FROM entries"
    " WHERE namespace = %(ns)s AND lane_id = %(lane)s AND entry_id = %(tip)s"
    " UNION ALL"
    " SELECT p.entry_id, p.parent_id, p.kind, chain.depth + 1 FROM chain"
    " CROSS JOIN LATERAL (SELECT e.entry_id, e.parent_id, e.kind FROM entries e"
    "  WHERE e.namespace = %(ns)s AND e.lane_id = %(lane)s AND e.entry_id = chain.parent_id"
    "  LIMIT 1) AS p"
    " WHERE chain.kind <> 'compaction')"
    " SELECT chain.entry_id, octet_length(e.body) FROM chain"
    " CROSS JOIN LATERAL (SELECT body FROM entries e"
    "  WHERE e.namespace = %(ns)s AND e.lane_id = %(lane)s AND e.entry_id = chain.entry_id"
    "  LIMIT 1) AS e"
    " ORDER BY chain.depth DESC"
)


async def load_transcript_index(conn: Conn, lane: LaneRef, tip_id: str) -> list[tuple[str, int]]:
    """The transcript's entries as (entry id, encoded size): from the newest compaction at or
    before the tip to the tip, oldest first. Entries never change once written, so their
    bodies may be read later, in pages (:func:`load_bodies`)."""
    if not tip_id:
        return []
    cur = await conn.execute(_TRANSCRIPT, {**lane.params, "tip": tip_id})
    return [(entry_id, size) for entry_id, size in await cur.fetchall()]


#: Tables whose rows are read by id (:func:`load_bodies`): (table, id column, what a row is).
ENTRY_ROWS = ("entries", "entry_id", "entry")
USAGE_ROWS = ("usage_rows", "usage_id", "usage row")


async def load_bodies(
    conn: Conn, lane: LaneRef, row_ids: Sequence[str], rows: tuple[str, str, str] = ENTRY_ROWS
) -> list[bytes]:
    """The encoded rows ``row_ids`` of ``rows`` (:data:`ENTRY_ROWS`, :data:`USAGE_ROWS`), in
    that order."""
    table, id_column, what = rows
    cur = await conn.execute(
        f"SELECT {id_column}, body FROM {table}"
        f" WHERE namespace = %(ns)s AND lane_id = %(lane)s AND {id_column} = ANY(%(ids)s)",
        {**lane.params, "ids": list(row_ids)},
        # Binary results: bytea as text is hex, twice the bodies' size held while decoding.
        binary=True,
    )
    bodies = {row_id: bytes(body) for row_id, body in await cur.fetchall()}
    missing = [row_id for row_id in row_ids if row_id not in bodies]
    if missing:
        raise Corruption(
            "LANE_STATE_CORRUPT",
            f"lane {lane.lane_id}: {what} {missing[0]} is gone",
            laneId=lane.lane_id,
            entryId=missing[0],
        )
    return [bodies[row_id] for row_id in row_ids]


async def load_events(
    conn: Conn, lane: LaneRef, after_revision: int, limit: int, max_bytes: int
) -> list[EventRow]:
    """Events after ``after_revision`` as (revision, group_end, body, commit_time), whole
    groups only (a group is never cut): the groups that start within the first ``limit``
    events and within the first ``max_bytes`` bytes of bodies. The first group always comes,
    whatever its size, so a read makes progress; it can run over by at most one group."""
    cur = await conn.execute(*_events_query(lane, after_revision, limit, max_bytes), binary=True)
    return _event_rows(await cur.fetchall())


async def load_events_of(
    conn: Conn, lane: LaneRef, after_revision: int, limit: int, max_bytes: int
) -> tuple[list[EventRow], int | None]:
    """:func:`load_events`, and the lane's incarnation read just after them in the same round
    trip (None when the lane is gone)."""
    async with conn.pipeline():
        events = await conn.execute(
            *_events_query(lane, after_revision, limit, max_bytes), binary=True
        )
        lane_row = await conn.execute(_INCARNATION, lane.params)
        rows = await events.fetchall()
        row = await lane_row.fetchone()
    return _event_rows(rows), None if row is None else row[0]


#: One event as read: (revision, group_end, body, commit_time).
EventRow = tuple[int, int, bytes, datetime]
_INCARNATION = "SELECT incarnation FROM lanes WHERE namespace = %(ns)s AND lane_id = %(lane)s"


def _events_query(
    lane: LaneRef, after_revision: int, limit: int, max_bytes: int
) -> tuple[str, dict[str, Any]]:
    return (
        "WITH head AS ("
        "   SELECT revision, group_end,"
        "   sum(octet_length(body)) OVER (ORDER BY revision) - octet_length(body) AS bytes_before"
        "   FROM events"
        "   WHERE namespace = %(ns)s AND lane_id = %(lane)s AND revision > %(after)s"
        "   ORDER BY revision LIMIT %(limit)s)"
        " SELECT revision, group_end, body, commit_time FROM events"
        " WHERE namespace = %(ns)s AND lane_id = %(lane)s AND revision > %(after)s"
        " AND revision <= (SELECT COALESCE(MAX(group_end), %(after)s) FROM head"
        "   WHERE bytes_before < %(max_bytes)s OR revision = %(after)s + 1)"
        " ORDER BY revision",
        {**lane.params, "after": after_revision, "limit": limit, "max_bytes": max_bytes},
    )


def _event_rows(rows: list[Any]) -> list[EventRow]:
    # Binary results (bytea as text is hex, twice the bodies' size held while decoding).
    return [(r, g, bytes(b), t) for (r, g, b, t) in rows]
