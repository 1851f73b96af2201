"""Reading a lane's durable state into domain values, and writing a transition back.

All functions take a connection inside the caller's transaction. Writes are the difference
between the state a command saw and the state its transition returned.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from lane.v1 import entries_pb2, lane_service_pb2, messages_pb2, snapshot_pb2
from psycopg import AsyncConnection
from psycopg.errors import UniqueViolation

from service.domain.errors import AlreadyExists
from service.domain.state import (
    CallStatus,
    Continuation,
    LaneState,
    Operation,
    Phase,
    ToolBatch,
    ToolCall,
)
from service.domain.transition import Transition
from service.store.codec import decode, decode_optional, encode

Conn = AsyncConnection[Any]

_LANE_COLUMNS = (
    "lane_id, revision, tip_id, configuration, message_count, usage_totals,"
    " current_operation_id, last_operation_id, faulted"
)


async def load_lane(
    conn: Conn, lane_id: str, *, lock: bool, with_last_result: bool = False
) -> LaneState | None:
    """The lane's state, or None when it does not exist. ``lock`` takes the lane row lock."""
    cur = await conn.execute(
        f"SELECT {_LANE_COLUMNS} FROM lanes WHERE lane_id = %s{' FOR UPDATE' if lock else ''}",
        (lane_id,),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    (
        _,
        revision,
        tip_id,
        configuration,
        message_count,
        usage_totals,
        current_id,
        last_id,
        faulted,
    ) = row
    cur = await conn.execute(
        "SELECT body FROM inbox WHERE lane_id = %s ORDER BY position", (lane_id,)
    )
    inbox = tuple(decode(snapshot_pb2.QueuedItem, body) for (body,) in await cur.fetchall())
    operation = await _load_operation(conn, lane_id, current_id) if current_id else None
    last_result = None
    if with_last_result and last_id:
        cur = await conn.execute(
            "SELECT result FROM operations WHERE operation_id = %s", (last_id,)
        )
        result_row = await cur.fetchone()
        last_result = decode_optional(
            snapshot_pb2.OperationResult, result_row[0] if result_row else None
        )
    return LaneState(
        lane_id=lane_id,
        revision=revision,
        tip_id=tip_id or "",
        configuration=decode(snapshot_pb2.LaneConfiguration, configuration),
        message_count=message_count,
        usage_totals=decode(messages_pb2.Usage, usage_totals),
        inbox=inbox,
        operation=operation,
        last_operation_id=last_id,
        last_result=last_result,
        faulted=faulted,
    )


async def _load_operation(conn: Conn, lane_id: str, operation_id: str) -> Operation:
    cur = await conn.execute(
        "SELECT kind, started_time, from_tip_id, settings, cancel_requested, phase,"
        " continuation, turn_id, batch_entry_id FROM operations WHERE operation_id = %s",
        (operation_id,),
    )
    row = await cur.fetchone()
    assert row is not None, f"lane {lane_id} names missing operation {operation_id}"
    kind, started, from_tip, settings, cancelled, phase, continuation, turn_id, batch_entry = row
    batch = None
    if batch_entry is not None:
        batch = await _load_batch(conn, lane_id, operation_id, turn_id, batch_entry)
    return Operation(
        operation_id=operation_id,
        kind=kind,
        started_time=started,
        from_tip_id=from_tip or "",
        settings=decode(lane_service_pb2.RunSettings, settings),
        cancel_requested=cancelled,
        phase=Phase(phase),
        continuation=Continuation(continuation),
        turn_id=turn_id,
        batch=batch,
    )


async def _load_batch(
    conn: Conn, lane_id: str, operation_id: str, turn_id: str, entry_id: str
) -> ToolBatch:
    cur = await conn.execute(
        "SELECT body FROM entries WHERE lane_id = %s AND entry_id = %s", (lane_id, entry_id)
    )
    row = await cur.fetchone()
    assistant = messages_pb2.AssistantMessage()
    if row is not None:
        assistant = decode(entries_pb2.Entry, row[0]).message.message.assistant
    cur = await conn.execute(
        "SELECT source_index, tool_call_id, tool_name, result_entry_id, status, replay,"
        " arguments_json, progress, checkpoint, result_message, terminate"
        " FROM tool_calls WHERE operation_id = %s ORDER BY source_index",
        (operation_id,),
    )
    calls = tuple(
        ToolCall(
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
        for (
            index,
            call_id,
            name,
            result_id,
            status,
            replay,
            arguments,
            progress,
            checkpoint,
            result_message,
            terminate,
        ) in await cur.fetchall()
    )
    return ToolBatch(turn_id=turn_id, assistant_entry_id=entry_id, assistant=assistant, calls=calls)


def _optional(message: Any) -> bytes | None:
    return None if message is None else encode(message)


async def insert_lane(conn: Conn, state: LaneState) -> bool:
    """Insert a new lane row (revision 0); False when the lane already exists."""
    cur = await conn.execute(
        "INSERT INTO lanes (lane_id, configuration, usage_totals) VALUES (%s, %s, %s)"
        " ON CONFLICT (lane_id) DO NOTHING",
        (state.lane_id, encode(state.configuration), encode(state.usage_totals)),
    )
    return cur.rowcount == 1


async def write_transition(conn: Conn, before: LaneState, transition: Transition) -> None:
    """Write everything ``transition`` changed relative to ``before``."""
    after = transition.state
    lane_id = after.lane_id
    if after == before and not transition.events:
        return
    await _write_inbox(conn, before, after)
    await _write_operation(conn, before, after)
    if transition.entries:
        await conn.cursor().executemany(
            "INSERT INTO entries (lane_id, entry_id, parent_id, seq, kind, body)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [
                (lane_id, e.id, e.parent_id or None, e.seq, e.WhichOneof("payload"), encode(e))
                for e in transition.entries
            ],
        )
    if transition.usage_rows:
        await conn.cursor().executemany(
            "INSERT INTO usage_rows (lane_id, usage_id, seq, body) VALUES (%s, %s, %s, %s)",
            [(lane_id, row.id, row.seq, encode(row)) for row in transition.usage_rows],
        )
    if transition.events:
        group_end = transition.events[-1].revision
        await conn.cursor().executemany(
            "INSERT INTO events (lane_id, revision, group_end, kind, body, commit_time)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [
                (
                    lane_id,
                    event.revision,
                    group_end,
                    event.WhichOneof("kind"),
                    encode(event),
                    event.commit_time.ToDatetime(tzinfo=UTC),
                )
                for event in transition.events
            ],
        )
    operation = after.operation
    await conn.execute(
        "UPDATE lanes SET revision = %s, tip_id = %s, configuration = %s, message_count = %s,"
        " usage_totals = %s, current_operation_id = %s, last_operation_id = %s, faulted = %s"
        " WHERE lane_id = %s",
        (
            after.revision,
            after.tip_id or None,
            encode(after.configuration),
            after.message_count,
            encode(after.usage_totals),
            operation.operation_id if operation else None,
            after.last_operation_id,
            after.faulted,
            lane_id,
        ),
    )


