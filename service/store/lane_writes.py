"""Writing a transition back: the difference between the state a command saw and the state
its transition returned, plus the entries, usage rows and events it committed.

All functions take a connection inside the caller's transaction (and pipeline).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from psycopg import AsyncConnection

from service.domain.errors import AlreadyExists
from service.domain.state import LaneState, Operation
from service.domain.transition import Transition
from service.store.codec import encode
from service.store.lane_ref import LaneRef

Conn = AsyncConnection[Any]


def _optional(message: Any) -> bytes | None:
    return None if message is None else encode(message)


async def insert_lane(conn: Conn, lane: LaneRef, state: LaneState) -> bool:
    """Insert a new lane row (revision 0); False when the lane already exists."""
    cur = await conn.execute(
        "INSERT INTO lanes (namespace, lane_id, configuration, usage_totals)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (namespace, lane_id) DO NOTHING",
        (*lane, encode(state.configuration), encode(state.usage_totals)),
    )
    return cur.rowcount == 1


async def write_transition(
    conn: Conn, lane: LaneRef, before: LaneState, transition: Transition
) -> None:
    """Write everything ``transition`` changed relative to ``before``."""
    after = transition.state
    if after == before and not transition.events:
        return
    await _write_inbox(conn, lane, before, after)
    await _write_operation(conn, lane, before, after)
    if transition.entries:
        await conn.cursor().executemany(
            "INSERT INTO entries (namespace, lane_id, entry_id, parent_id, seq, kind, body)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (*lane, e.id, e.parent_id or None, e.seq, e.WhichOneof("payload"), encode(e))
                for e in transition.entries
            ],
        )
    if transition.usage_rows:
        await conn.cursor().executemany(
            "INSERT INTO usage_rows (namespace, lane_id, usage_id, seq, body)"
            " VALUES (%s, %s, %s, %s, %s)",
            [(*lane, row.id, row.seq, encode(row)) for row in transition.usage_rows],
        )
    if transition.events:
        # One statement for the whole group (arrays unnested server-side), not one per event.
        events = transition.events
        await conn.execute(
            "INSERT INTO events (namespace, lane_id, revision, group_end, kind, body, commit_time)"
            " SELECT %s, %s, revision, %s, kind, body, %s"
            " FROM unnest(%s::bigint[], %s::text[], %s::bytea[]) AS e(revision, kind, body)",
            (
                *lane,
                events[-1].revision,
                events[0].commit_time.ToDatetime(tzinfo=UTC),
                [e.revision for e in events],
                [e.WhichOneof("kind") for e in events],
                [encode(e) for e in events],
            ),
        )
    operation = after.operation
    await conn.execute(
        "UPDATE lanes SET revision = %s, tip_id = %s, configuration = %s, message_count = %s,"
        " usage_totals = %s, current_operation_id = %s, last_operation_id = %s, faulted = %s"
        " WHERE namespace = %s AND lane_id = %s",
        (
            after.revision,
            after.tip_id or None,
            encode(after.configuration),
            after.message_count,
            encode(after.usage_totals),
            operation.operation_id if operation else None,
            after.last_operation_id,
            after.faulted,
            *lane,
        ),
    )


async def _write_inbox(conn: Conn, lane: LaneRef, before: LaneState, after: LaneState) -> None:
    if before.inbox == after.inbox:
        return
    kept = {item.entry_id for item in after.inbox}
    known = {item.entry_id for item in before.inbox}
    removed = [item.entry_id for item in before.inbox if item.entry_id not in kept]
    if removed:
        await conn.execute(
            "DELETE FROM inbox WHERE namespace = %s AND lane_id = %s AND entry_id = ANY(%s)",
            (*lane, removed),
        )
    for item in after.inbox:
        if item.entry_id not in known:
            await conn.execute(
                "WITH pos AS (UPDATE lanes SET next_inbox_position = next_inbox_position + 1"
                " WHERE namespace = %(ns)s AND lane_id = %(lane)s RETURNING next_inbox_position)"
                " INSERT INTO inbox (namespace, lane_id, entry_id, position, body)"
                " SELECT %(ns)s, %(lane)s, %(entry)s, next_inbox_position, %(body)s FROM pos",
                {**lane.params, "entry": item.entry_id, "body": encode(item)},
            )


async def _insert_operation(conn: Conn, lane: LaneRef, operation: Operation) -> None:
    """Insert a new operation row; an id used before (by any lane of the namespace) is
    refused."""
    cur = await conn.execute(
        "INSERT INTO operations (namespace, lane_id, operation_id, kind, started_time,"
        " from_tip_id, settings, phase, continuation, reason)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (namespace, operation_id) DO NOTHING RETURNING operation_id",
        (
            *lane,
            operation.operation_id,
            operation.kind,
            operation.started_time,
            operation.from_tip_id or None,
            encode(operation.settings),
            operation.phase.value,
            operation.continuation.value,
            operation.reason,
        ),
    )
    if await cur.fetchone() is None:
        raise AlreadyExists(
            "OPERATION_ID_EXISTS",
            f"operation id {operation.operation_id} was used before",
            operationId=operation.operation_id,
        )


def _row_fields(operation: Operation | None) -> tuple[object, ...] | None:
    """The columns of the operations row that change while it is open."""
    if operation is None:
        return None
    batch_entry_id = operation.batch.assistant_entry_id if operation.batch else None
    return (
        operation.cancel_requested,
        operation.phase.value,
        operation.continuation.value,
        operation.turn_id,
        batch_entry_id,
        operation.lease_token,
        operation.lease_holder,
        operation.lease_expires,
        operation.recovering,
        _optional(operation.streaming),
        _optional(operation.retry),
        _optional(operation.deferred),
        operation.attempt,
    )


async def _write_operation(conn: Conn, lane: LaneRef, before: LaneState, after: LaneState) -> None:
    old, new = before.operation, after.operation
    if old is None and new is None:
        if after.last_result is not None and after.last_operation_id != before.last_operation_id:
            await _insert_ended_operation(conn, lane, after)
        return
    if old == new:
        return
    if new is None:
        assert old is not None
        # Terminal clean-up: the result record stays; every per-operation row goes.
        await conn.execute(
            "DELETE FROM tool_calls WHERE namespace = %s AND operation_id = %s",
            (lane.namespace, old.operation_id),
        )
        await conn.execute(
            "UPDATE operations SET result = %s, phase = 'ended', turn_id = NULL,"
            " batch_entry_id = NULL, lease_holder = NULL, lease_expires = NULL,"
            " recovering = false, streaming = NULL, retry = NULL, deferred = NULL"
            " WHERE namespace = %s AND operation_id = %s",
            (_optional(after.last_result), lane.namespace, old.operation_id),
        )
        return
    if old is None or old.operation_id != new.operation_id:
        await _insert_operation(conn, lane, new)
        old = None
    fields = _row_fields(new)
    if fields != _row_fields(old):
        await conn.execute(
            "UPDATE operations SET cancel_requested = %s, phase = %s, continuation = %s,"
            " turn_id = %s, batch_entry_id = %s, lease_token = %s, lease_holder = %s,"
            " lease_expires = %s, recovering = %s, streaming = %s, retry = %s, deferred = %s,"
            " attempt = %s WHERE namespace = %s AND operation_id = %s",
            (*fields, lane.namespace, new.operation_id),  # type: ignore[misc]
        )
    batch = new.batch
    old_calls = {c.source_index: c for c in (old.batch.calls if old and old.batch else ())}
    new_calls = {c.source_index: c for c in (batch.calls if batch else ())}
    gone = [index for index in old_calls if index not in new_calls]
    if gone:
        await conn.execute(
            "DELETE FROM tool_calls"
            " WHERE namespace = %s AND operation_id = %s AND source_index = ANY(%s)",
            (lane.namespace, new.operation_id, gone),
        )
    changed = [c for index, c in new_calls.items() if old_calls.get(index) != c]
    if changed:
        assert batch is not None
        await conn.cursor().executemany(
            "INSERT INTO tool_calls (namespace, operation_id, source_index, turn_id,"
            " tool_call_id, tool_name, result_entry_id, status, replay, arguments_json,"
            " progress, checkpoint, result_message, terminate)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (namespace, operation_id, source_index)"
            " DO UPDATE SET status = EXCLUDED.status,"
            " replay = EXCLUDED.replay, arguments_json = EXCLUDED.arguments_json,"
            " progress = EXCLUDED.progress, checkpoint = EXCLUDED.checkpoint,"
            " result_message = EXCLUDED.result_message, terminate = EXCLUDED.terminate",
            [
                (
                    lane.namespace,
                    new.operation_id,
                    c.source_index,
                    batch.turn_id,
                    c.tool_call_id,
                    c.tool_name,
                    c.result_entry_id,
                    c.status.value,
                    c.replay,
                    c.arguments_json,
                    _optional(c.progress),
                    _optional(c.checkpoint),
                    _optional(c.result_message),
                    c.terminate,
                )
                for c in changed
            ],
        )


async def _insert_ended_operation(conn: Conn, lane: LaneRef, state: LaneState) -> None:
    """The row of an operation opened and ended in one commit (navigation): its record."""
    result = state.last_result
    assert result is not None
    cur = await conn.execute(
        "INSERT INTO operations (namespace, lane_id, operation_id, kind, started_time,"
        " from_tip_id, settings, phase, continuation, result)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, 'ended', %s, %s)"
        " ON CONFLICT (namespace, operation_id) DO NOTHING RETURNING operation_id",
        (
            *lane,
            result.operation_id,
            result.kind,
            result.started_time.ToDatetime(tzinfo=UTC),
            result.from_tip_id or None,
            b"",
            "may_finish",
            encode(result),
        ),
    )
    if await cur.fetchone() is None:
        raise AlreadyExists(
            "OPERATION_ID_EXISTS",
            f"operation id {result.operation_id} was used before",
            operationId=result.operation_id,
        )
