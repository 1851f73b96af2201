"""Writing a transition back as one statement.

A command's writes — the lane row, its inbox, its operation and tool calls, the entries, usage
rows and events it committed, and the answer recorded under its request id — are the difference
between the state the command saw and the state its transition returned. They go to PostgreSQL
as one statement of data-modifying CTEs, every one of them gated on the first: the lane row's
update, which bumps the lane's version only if it still is the version the command saw. So the
statement either writes everything or nothing, and it says which (``written``). That makes it
safe to run on a lane state kept in memory, without a lock and outside a transaction (an
optimistic commit: a stale copy writes nothing and the store retries under the lock), and it
is the same statement the store runs inside a transaction after loading the lane under lock.

A request id or operation id used before fails the statement with a unique violation (the
``requests`` and ``operations`` primary keys): nothing is written then either.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from google.protobuf.message import Message
from psycopg import AsyncConnection

from lane.server.domain.state import LaneState, Operation, ToolBatch
from lane.server.domain.transition import Transition
from lane.server.store.codec import encode
from lane.server.store.event_log import EventGroup
from lane.server.store.lane_ref import LaneRef
from lane.server.store.run_settings import settings_message

Conn = AsyncConnection[Any]


@dataclass(frozen=True)
class RecordedAnswer:
    """An answer to record under a request id in the same statement."""

    request_id: str
    method: str
    digest: bytes
    answer: Message


@dataclass
class CommitStatement:
    """One command's writes as one SQL statement (see the module docstring)."""

    sql: str
    params: dict[str, Any] = field(default_factory=dict)
    #: The events it appends, encoded as written (None: it appends none).
    events: EventGroup | None = None


async def insert_lane(conn: Conn, lane: LaneRef, state: LaneState) -> bool:
    """Insert a new lane row (revision 0); False when the lane already exists."""
    cur = await conn.execute(
        "INSERT INTO lanes (namespace, lane_id, configuration, usage_totals)"
        " VALUES (%(ns)s, %(lane)s, %(configuration)s, %(usage_totals)s)"
        " ON CONFLICT (namespace, lane_id) DO NOTHING",
        {
            **lane.params,
            "configuration": encode(state.configuration),
            "usage_totals": encode(state.usage_totals),
        },
    )
    return cur.rowcount == 1


async def run_commit(conn: Conn, statement: CommitStatement) -> bool:
    """Run ``statement``; True when it wrote (the lane's version was the one expected). Prepared
    on its first use on the connection, as the group committer's are: a commit statement is
    long, and parsing and planning it again costs PostgreSQL about as much as running it
    (bench/README.md, "PostgreSQL's extra CPU under the service")."""
    cur = await conn.execute(statement.sql, statement.params, prepare=True)
    row = await cur.fetchone()
    return row is not None and row[0] == 1


def _rows(
    alias: str,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[object]],
    params: dict[str, Any],
) -> str:
    """A FROM item yielding ``rows`` as ``alias(column, ...)``: one array parameter per column
    unnested, or, for the usual single row, one plain parameter per column (psycopg dumps an
    array parameter at several times the cost of a scalar).

    Arrays go in binary (``%(name)b``): in text, every bytea element is written out as hex and
    escaped (bench/statement_dump.py: 0.53 x the time for a 256-call settlement, 0.71 x for an
    ordinary commit)."""
    names, single, multiple = _source(alias, columns)
    if len(rows) == 1:
        params.update(zip(names, rows[0], strict=True))
        return single
    params.update(zip(names, (list(column) for column in zip(*rows, strict=True)), strict=True))
    return multiple


@functools.cache
def _source(alias: str, columns: Sequence[tuple[str, str]]) -> tuple[tuple[str, ...], str, str]:
    """:func:`_rows`' parameter names and FROM items (one row, several), made once per table."""
    names = tuple(f"{alias}_{column}" for column, _ in columns)
    values = ", ".join(
        f"%({name})s::{sql_type} AS {column}"
        for name, (column, sql_type) in zip(names, columns, strict=True)
    )
    arrays = ", ".join(
        f"%({name})b::{sql_type}[]" for name, (_, sql_type) in zip(names, columns, strict=True)
    )
    listed = ", ".join(column for column, _ in columns)
    return names, f"(SELECT {values}) AS {alias}", f"unnest({arrays}) AS {alias}({listed})"


def _optional(message: Message | None) -> bytes | None:
    return None if message is None else encode(message)


def _changed(old: Message, new: Message) -> bool:
    return old is not new and old != new