async def _write_inbox(conn: Conn, before: LaneState, after: LaneState) -> None:
    if before.inbox == after.inbox:
        return
    kept = {item.entry_id for item in after.inbox}
    known = {item.entry_id for item in before.inbox}
    removed = [item.entry_id for item in before.inbox if item.entry_id not in kept]
    if removed:
        await conn.execute(
            "DELETE FROM inbox WHERE lane_id = %s AND entry_id = ANY(%s)", (after.lane_id, removed)
        )
    for item in after.inbox:
        if item.entry_id not in known:
            await conn.execute(
                "WITH pos AS (UPDATE lanes SET next_inbox_position = next_inbox_position + 1"
                " WHERE lane_id = %s RETURNING next_inbox_position)"
                " INSERT INTO inbox (lane_id, entry_id, position, body)"
                " SELECT %s, %s, next_inbox_position, %s FROM pos",
                (after.lane_id, after.lane_id, item.entry_id, encode(item)),
            )


async def _insert_operation(conn: Conn, lane_id: str, operation: Operation) -> None:
    """Insert a new operation row; an id used before (by any lane) is refused."""
    try:
        async with conn.transaction():  # a savepoint: the refusal must not poison the command
            await conn.execute(
                "INSERT INTO operations (operation_id, lane_id, kind, started_time, from_tip_id,"
                " settings, phase, continuation) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    operation.operation_id,
                    lane_id,
                    operation.kind,
                    operation.started_time,
                    operation.from_tip_id or None,
                    encode(operation.settings),
                    operation.phase.value,
                    operation.continuation.value,
                ),
            )
    except UniqueViolation:
        raise AlreadyExists(
            "OPERATION_ID_EXISTS",
            f"operation id {operation.operation_id} was used before",
            operationId=operation.operation_id,
        ) from None