def commit_statement(
    lane: LaneRef,
    before: LaneState,
    transition: Transition,
    version: int,
    answers: Sequence[RecordedAnswer] = (),
) -> CommitStatement | None:
    """The statement writing ``transition`` from ``before`` (read at ``version``), or None when
    there is nothing to write."""
    after = transition.state
    if after == before and not transition.events and not answers:
        return None
    params: dict[str, Any] = {**lane.params, "version": version}
    ctes: list[str] = []
    lane_sets = _lane_sets(before, after, params)
    _inbox(before, after, params, ctes, lane_sets)
    _operation(before, after, params, ctes)
    events = _appended(transition, params, ctes)
    for n, recorded in enumerate(answers):
        _answer(n, recorded, params, ctes)
    lane_cte = (
        f"lane AS (UPDATE lanes SET version = version + 1, {', '.join(lane_sets)}"
        " WHERE namespace = %(ns)s AND lane_id = %(lane)s AND version = %(version)s"
        " RETURNING next_inbox_position)"
    )
    sql = "WITH " + ", ".join([lane_cte, *ctes]) + " SELECT count(*) FROM lane"
    return CommitStatement(sql, params, events)


def _lane_sets(before: LaneState, after: LaneState, params: dict[str, Any]) -> list[str]:
    operation = after.operation
    params.update(
        revision=after.revision,
        tip=after.tip_id or None,
        message_count=after.message_count,
        current_operation=operation.operation_id if operation else None,
        last_operation=after.last_operation_id,
        faulted=after.faulted,
    )
    sets = [
        "revision = %(revision)s",
        "tip_id = %(tip)s",
        "message_count = %(message_count)s",
        "current_operation_id = %(current_operation)s",
        "last_operation_id = %(last_operation)s",
        "faulted = %(faulted)s",
    ]
    # The two bodies are written only when they changed: most commands change neither.
    if _changed(before.configuration, after.configuration):
        params["configuration"] = encode(after.configuration)
        sets.append("configuration = %(configuration)s")
    if _changed(before.usage_totals, after.usage_totals):
        params["usage_totals"] = encode(after.usage_totals)
        sets.append("usage_totals = %(usage_totals)s")
    return sets


def _inbox(
    before: LaneState,
    after: LaneState,
    params: dict[str, Any],
    ctes: list[str],
    lane_sets: list[str],
) -> None:
    if before.inbox == after.inbox:
        return
    kept = {item.entry_id for item in after.inbox}
    known = {item.entry_id for item in before.inbox}
    removed = [item.entry_id for item in before.inbox if item.entry_id not in kept]
    added = [item for item in after.inbox if item.entry_id not in known]
    if removed:
        params["inbox_removed"] = removed
        ctes.append(
            "inbox_removed AS (DELETE FROM inbox i USING lane"
            " WHERE i.namespace = %(ns)s AND i.lane_id = %(lane)s"
            " AND i.entry_id = ANY(%(inbox_removed)s::text[]))"
        )
    if added:
        # Positions continue the lane's inbox counter, which the lane update advances.
        params["inbox_added"] = len(added)
        source = _rows(
            "a",
            (("entry_id", "text"), ("body", "bytea"), ("n", "bigint")),
            [(item.entry_id, encode(item), n) for n, item in enumerate(added, 1)],
            params,
        )
        lane_sets.append("next_inbox_position = next_inbox_position + %(inbox_added)s")
        ctes.append(
            "inbox_added AS (INSERT INTO inbox (namespace, lane_id, entry_id, position, body)"
            " SELECT %(ns)s, %(lane)s, a.entry_id,"
            f" lane.next_inbox_position - %(inbox_added)s + a.n, a.body FROM lane, {source})"
        )


_OPERATION_COLUMNS = (
    "cancel_requested, phase, continuation, turn_id, batch_entry_id, lease_token,"
    " lease_holder, lease_expires, recovering, streaming, retry, deferred, attempt"
)


_OPERATION_NAMES = tuple(f"op_{n}" for n in range(len(_OPERATION_COLUMNS.split(","))))
_OPERATION_STARTED = (
    "operation_started AS (INSERT INTO operations (namespace, lane_id, operation_id,"
    f" kind, started_time, from_tip_id, settings, reason, {_OPERATION_COLUMNS})"
    " SELECT %(ns)s, %(lane)s, %(operation)s, %(op_kind)s, %(op_started)s,"
    " %(op_from_tip)s, %(op_settings)s, %(op_reason)s, "
    + ", ".join(f"%({name})s" for name in _OPERATION_NAMES)
    + " FROM lane)"
)
_OPERATION_CHANGED = (
    "operation_changed AS (UPDATE operations o SET "
    + ", ".join(
        f"{column.strip()} = %({name})s"
        for column, name in zip(_OPERATION_COLUMNS.split(","), _OPERATION_NAMES, strict=True)
    )
    + " FROM lane WHERE o.namespace = %(ns)s AND o.lane_id = %(lane)s"
    " AND o.operation_id = %(operation)s)"
)


def _row_fields(operation: Operation | None) -> tuple[object, ...] | None:
    """The columns of the operations row that change while it is open, in
    ``_OPERATION_COLUMNS`` order."""
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


def _operation(
    before: LaneState, after: LaneState, params: dict[str, Any], ctes: list[str]
) -> None:
    old, new = before.operation, after.operation
    if old is None and new is None:
        if after.last_result is not None and after.last_operation_id != before.last_operation_id:
            _ended_operation(after, params, ctes)
        return
    if old == new:
        return
    if new is None:
        assert old is not None
        # Terminal clean-up: the result record stays; every per-operation row goes.
        params["ended_operation"] = old.operation_id
        params["result"] = _optional(after.last_result)
        ctes.append(
            "calls_ended AS (DELETE FROM tool_calls t USING lane"
            " WHERE t.namespace = %(ns)s AND t.lane_id = %(lane)s"
            " AND t.operation_id = %(ended_operation)s)"
        )
        ctes.append(
            "operation_ended AS (UPDATE operations o SET result = %(result)s, phase = 'ended',"
            " turn_id = NULL, batch_entry_id = NULL, lease_holder = NULL, lease_expires = NULL,"
            " recovering = false, streaming = NULL, retry = NULL, deferred = NULL FROM lane"
            " WHERE o.namespace = %(ns)s AND o.lane_id = %(lane)s"
            " AND o.operation_id = %(ended_operation)s)"
        )
        return
    params["operation"] = new.operation_id
    fields = _row_fields(new)
    assert fields is not None
    names = _OPERATION_NAMES
    if old is None or old.operation_id != new.operation_id:
        # A new operation's row is written once, whole (the id is unique in the namespace).
        params.update(zip(names, fields, strict=True))
        params.update(
            op_kind=new.kind,
            op_started=new.started_time,
            op_from_tip=new.from_tip_id or None,
            op_settings=encode(settings_message(new.settings)),
            op_reason=new.reason,
        )
        ctes.append(_OPERATION_STARTED)
        old = None
    elif fields != _row_fields(old):
        params.update(zip(names, fields, strict=True))
        ctes.append(_OPERATION_CHANGED)
    old_batch = old.batch if old is not None else None
    _tool_calls(old_batch, new.batch, params, ctes)