async def _write_operation(conn: Conn, before: LaneState, after: LaneState) -> None:
    old, new = before.operation, after.operation
    if old == new:
        return
    if new is None:
        assert old is not None
        # Terminal clean-up: the result record stays; every per-operation row goes.
        await conn.execute("DELETE FROM tool_calls WHERE operation_id = %s", (old.operation_id,))
        await conn.execute(
            "UPDATE operations SET result = %s, phase = 'ended', turn_id = NULL,"
            " batch_entry_id = NULL WHERE operation_id = %s",
            (_optional(after.last_result), old.operation_id),
        )
        return
    batch = new.batch
    if old is None or old.operation_id != new.operation_id:
        await _insert_operation(conn, after.lane_id, new)
    await conn.execute(
        "UPDATE operations SET cancel_requested = %s, phase = %s, continuation = %s,"
        " turn_id = %s, batch_entry_id = %s WHERE operation_id = %s",
        (
            new.cancel_requested,
            new.phase.value,
            new.continuation.value,
            new.turn_id,
            batch.assistant_entry_id if batch else None,
            new.operation_id,
        ),
    )
    old_calls = {c.source_index: c for c in (old.batch.calls if old and old.batch else ())}
    new_calls = {c.source_index: c for c in (batch.calls if batch else ())}
    gone = [index for index in old_calls if index not in new_calls]
    if gone:
        await conn.execute(
            "DELETE FROM tool_calls WHERE operation_id = %s AND source_index = ANY(%s)",
            (new.operation_id, gone),
        )
    changed = [c for index, c in new_calls.items() if old_calls.get(index) != c]
    if changed:
        assert batch is not None
        await conn.cursor().executemany(
            "INSERT INTO tool_calls (operation_id, source_index, turn_id, tool_call_id, tool_name,"
            " result_entry_id, status, replay, arguments_json, progress, checkpoint,"
            " result_message, terminate)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (operation_id, source_index) DO UPDATE SET status = EXCLUDED.status,"
            " replay = EXCLUDED.replay, arguments_json = EXCLUDED.arguments_json,"
            " progress = EXCLUDED.progress, checkpoint = EXCLUDED.checkpoint,"
            " result_message = EXCLUDED.result_message, terminate = EXCLUDED.terminate",
            [
                (
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


async def load_transcript(conn: Conn, lane_id: str, tip_id: str) -> list[entries_pb2.Entry]:
    """Entries from the newest compaction at or before the tip to the tip, oldest first."""
    if not tip_id:
        return []
    cur = await conn.execute(
        "WITH RECURSIVE chain AS ("
        " SELECT entry_id, parent_id, kind, body, 0 AS depth FROM entries"
        " WHERE lane_id = %(lane)s AND entry_id = %(tip)s"
        " UNION ALL"
        " SELECT e.entry_id, e.parent_id, e.kind, e.body, chain.depth + 1"
        " FROM entries e JOIN chain ON e.lane_id = %(lane)s AND e.entry_id = chain.parent_id"
        " WHERE chain.kind <> 'compaction')"
        " SELECT body FROM chain ORDER BY depth DESC",
        {"lane": lane_id, "tip": tip_id},
    )
    return [decode(entries_pb2.Entry, body) for (body,) in await cur.fetchall()]


async def load_events(
    conn: Conn, lane_id: str, after_revision: int, limit: int
) -> list[tuple[int, int, bytes]]:
    """Up to ``limit`` events after ``after_revision`` as (revision, group_end, body), whole
    groups only (a group is never cut)."""
    cur = await conn.execute(
        "SELECT revision, group_end, body FROM events WHERE lane_id = %s AND revision > %s"
        " AND revision <= (SELECT COALESCE(MAX(group_end), %s) FROM ("
        "   SELECT group_end FROM events WHERE lane_id = %s AND revision > %s"
        "   ORDER BY revision LIMIT %s) AS head)"
        " ORDER BY revision",
        (lane_id, after_revision, after_revision, lane_id, after_revision, limit),
    )
    return [(r, g, bytes(b)) for (r, g, b) in await cur.fetchall()]