def _tool_calls(
    old: ToolBatch | None, new: ToolBatch | None, params: dict[str, Any], ctes: list[str]
) -> None:
    old_calls = {c.source_index: c for c in (old.calls if old else ())}
    new_calls = {c.source_index: c for c in (new.calls if new else ())}
    gone = [index for index in old_calls if index not in new_calls]
    if gone:
        params["calls_gone"] = gone
        ctes.append(
            "calls_gone AS (DELETE FROM tool_calls t USING lane"
            " WHERE t.namespace = %(ns)s AND t.lane_id = %(lane)s"
            " AND t.operation_id = %(operation)s"
            " AND t.source_index = ANY(%(calls_gone)s::integer[]))"
        )
    changed = [c for index, c in new_calls.items() if old_calls.get(index) != c]
    if not changed:
        return
    assert new is not None
    params["calls_turn"] = new.turn_id
    source = _rows(
        "c",
        _CALL_COLUMNS,
        [
            (
                c.source_index,
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
        params,
    )
    ctes.append(
        "calls_written AS (INSERT INTO tool_calls (namespace, lane_id, operation_id,"
        " source_index, turn_id, tool_call_id, tool_name, result_entry_id, status, replay,"
        " arguments_json, progress, checkpoint, result_message, terminate)"
        " SELECT %(ns)s, %(lane)s, %(operation)s, c.source_index, %(calls_turn)s, c.tool_call_id,"
        " c.tool_name, c.result_entry_id, c.status, c.replay, c.arguments_json, c.progress,"
        f" c.checkpoint, c.result_message, c.terminate FROM lane, {source}"
        " ON CONFLICT (namespace, operation_id, source_index)"
        " DO UPDATE SET status = EXCLUDED.status,"
        " replay = EXCLUDED.replay, arguments_json = EXCLUDED.arguments_json,"
        " progress = EXCLUDED.progress, checkpoint = EXCLUDED.checkpoint,"
        " result_message = EXCLUDED.result_message, terminate = EXCLUDED.terminate)"
    )


_CALL_COLUMNS = (
    ("source_index", "integer"),
    ("tool_call_id", "text"),
    ("tool_name", "text"),
    ("result_entry_id", "text"),
    ("status", "text"),
    ("replay", "smallint"),
    ("arguments_json", "text"),
    ("progress", "bytea"),
    ("checkpoint", "bytea"),
    ("result_message", "bytea"),
    ("terminate", "boolean"),
)


def _ended_operation(state: LaneState, params: dict[str, Any], ctes: list[str]) -> None:
    """The row of an operation opened and ended in one commit (navigation): its record."""
    result = state.last_result
    assert result is not None
    params.update(
        record_id=result.operation_id,
        record_kind=result.kind,
        record_started=result.started_time.ToDatetime(tzinfo=UTC),
        record_from_tip=result.from_tip_id or None,
        record=encode(result),
    )
    ctes.append(
        "operation_recorded AS (INSERT INTO operations (namespace, lane_id, operation_id, kind,"
        " started_time, from_tip_id, settings, phase, continuation, result)"
        " SELECT %(ns)s, %(lane)s, %(record_id)s, %(record_kind)s, %(record_started)s,"
        " %(record_from_tip)s, ''::bytea, 'ended', 'may_finish', %(record)s FROM lane)"
    )


def _appended(transition: Transition, params: dict[str, Any], ctes: list[str]) -> EventGroup | None:
    """The append-only rows: entries, usage rows, events (one statement part each). Returns
    the events as written (encoded once, here), or None when there are none."""
    if transition.entries:
        source = _rows(
            "e",
            (
                ("entry_id", "text"),
                ("parent_id", "text"),
                ("seq", "bigint"),
                ("kind", "text"),
                ("body", "bytea"),
            ),
            [
                (e.id, e.parent_id or None, e.seq, e.WhichOneof("payload"), encode(e))
                for e in transition.entries
            ],
            params,
        )
        ctes.append(
            "entries_added AS (INSERT INTO entries"
            " (namespace, lane_id, entry_id, parent_id, seq, kind, body)"
            " SELECT %(ns)s, %(lane)s, e.entry_id, e.parent_id, e.seq, e.kind, e.body"
            f" FROM lane, {source})"
        )
    if transition.usage_rows:
        source = _rows(
            "u",
            (("usage_id", "text"), ("seq", "bigint"), ("body", "bytea")),
            [(row.id, row.seq, encode(row)) for row in transition.usage_rows],
            params,
        )
        ctes.append(
            "usage_added AS (INSERT INTO usage_rows (namespace, lane_id, usage_id, seq, body)"
            f" SELECT %(ns)s, %(lane)s, u.usage_id, u.seq, u.body FROM lane, {source})"
        )
    if not transition.events:
        return None
    events = transition.events
    bodies = [encode(e) for e in events]
    commit_time = events[0].commit_time.ToDatetime(tzinfo=UTC)
    params.update(group_end=events[-1].revision, commit_time=commit_time)
    source = _rows(
        "v",
        (("revision", "bigint"), ("kind", "text"), ("body", "bytea")),
        [(e.revision, e.WhichOneof("kind"), body) for e, body in zip(events, bodies, strict=True)],
        params,
    )
    ctes.append(
        "events_added AS (INSERT INTO events"
        " (namespace, lane_id, revision, group_end, kind, body, commit_time)"
        " SELECT %(ns)s, %(lane)s, v.revision, %(group_end)s, v.kind, v.body, %(commit_time)s"
        f" FROM lane, {source})"
    )
    return EventGroup(events[0].revision, bodies, commit_time)


def _answer(n: int, recorded: RecordedAnswer, params: dict[str, Any], ctes: list[str]) -> None:
    params.update(
        {
            f"request_{n}": recorded.request_id,
            f"method_{n}": recorded.method,
            f"digest_{n}": recorded.digest,
            f"response_{n}": encode(recorded.answer),
        }
    )
    # A request id answered before fails the statement (its primary key): nothing is written.
    ctes.append(
        f"answer_{n} AS (INSERT INTO requests"
        " (namespace, lane_id, request_id, method, request_hash, response)"
        f" SELECT %(ns)s, %(lane)s, %(request_{n})s, %(method_{n})s, %(digest_{n})s,"
        f" %(response_{n})s FROM lane)"
    )
