"""Refused commands change nothing and emit nothing (docs/contract.md: invariant 5; docs/errors.md).

Three parts:

1. Mutating commands by lane states: the refusal matrix (tests/support/refusal_matrix.py),
   which the domain's unit test checks too, posed to the real service.
2. Malformed requests: INVALID_ARGUMENT with an ErrorInfo reason, nothing stored.
3. Mutated wire bytes (hypothesis): only the documented codes, and capture never faults.

After every refusal the lane's snapshot, its durable rows and its event log are unchanged.
After every allowed command, folding the new events into the previous capture equals a fresh
capture (the Probe). Because refusals change nothing, the cases that expect one share a lane
per state (a failing case drops it); a case that expects success gets a lane of its own.

test_idempotency and test_capture_corruption reuse this module's lane builders.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st
from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.integration.lanes import (
    Probe,
    assistant,
    error_reason,
    new_lane_id,
    result,
    text,
    tool_call,
    user,
)
from tests.support import refusal_matrix
from tests.support.refusal_matrix import Expected, Refusal, params

pytestmark = pytest.mark.asyncio(loop_scope="session")

Code = grpc.StatusCode
STOP = messages_pb2.STOP_REASON_STOP
COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED


# -- lanes in a given state ---------------------------------------------------------------------


@dataclass
class Ctx:
    """A lane and the ids a command against it uses."""

    lane_id: str
    operation_id: str = "op-never-opened"
    turn_id: str = "turn-never-opened"
    call_id: str = "c0"


async def settle(stub: Any, ctx: Ctx, *blocks: messages_pb2.ContentBlock, stop: int = STOP) -> Any:
    return await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            lane_id=ctx.lane_id,
            operation_id=ctx.operation_id,
            turn_id=ctx.turn_id,
            message=assistant(*blocks, stop=stop),
        )
    )


async def start_tool(stub: Any, ctx: Ctx, call_id: str) -> Any:
    return await stub.StartToolCall(
        pb.StartToolCallRequest(
            lane_id=ctx.lane_id,
            operation_id=ctx.operation_id,
            tool_call_id=call_id,
            arguments_json="{}",
        )
    )


async def stage(stub: Any, ctx: Ctx, call_id: str, **outcome: Any) -> Any:
    return await stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            lane_id=ctx.lane_id, operation_id=ctx.operation_id, tool_call_id=call_id, **outcome
        )
    )


async def abort(stub: Any, ctx: Ctx) -> None:
    await stub.AbortOperation(
        pb.AbortOperationRequest(lane_id=ctx.lane_id, operation_id=ctx.operation_id)
    )


UNKNOWN_TOOL = pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL)


async def build(stub: Any, state: str, prefix: str = "refuse") -> Ctx:
    """A fresh lane in ``state``, one of the refusal matrix's (tests/support/refusal_matrix.py).

    The tool states hold one batch: [text, c0, c1] (tool calls at source indexes 1 and 2).
    ``ctx.call_id`` is the call the state is named after.
    """
    ctx = Ctx(new_lane_id(prefix))
    if state == "no_lane":
        return ctx
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=ctx.lane_id))
    if state == "no_op":
        return ctx
    run = await stub.StartRun(pb.StartRunRequest(lane_id=ctx.lane_id, prompt=[user("go")]))
    ctx.operation_id = run.operation_id
    if state == "idle":
        return ctx
    if state == "a_idle":
        await abort(stub, ctx)
        return ctx
    turn = await stub.StartTurn(
        pb.StartTurnRequest(lane_id=ctx.lane_id, operation_id=ctx.operation_id)
    )
    ctx.turn_id = turn.turn_id
    if state in ("turn", "a_turn"):
        if state == "a_turn":
            await abort(stub, ctx)
        return ctx
    if state == "no_calls":
        await settle(stub, ctx, text("let me look"), stop=messages_pb2.STOP_REASON_TOOL_USE)
        return ctx
    if state in ("trunc", "a_trunc"):
        length = messages_pb2.STOP_REASON_LENGTH
        await settle(
            stub, ctx, text("cut"), tool_call("c0", "t", {}), tool_call("c1", "t", {}), stop=length
        )
        if state == "a_trunc":
            await abort(stub, ctx)
        return ctx
    if state in ("may_finish", "ended"):
        await settle(stub, ctx, text("done"))
        if state == "ended":
            await stub.EndRun(
                pb.EndRunRequest(
                    lane_id=ctx.lane_id, operation_id=ctx.operation_id, status=COMPLETED
                )
            )
        return ctx
    await settle(stub, ctx, text("calling"), tool_call("c0", "t", {}), tool_call("c1", "t", {}))
    if state in ("planned", "a_planned"):
        if state == "a_planned":
            await abort(stub, ctx)
        return ctx
    if state == "completed":
        await stage(stub, ctx, "c0", synthetic=UNKNOWN_TOOL)  # placed at once: c0 is first
        return ctx
    await start_tool(stub, ctx, "c0")
    if state == "pending":
        return ctx
    if state == "a_pending":
        await abort(stub, ctx)
        return ctx
    assert state == "blocked", state
    await start_tool(stub, ctx, "c1")
    staged = await stage(stub, ctx, "c1", executed=pb.ExecutedOutcome(result=result("c1 done")))
    assert list(staged.placed_tool_call_ids) == []  # c0 still running blocks it
    ctx.call_id = "c1"
    return ctx


_SHARED: dict[str, Ctx] = {}


async def shared(stub: Any, state: str) -> Ctx:
    """A lane in ``state`` shared by the cases that expect a refusal there: a refusal changes
    nothing (each case asserts it), so the lane stays in ``state``. Use :func:`forget` when a
    case fails, so the next one gets a fresh lane."""
    if state not in _SHARED:
        _SHARED[state] = await build(stub, state, prefix="shared")
    return _SHARED[state]


def forget(ctx: Ctx) -> None:
    for state, known in list(_SHARED.items()):
        if known is ctx:
            del _SHARED[state]


# -- "nothing changed" --------------------------------------------------------------------------

_ROW_QUERIES = {
    "lanes": "SELECT * FROM lanes WHERE lane_id = %(lane)s",
    "entries": "SELECT * FROM entries WHERE lane_id = %(lane)s ORDER BY entry_id",
    "inbox": "SELECT * FROM inbox WHERE lane_id = %(lane)s ORDER BY entry_id",
    "operations": "SELECT * FROM operations WHERE lane_id = %(lane)s ORDER BY operation_id",
    "tool_calls": "SELECT t.* FROM tool_calls t JOIN operations o USING (operation_id)"
    " WHERE o.lane_id = %(lane)s ORDER BY t.operation_id, t.source_index",
    "usage_rows": "SELECT * FROM usage_rows WHERE lane_id = %(lane)s ORDER BY usage_id",
    "events": "SELECT revision, group_end, kind, body FROM events WHERE lane_id = %(lane)s"
    " ORDER BY revision",
    "requests": "SELECT request_id, method, request_hash, response FROM requests"
    " WHERE lane_id = %(lane)s ORDER BY request_id",
}


async def durable_rows(store: Any, lane_id: str) -> dict[str, list[Any]]:
    """Every durable row that belongs to ``lane_id``."""
    rows: dict[str, list[Any]] = {}
    if "\x00" in lane_id:
        return rows  # PostgreSQL text cannot hold NUL: no such lane can have rows
    async with store.pool.connection() as conn:
        for table, query in _ROW_QUERIES.items():
            cur = await conn.execute(query, {"lane": lane_id})
            rows[table] = list(await cur.fetchall())
    return rows


async def event_count(store: Any, lane_id: str) -> int:
    if "\x00" in lane_id:
        return 0  # PostgreSQL text cannot hold NUL: no such lane can have events
    async with store.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM events WHERE lane_id = %s", (lane_id,))
        row = await cur.fetchone()
    assert row is not None
    count: int = row[0]
    return count


@dataclass
class Picture:
    """What a lane looks like from outside (snapshot) and inside (rows, event count)."""

    snapshot: snapshot_pb2.LaneSnapshot | None
    events: int
    rows: dict[str, list[Any]]


async def picture(stub: Any, store: Any, lane_id: str) -> Picture:
    snapshot = None
    try:
        response = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
        snapshot = response.snapshot
    except grpc.aio.AioRpcError as error:
        assert error.code() in (Code.NOT_FOUND, Code.INVALID_ARGUMENT), error
    return Picture(snapshot, await event_count(store, lane_id), await durable_rows(store, lane_id))


def assert_unchanged(before: Picture, after: Picture, what: str) -> None:
    if before.snapshot is not None:
        assert after.snapshot is not None, f"{what}: the lane vanished"
        assert after.snapshot.revision == before.snapshot.revision, f"{what}: revision moved"
        assert after.snapshot == before.snapshot, f"{what}: the snapshot changed"
    else:
        assert after.snapshot is None, f"{what}: a lane appeared"
    assert after.events == before.events, f"{what}: events were appended"
    for table, rows in before.rows.items():
        assert after.rows[table] == rows, f"{what}: {table} rows changed"


async def call(stub: Any, method: str, request: Message) -> Any:
    """Call ``method``; WatchLane returns its first message."""
    if method == "WatchLane":
        stream = stub.WatchLane(request)
        try:
            async for response in stream:
                return response
        finally:
            stream.cancel()
        return None
    return await getattr(stub, method)(request)


# -- 1. commands x states -----------------------------------------------------------------------

#: The matrix's states this module builds by commands (ready, a_ready and compaction only the
#: domain's unit test builds).
STATES = (
    "no_lane",
    "no_op",
    "idle",
    "turn",
    "may_finish",
    "planned",
    "pending",
    "blocked",
    "completed",
    "a_idle",
    "a_turn",
    "a_planned",
    "a_pending",
    "ended",
    "trunc",
    "a_trunc",
    "no_calls",
)

WRONG_OPERATION = "op-wrong"
WRONG_TURN = "turn-wrong"
UNKNOWN_CALL = "no-such-call"


def _op(ctx: Ctx, wrong: bool) -> str:
    return WRONG_OPERATION if wrong else ctx.operation_id


def _start_run(ctx: Ctx) -> Message:
    return pb.StartRunRequest(lane_id=ctx.lane_id, prompt=[user("again")])


def _abort(ctx: Ctx, wrong: bool = False) -> Message:
    return pb.AbortOperationRequest(lane_id=ctx.lane_id, operation_id=_op(ctx, wrong))


def _end_run(ctx: Ctx, wrong: bool = False) -> Message:
    return pb.EndRunRequest(lane_id=ctx.lane_id, operation_id=_op(ctx, wrong), status=COMPLETED)


def _start_turn(ctx: Ctx, wrong: bool = False) -> Message:
    return pb.StartTurnRequest(lane_id=ctx.lane_id, operation_id=_op(ctx, wrong))


def _settle(ctx: Ctx, wrong: bool = False, turn: str | None = None) -> Message:
    return pb.SettleAssistantMessageRequest(
        lane_id=ctx.lane_id,
        operation_id=_op(ctx, wrong),
        turn_id=turn or ctx.turn_id,
        message=assistant(text("hello"), stop=STOP),
    )


def _start_tool(ctx: Ctx, wrong: bool = False, call_id: str | None = None) -> Message:
    return pb.StartToolCallRequest(
        lane_id=ctx.lane_id,
        operation_id=_op(ctx, wrong),
        tool_call_id=call_id or ctx.call_id,
        arguments_json='{"effective": true}',
    )


def _update_tool(ctx: Ctx, wrong: bool = False, call_id: str | None = None) -> Message:
    return pb.UpdateToolCallRequest(
        lane_id=ctx.lane_id,
        operation_id=_op(ctx, wrong),
        tool_call_id=call_id or ctx.call_id,
        partial_result=result("progress"),
    )


def _stage(ctx: Ctx, wrong: bool = False, call_id: str | None = None, **outcome: Any) -> Message:
    if not outcome:
        outcome = {"executed": pb.ExecutedOutcome(result=result("final"))}
    return pb.StageToolOutcomeRequest(
        lane_id=ctx.lane_id,
        operation_id=_op(ctx, wrong),
        tool_call_id=call_id or ctx.call_id,
        **outcome,
    )


def _synthetic(cause: int) -> dict[str, Any]:
    return {"synthetic": pb.SyntheticOutcome(cause=cause)}  # type: ignore[arg-type]


COMMANDS: dict[str, tuple[str, Callable[[Ctx], Message]]] = {
    "start_run": ("StartRun", _start_run),
    "abort": ("AbortOperation", _abort),
    "end_completed": ("EndRun", _end_run),
    "start_turn": ("StartTurn", _start_turn),
    "settle": ("SettleAssistantMessage", _settle),
    "start_tool": ("StartToolCall", _start_tool),
    "update_tool": ("UpdateToolCall", _update_tool),
    "stage_executed": ("StageToolOutcome", _stage),
    "stage_unknown_tool": (
        "StageToolOutcome",
        lambda c: _stage(c, **_synthetic(pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL)),
    ),
    "stage_cancelled": (
        "StageToolOutcome",
        lambda c: _stage(c, **_synthetic(pb.SYNTHETIC_CAUSE_CANCELLED)),
    ),
    "stage_interrupted": (
        "StageToolOutcome",
        lambda c: _stage(c, **_synthetic(pb.SYNTHETIC_CAUSE_INTERRUPTED)),
    ),
    "stage_truncated": (
        "StageToolOutcome",
        lambda c: _stage(c, **_synthetic(pb.SYNTHETIC_CAUSE_TRUNCATED)),
    ),
    "abort_wrong_operation": ("AbortOperation", lambda c: _abort(c, wrong=True)),
    "end_wrong_operation": ("EndRun", lambda c: _end_run(c, wrong=True)),
    "start_turn_wrong_operation": ("StartTurn", lambda c: _start_turn(c, wrong=True)),
    "settle_wrong_operation": ("SettleAssistantMessage", lambda c: _settle(c, wrong=True)),
    "start_tool_wrong_operation": ("StartToolCall", lambda c: _start_tool(c, wrong=True)),
    "update_tool_wrong_operation": ("UpdateToolCall", lambda c: _update_tool(c, wrong=True)),
    "stage_wrong_operation": ("StageToolOutcome", lambda c: _stage(c, wrong=True)),
    "settle_wrong_turn": ("SettleAssistantMessage", lambda c: _settle(c, turn=WRONG_TURN)),
    "start_unknown_call": ("StartToolCall", lambda c: _start_tool(c, call_id=UNKNOWN_CALL)),
    "update_unknown_call": ("UpdateToolCall", lambda c: _update_tool(c, call_id=UNKNOWN_CALL)),
    "stage_unknown_call": ("StageToolOutcome", lambda c: _stage(c, call_id=UNKNOWN_CALL)),
}


async def test_the_matrix_has_every_command_and_state_built_here() -> None:
    assert set(COMMANDS) <= set(refusal_matrix.COMMANDS)
    assert set(STATES) <= set(refusal_matrix.STATES)


def _names(refusals: frozenset[Refusal]) -> list[Refusal]:
    return sorted(refusals)


@pytest.mark.parametrize(("command", "state", "expected"), params(set(COMMANDS), set(STATES)))
async def test_command_in_state(
    lane_stub, store, command: str, state: str, expected: Expected
) -> None:
    # An allowed command moves its lane on: it gets a lane of its own.
    ctx = await build(lane_stub, state) if expected.ok else await shared(lane_stub, state)
    try:
        await _run_case(lane_stub, store, ctx, state, command, expected)
    except BaseException:
        forget(ctx)
        raise


async def _run_case(
    lane_stub: Any, store: Any, ctx: Ctx, state: str, command: str, expected: Expected
) -> None:
    method, make = COMMANDS[command]
    request = make(ctx)
    before = await picture(lane_stub, store, ctx.lane_id)
    try:
        answer = await call(lane_stub, method, request)
    except grpc.aio.AioRpcError as error:
        got = (error.code().name, error_reason(error))
        assert not expected.ok, f"{command} in {state} must succeed, got {got}"
        assert got in expected.refusals, (
            f"{command} in {state}: got {got}, expected one of {_names(expected.refusals)}:"
            f" {error.details()}"
        )
        assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), command)
        return
    assert expected.ok, f"{command} in {state} succeeded; expected {_names(expected.refusals)}"
    assert before.snapshot is not None
    probe = Probe(lane_stub, ctx.lane_id)
    probe.snapshot = before.snapshot
    await probe.check()  # fold == capture after the allowed command
    if command == "abort" and state.startswith("a_"):
        # Asking again is answered, not refused, and changes nothing.
        assert not answer.newly_requested
        assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), command)
    else:
        assert probe.snapshot.revision > before.snapshot.revision
    if command == "end_completed" and state.startswith("a_"):
        assert answer.result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED


async def test_end_run_completed_after_a_tool_batch_needs_the_assistant(lane_stub, store) -> None:
    # After a batch whose results do not all terminate, the run needs an assistant step
    # (continuation need_assistant): it is not at a finishing point, so it cannot complete
    # (docs/contract.md, Tool calls). FAILED and ABORTED stay possible.
    ctx = await build(lane_stub, "completed")
    await stage(lane_stub, ctx, "c1", synthetic=UNKNOWN_TOOL)  # the batch completes
    before = await picture(lane_stub, store, ctx.lane_id)
    assert before.snapshot is not None and before.snapshot.operation.running_tools == []
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await lane_stub.EndRun(_end_run(ctx))
    assert refused_error.value.code() == Code.FAILED_PRECONDITION
    assert error_reason(refused_error.value)
    assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), "EndRun")


async def test_operation_id_of_another_lanes_open_run_is_refused(lane_stub, store) -> None:
    # Operation ids identify operations; StartRun with an id already in use must not succeed
    # (it would share, and overwrite, the other lane's operation).
    owner = await build(lane_stub, "planned")
    other = await build(lane_stub, "no_op")
    owner_before = await picture(lane_stub, store, owner.lane_id)
    other_before = await picture(lane_stub, store, other.lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await lane_stub.StartRun(
            pb.StartRunRequest(
                lane_id=other.lane_id, operation_id=owner.operation_id, prompt=[user("mine")]
            )
        )
    assert refused_error.value.code() in (Code.ALREADY_EXISTS, Code.FAILED_PRECONDITION)
    assert error_reason(refused_error.value)
    assert_unchanged(owner_before, await picture(lane_stub, store, owner.lane_id), "owner")
    assert_unchanged(other_before, await picture(lane_stub, store, other.lane_id), "other")
    # The owner's batch is intact: its planned call still starts.
    await start_tool(lane_stub, owner, "c0")


async def test_operation_id_of_an_ended_run_is_refused(lane_stub, store) -> None:
    ctx = await build(lane_stub, "ended")
    before = await picture(lane_stub, store, ctx.lane_id)
    assert before.snapshot is not None and before.snapshot.last_result.operation_id
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await lane_stub.StartRun(
            pb.StartRunRequest(
                lane_id=ctx.lane_id, operation_id=ctx.operation_id, prompt=[user("again")]
            )
        )
    assert refused_error.value.code() in (Code.ALREADY_EXISTS, Code.FAILED_PRECONDITION)
    assert error_reason(refused_error.value)
    assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), "StartRun")


# -- 2. malformed requests ----------------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    """A malformed request: sent to a lane in ``state``; refused INVALID_ARGUMENT."""

    state: str
    method: str
    make: Callable[[Ctx], Message]
    reasons: frozenset[str]


def malformed(state: str, method: str, make: Callable[[Ctx], Message], *reasons: str) -> Malformed:
    return Malformed(state, method, make, frozenset(reasons))


async def assert_malformed(stub: Any, store: Any, case: Malformed, ctx: Ctx) -> None:
    request = case.make(ctx)
    before = await picture(stub, store, ctx.lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await call(stub, case.method, request)
    error = refused_error.value
    reason = error_reason(error)
    assert error.code() == Code.INVALID_ARGUMENT, (
        f"{case.method}: {error.code().name} {reason}: {error.details()}"
    )
    assert reason in case.reasons, f"{case.method}: reason {reason}, expected {case.reasons}"
    assert_unchanged(before, await picture(stub, store, ctx.lane_id), case.method)


# Identifiers: 1-128 bytes of printable text without surrounding spaces.
BAD_IDS = {
    "empty": ("", "MISSING_FIELD"),
    "129_ascii_bytes": ("x" * 129, "INVALID_ID"),
    "129_utf8_bytes": ("é" * 64 + "x", "INVALID_ID"),
    "nul": ("a\x00b", "INVALID_ID"),
    "newline": ("a\nb", "INVALID_ID"),
    "tab": ("a\tb", "INVALID_ID"),
    "delete": ("ab\x7f", "INVALID_ID"),
    "zero_width_space": ("a\u200bb", "INVALID_ID"),
    "leading_space": (" ab", "INVALID_ID"),
    "trailing_space": ("ab ", "INVALID_ID"),
}


def _with_lane(lane_id: str) -> dict[str, Callable[[], Message]]:
    ctx = Ctx(lane_id, operation_id="op", turn_id="turn")
    return {
        "CreateLane": lambda: pb.CreateLaneRequest(lane_id=lane_id),
        "GetLaneSnapshot": lambda: pb.GetLaneSnapshotRequest(lane_id=lane_id),
        "WatchLane": lambda: pb.WatchLaneRequest(lane_id=lane_id),
        "UpdateLaneConfig": lambda: pb.UpdateLaneConfigRequest(
            lane_id=lane_id, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
        ),
        "EnqueueMessage": lambda: pb.EnqueueMessageRequest(
            lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user("m")
        ),
        "StartRun": lambda: _start_run(ctx),
        "AbortOperation": lambda: _abort(ctx),
        "EndRun": lambda: _end_run(ctx),
        "StartTurn": lambda: _start_turn(ctx),
        "SettleAssistantMessage": lambda: _settle(ctx),
        "RecordUsage": lambda: pb.RecordUsageRequest(
            lane_id=lane_id, usage=messages_pb2.Usage(input=1)
        ),
        "StartToolCall": lambda: _start_tool(ctx),
        "UpdateToolCall": lambda: _update_tool(ctx),
        "StageToolOutcome": lambda: _stage(ctx),
    }


LANE_ID_CASES = [
    pytest.param(method, name, id=f"{method}-{name}")
    for method in _with_lane("x")
    for name in BAD_IDS
]


@pytest.mark.parametrize(("method", "bad"), LANE_ID_CASES)
async def test_malformed_lane_id(lane_stub, store, method: str, bad: str) -> None:
    lane_id, reason = BAD_IDS[bad]
    before = await picture(lane_stub, store, lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await call(lane_stub, method, _with_lane(lane_id)[method]())
    assert refused_error.value.code() == Code.INVALID_ARGUMENT, refused_error.value.details()
    assert error_reason(refused_error.value) == reason
    assert_unchanged(before, await picture(lane_stub, store, lane_id), method)


async def test_lane_id_of_exactly_128_bytes_is_accepted(lane_stub) -> None:
    lane_id = "é" * 64  # 128 bytes of UTF-8
    created = await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    snapshot = await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert snapshot.snapshot.lane_id == lane_id and snapshot.snapshot.revision == created.revision


LONG = "x" * 129

OTHER_ID_CASES = {
    "start_run_operation_id": malformed(
        "no_op",
        "StartRun",
        lambda c: pb.StartRunRequest(lane_id=c.lane_id, operation_id=LONG, prompt=[user("p")]),
        "INVALID_ID",
    ),
    "abort_without_operation_id": malformed(
        "idle",
        "AbortOperation",
        lambda c: pb.AbortOperationRequest(lane_id=c.lane_id),
        "MISSING_FIELD",
    ),
    "end_run_without_operation_id": malformed(
        "may_finish",
        "EndRun",
        lambda c: pb.EndRunRequest(lane_id=c.lane_id, status=COMPLETED),
        "MISSING_FIELD",
    ),
    "start_turn_turn_id": malformed(
        "idle",
        "StartTurn",
        lambda c: pb.StartTurnRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, turn_id="t\n1"
        ),
        "INVALID_ID",
    ),
    "settle_without_turn_id": malformed(
        "turn", "SettleAssistantMessage", lambda c: _settle(c, turn=" "), "INVALID_ID"
    ),
    "start_tool_without_call_id": malformed(
        "planned",
        "StartToolCall",
        lambda c: pb.StartToolCallRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, arguments_json="{}"
        ),
        "MISSING_FIELD",
    ),
    "stage_call_id_too_long": malformed(
        "pending", "StageToolOutcome", lambda c: _stage(c, call_id=LONG), "INVALID_ID"
    ),
    "record_usage_entry_id": malformed(
        "no_op",
        "RecordUsage",
        lambda c: pb.RecordUsageRequest(
            lane_id=c.lane_id, usage=messages_pb2.Usage(input=1), entry_id="e\x00"
        ),
        "INVALID_ID",
    ),
    "request_id_too_long": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: pb.EnqueueMessageRequest(
            lane_id=c.lane_id,
            kind=snapshot_pb2.QUEUE_KIND_STEER,
            message=user("m"),
            request_id=LONG,
        ),
        "INVALID_ID",
    ),
    "request_id_non_printable": malformed(
        "idle",
        "StartTurn",
        lambda c: pb.StartTurnRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, request_id="r\x01"
        ),
        "INVALID_ID",
    ),
    "create_lane_request_id": malformed(
        "no_lane",
        "CreateLane",
        lambda c: pb.CreateLaneRequest(lane_id=c.lane_id, request_id=" r"),
        "INVALID_ID",
    ),
    "tool_call_block_without_id": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _settle_blocks(c, tool_call("", "t", {})),
        "MISSING_FIELD",
    ),
    "tool_call_block_id_non_printable": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _settle_blocks(c, tool_call("a\nb", "t", {})),
        "INVALID_ID",
    ),
    "tool_call_block_without_name": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _settle_blocks(c, tool_call("c0", "", {})),
        "MISSING_FIELD",
    ),
}


def _settle_blocks(
    ctx: Ctx, *blocks: messages_pb2.ContentBlock, stop: int = messages_pb2.STOP_REASON_TOOL_USE
) -> Message:
    return pb.SettleAssistantMessageRequest(
        lane_id=ctx.lane_id,
        operation_id=ctx.operation_id,
        turn_id=ctx.turn_id,
        message=assistant(text("calling"), *blocks, stop=stop),
    )


@pytest.mark.parametrize("name", OTHER_ID_CASES)
async def test_malformed_identifier(lane_stub, store, name: str) -> None:
    case = OTHER_ID_CASES[name]
    ctx = await shared(lane_stub, case.state)
    try:
        await assert_malformed(lane_stub, store, case, ctx)
    except BaseException:
        forget(ctx)
        raise


# JSON text fields: strict JSON (RFC 8259), no NaN/Infinity, nothing after the value.
BAD_JSON = {
    "nan": "NaN",
    "nan_member": '{"a": NaN}',
    "infinity_member": '{"a": -Infinity}',
    "trailing_garbage": '{"a": 1} x',
    "two_values": "{} {}",
    "trailing_comma": '{"a": 1,}',
    "single_quotes": "{'a': 1}",
    "empty": "",
    "whitespace_only": "  ",
    "unclosed": '{"a": [1, 2',
    "deeply_unclosed": "[" * 100_000,
    "bare_word": "undefined",
    "raw_control_character": '{"a": "x\ny"}',
    "comment": '{"a": 1 /* c */}',
}
NOT_AN_OBJECT = {
    "array": "[1]",
    "number": "1",
    "string": '"s"',
    "null": "null",
    "true": "true",
}


def _custom(data_json: str) -> messages_pb2.AgentMessage:
    return messages_pb2.AgentMessage(
        custom=messages_pb2.CustomMessage(role="note", data_json=data_json)
    )


def _settle_with(ctx: Ctx, **fields: str) -> Message:
    message = assistant(text("thinking"), stop=STOP)
    for name, value in fields.items():
        setattr(message, name, value)
    return pb.SettleAssistantMessageRequest(
        lane_id=ctx.lane_id, operation_id=ctx.operation_id, turn_id=ctx.turn_id, message=message
    )


# name -> (state, method, build(ctx, json_text), must be an object)
JSON_FIELDS: dict[str, tuple[str, str, Callable[[Ctx, str], Message], bool]] = {
    "StartToolCall.arguments_json": (
        "planned",
        "StartToolCall",
        lambda c, j: pb.StartToolCallRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, tool_call_id="c0", arguments_json=j
        ),
        True,
    ),
    "Settle.tool_call.arguments_json": (
        "turn",
        "SettleAssistantMessage",
        lambda c, j: _settle_blocks(c, tool_call("c0", "t", j)),
        True,
    ),
    "Settle.diagnostics_json": (
        "turn",
        "SettleAssistantMessage",
        lambda c, j: _settle_with(c, diagnostics_json=j),
        False,
    ),
    "Stage.executed.result.details_json": (
        "pending",
        "StageToolOutcome",
        lambda c, j: _stage(c, executed=pb.ExecutedOutcome(result=result("r", details_json=j))),
        False,
    ),
    "UpdateToolCall.partial_result.details_json": (
        "pending",
        "UpdateToolCall",
        lambda c, j: pb.UpdateToolCallRequest(
            lane_id=c.lane_id,
            operation_id=c.operation_id,
            tool_call_id="c0",
            partial_result=result("p", details_json=j),
        ),
        False,
    ),
    "Enqueue.write.custom.data_json": (
        "no_op",
        "EnqueueMessage",
        lambda c, j: _enqueue_write(c, j),
        False,
    ),
    "Enqueue.follow_up.custom_message.data_json": (
        "no_op",
        "EnqueueMessage",
        lambda c, j: pb.EnqueueMessageRequest(
            lane_id=c.lane_id, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=_custom(j)
        ),
        False,
    ),
    "StartRun.prompt.custom.data_json": (
        "no_op",
        "StartRun",
        lambda c, j: pb.StartRunRequest(lane_id=c.lane_id, prompt=[user("p"), _custom(j)]),
        False,
    ),
    "EndRun.error.details_json": (
        "may_finish",
        "EndRun",
        lambda c, j: pb.EndRunRequest(
            lane_id=c.lane_id,
            operation_id=c.operation_id,
            status=FAILED,
            error=snapshot_pb2.OperationError(code="boom", message="m", details_json=j),
        ),
        False,
    ),
}


def _enqueue_write(ctx: Ctx, data_json: str) -> Message:
    return pb.EnqueueMessageRequest(
        lane_id=ctx.lane_id,
        kind=snapshot_pb2.QUEUE_KIND_WRITE,
        custom=entries_pb2.CustomEntry(custom_type="note", data_json=data_json),
    )


JSON_CASES = [
    pytest.param(field_name, bad, id=f"{field_name}-{bad}")
    for field_name, (_, _, _, needs_object) in JSON_FIELDS.items()
    for bad in [*BAD_JSON, *(NOT_AN_OBJECT if needs_object else {})]
]


@pytest.mark.parametrize(("field_name", "bad"), JSON_CASES)
async def test_malformed_json(lane_stub, store, field_name: str, bad: str) -> None:
    state, method, make, _ = JSON_FIELDS[field_name]
    text_value = BAD_JSON.get(bad, NOT_AN_OBJECT.get(bad, ""))
    case = malformed(state, method, lambda c: make(c, text_value), "INVALID_JSON")
    ctx = await shared(lane_stub, state)
    try:
        await assert_malformed(lane_stub, store, case, ctx)
    except BaseException:
        forget(ctx)
        raise


@pytest.mark.parametrize("field_name", JSON_FIELDS)
async def test_valid_json_is_kept_byte_for_byte(lane_stub, field_name: str) -> None:
    # The control case for test_malformed_json: the same request with valid JSON succeeds.
    state, method, make, _ = JSON_FIELDS[field_name]
    ctx = await build(lane_stub, state)
    valid = '{"n": 18446744073709551623, "f": 1.0, "s": "\\u00e9"}'
    probe = Probe(lane_stub, ctx.lane_id)
    await probe.start()
    await getattr(lane_stub, method)(make(ctx, valid))
    events = await probe.check()
    # The text is stored and streamed byte for byte (the big integer survives).
    assert any(valid.encode() in e.SerializeToString() for e in events)
    assert json.loads(valid)["n"] == 2**64 + 7


def _set(message: Message, path: str, value: int) -> Message:
    """Set an (enum) field by dotted path to a raw int, bypassing enum checks."""
    target: Any = message
    *parents, name = path.split(".")
    for parent in parents:
        target = getattr(target, parent)
    setattr(target, name, value)
    return message


ENUM_CASES = {
    "enqueue_kind_99": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: _set(pb.EnqueueMessageRequest(lane_id=c.lane_id, message=user("m")), "kind", 99),
        "UNKNOWN_ENUM_VALUE",
    ),
    "enqueue_kind_negative": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: _set(pb.EnqueueMessageRequest(lane_id=c.lane_id, message=user("m")), "kind", -1),
        "UNKNOWN_ENUM_VALUE",
    ),
    "start_tool_replay_42": malformed(
        "planned",
        "StartToolCall",
        lambda c: _set(_start_tool(c), "replay", 42),
        "UNKNOWN_ENUM_VALUE",
    ),
    "start_run_tool_execution_9": malformed(
        "no_op",
        "StartRun",
        lambda c: _set(_start_run(c), "settings.tool_execution", 9),
        "UNKNOWN_ENUM_VALUE",
    ),
    "start_run_steering_mode_9": malformed(
        "no_op",
        "StartRun",
        lambda c: _set(_start_run(c), "settings.steering_mode", 9),
        "UNKNOWN_ENUM_VALUE",
    ),
    "start_run_follow_up_mode_9": malformed(
        "no_op",
        "StartRun",
        lambda c: _set(_start_run(c), "settings.follow_up_mode", 9),
        "UNKNOWN_ENUM_VALUE",
    ),
    "end_run_status_42": malformed(
        "may_finish",
        "EndRun",
        lambda c: _set(_end_run(c), "status", 42),
        "UNKNOWN_ENUM_VALUE",
        "INVALID_STATUS",
    ),
    "settle_stop_reason_99": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _set(_settle(c), "message.stop_reason", 99),
        "UNKNOWN_ENUM_VALUE",
        "INVALID_STOP_REASON",
    ),
    "stage_synthetic_cause_99": malformed(
        "planned",
        "StageToolOutcome",
        lambda c: _stage(c, synthetic=_set(pb.SyntheticOutcome(message="m"), "cause", 99)),
        "UNKNOWN_ENUM_VALUE",
    ),
    "update_config_thinking_level_99": malformed(
        "no_op",
        "UpdateLaneConfig",
        lambda c: _set(pb.UpdateLaneConfigRequest(lane_id=c.lane_id), "thinking_level", 99),
        "UNKNOWN_ENUM_VALUE",
    ),
    "create_lane_thinking_level_99": malformed(
        "no_lane",
        "CreateLane",
        lambda c: _set(pb.CreateLaneRequest(lane_id=c.lane_id), "configuration.thinking_level", 99),
        "UNKNOWN_ENUM_VALUE",
    ),
}

OTHER_MALFORMED = {
    "settle_duplicate_tool_call_ids": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _settle_blocks(c, tool_call("c0", "t", {}), tool_call("c0", "u", {})),
        "DUPLICATE_TOOL_CALL_ID",
    ),
    "settle_stop_reason_pending": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _set(_settle(c), "message.stop_reason", messages_pb2.STOP_REASON_PENDING),
        "INVALID_STOP_REASON",
    ),
    "settle_stop_reason_unspecified": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: _set(_settle(c), "message.stop_reason", messages_pb2.STOP_REASON_UNSPECIFIED),
        "INVALID_STOP_REASON",
    ),
    "settle_without_message": malformed(
        "turn",
        "SettleAssistantMessage",
        lambda c: pb.SettleAssistantMessageRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, turn_id=c.turn_id
        ),
        "MISSING_FIELD",
    ),
    "start_run_assistant_prompt": malformed(
        "no_op",
        "StartRun",
        lambda c: pb.StartRunRequest(
            lane_id=c.lane_id,
            prompt=[messages_pb2.AgentMessage(assistant=assistant(text("hi"), stop=STOP))],
        ),
        "INVALID_MESSAGE",
    ),
    "start_run_tool_result_prompt": malformed(
        "no_op",
        "StartRun",
        lambda c: pb.StartRunRequest(
            lane_id=c.lane_id,
            prompt=[
                user("ok"),
                messages_pb2.AgentMessage(
                    tool_result=messages_pb2.ToolResultMessage(tool_call_id="c", tool_name="t")
                ),
            ],
        ),
        "INVALID_MESSAGE",
    ),
    "start_run_empty_message_prompt": malformed(
        "no_op",
        "StartRun",
        lambda c: pb.StartRunRequest(lane_id=c.lane_id, prompt=[messages_pb2.AgentMessage()]),
        "INVALID_MESSAGE",
    ),
    "start_run_no_prompt_empty_inbox": malformed(
        "no_op", "StartRun", lambda c: pb.StartRunRequest(lane_id=c.lane_id), "EMPTY_PROMPT"
    ),
    "end_run_failed_without_error": malformed(
        "may_finish",
        "EndRun",
        lambda c: pb.EndRunRequest(lane_id=c.lane_id, operation_id=c.operation_id, status=FAILED),
        "INVALID_ERROR",
    ),
    "end_run_completed_with_error": malformed(
        "may_finish",
        "EndRun",
        lambda c: pb.EndRunRequest(
            lane_id=c.lane_id,
            operation_id=c.operation_id,
            status=COMPLETED,
            error=snapshot_pb2.OperationError(code="x", message="y"),
        ),
        "INVALID_ERROR",
    ),
    "end_run_failed_error_without_code": malformed(
        "may_finish",
        "EndRun",
        lambda c: pb.EndRunRequest(
            lane_id=c.lane_id,
            operation_id=c.operation_id,
            status=FAILED,
            error=snapshot_pb2.OperationError(message="no code"),
        ),
        "MISSING_FIELD",
    ),
    "end_run_status_unspecified": malformed(
        "may_finish",
        "EndRun",
        lambda c: pb.EndRunRequest(lane_id=c.lane_id, operation_id=c.operation_id),
        "INVALID_STATUS",
    ),
    "end_run_status_declined": malformed(
        "may_finish",
        "EndRun",
        lambda c: pb.EndRunRequest(
            lane_id=c.lane_id,
            operation_id=c.operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_DECLINED,
        ),
        "INVALID_STATUS",
    ),
    "stage_without_outcome": malformed(
        "pending",
        "StageToolOutcome",
        lambda c: pb.StageToolOutcomeRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, tool_call_id="c0"
        ),
        "MISSING_FIELD",
    ),
    "stage_executed_without_result": malformed(
        "pending",
        "StageToolOutcome",
        lambda c: _stage(c, executed=pb.ExecutedOutcome(is_error=True)),
        "MISSING_FIELD",
    ),
    "stage_synthetic_without_cause": malformed(
        "planned",
        "StageToolOutcome",
        lambda c: _stage(c, synthetic=pb.SyntheticOutcome(message="why")),
        "MISSING_FIELD",
    ),
    "stage_denied_without_message": malformed(
        "planned",
        "StageToolOutcome",
        lambda c: _stage(c, **_synthetic(pb.SYNTHETIC_CAUSE_DENIED)),
        "MISSING_FIELD",
    ),
    "stage_invalid_arguments_without_message": malformed(
        "planned",
        "StageToolOutcome",
        lambda c: _stage(c, **_synthetic(pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS)),
        "MISSING_FIELD",
    ),
    "update_tool_without_partial_result": malformed(
        "pending",
        "UpdateToolCall",
        lambda c: pb.UpdateToolCallRequest(
            lane_id=c.lane_id, operation_id=c.operation_id, tool_call_id="c0"
        ),
        "MISSING_FIELD",
    ),
    "record_usage_without_usage": malformed(
        "no_op", "RecordUsage", lambda c: pb.RecordUsageRequest(lane_id=c.lane_id), "MISSING_FIELD"
    ),
    "enqueue_without_kind": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: pb.EnqueueMessageRequest(lane_id=c.lane_id, message=user("m")),
        "MISSING_FIELD",
    ),
    "enqueue_steer_without_message": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: pb.EnqueueMessageRequest(lane_id=c.lane_id, kind=snapshot_pb2.QUEUE_KIND_STEER),
        "INVALID_MESSAGE",
    ),
    "enqueue_steer_assistant_message": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: pb.EnqueueMessageRequest(
            lane_id=c.lane_id,
            kind=snapshot_pb2.QUEUE_KIND_STEER,
            message=messages_pb2.AgentMessage(assistant=assistant(text("x"), stop=STOP)),
        ),
        "INVALID_MESSAGE",
    ),
    "enqueue_write_without_custom": malformed(
        "no_op",
        "EnqueueMessage",
        lambda c: pb.EnqueueMessageRequest(
            lane_id=c.lane_id, kind=snapshot_pb2.QUEUE_KIND_WRITE, message=user("m")
        ),
        "INVALID_MESSAGE",
    ),
    "enqueue_write_without_custom_type": malformed(
        "no_op", "EnqueueMessage", lambda c: _write_without_type(c), "MISSING_FIELD"
    ),
}


def _write_without_type(ctx: Ctx) -> Message:
    return pb.EnqueueMessageRequest(
        lane_id=ctx.lane_id,
        kind=snapshot_pb2.QUEUE_KIND_WRITE,
        custom=entries_pb2.CustomEntry(data_json="{}"),
    )


@pytest.mark.parametrize("name", [*ENUM_CASES, *OTHER_MALFORMED])
async def test_malformed_request(lane_stub, store, name: str) -> None:
    case = ENUM_CASES.get(name) or OTHER_MALFORMED[name]
    ctx = await shared(lane_stub, case.state)
    try:
        await assert_malformed(lane_stub, store, case, ctx)
    except BaseException:
        forget(ctx)
        raise


async def test_no_prompt_with_only_a_write_queued_is_empty(lane_stub, store) -> None:
    # A WRITE item is captured by StartRun but is not a conversational message.
    ctx = await build(lane_stub, "no_op")
    await lane_stub.EnqueueMessage(_enqueue_write(ctx, "{}"))
    case = malformed(
        "no_op", "StartRun", lambda c: pb.StartRunRequest(lane_id=c.lane_id), "EMPTY_PROMPT"
    )
    await assert_malformed(lane_stub, store, case, ctx)


async def test_settle_for_length_may_carry_cut_arguments(lane_stub) -> None:
    # The control case: a response cut for length may end mid-arguments.
    ctx = await build(lane_stub, "turn")
    answer = await lane_stub.SettleAssistantMessage(
        _settle_blocks(
            ctx, tool_call("c0", "t", '{"a": [1, 2'), stop=messages_pb2.STOP_REASON_LENGTH
        )
    )
    assert [c.tool_call_id for c in answer.tool_calls] == ["c0"]


async def test_tool_name_with_nul_is_never_an_internal_error(lane_stub, store) -> None:
    # Tool names are free text; whether the service refuses a NUL or stores it, the answer is
    # INVALID_ARGUMENT or OK, never INTERNAL.
    ctx = await build(lane_stub, "turn")
    before = await picture(lane_stub, store, ctx.lane_id)
    try:
        await lane_stub.SettleAssistantMessage(_settle_blocks(ctx, tool_call("c0", "a\x00b", {})))
    except grpc.aio.AioRpcError as error:
        assert error.code() == Code.INVALID_ARGUMENT, f"{error.code().name}: {error.details()}"
        assert error_reason(error)
        assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), "settle")
        return
    probe = Probe(lane_stub, ctx.lane_id)
    probe.snapshot = before.snapshot or snapshot_pb2.LaneSnapshot()
    await probe.check()


@pytest.mark.parametrize(
    ("page_size", "page_token", "reason"),
    [
        pytest.param(-1, "", "INVALID_PAGE_SIZE", id="page_size_-1"),
        pytest.param(1001, "", "INVALID_PAGE_SIZE", id="page_size_1001"),
        pytest.param(-(2**31), "", "INVALID_PAGE_SIZE", id="page_size_min_int32"),
        pytest.param(0, "%%%not-a-token%%%", "INVALID_PAGE_TOKEN", id="garbage_token"),
        pytest.param(0, "/w==", "INVALID_PAGE_TOKEN", id="token_not_utf8"),
        pytest.param(
            0, base64.urlsafe_b64encode(b"\x00").decode(), "INVALID_PAGE_TOKEN", id="token_nul"
        ),
        pytest.param(
            3,
            base64.urlsafe_b64encode(b"lane\x00x").decode(),
            "INVALID_PAGE_TOKEN",
            id="token_with_nul_inside",
        ),
    ],
)
async def test_list_lanes_malformed(
    lane_stub, page_size: int, page_token: str, reason: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await lane_stub.ListLanes(pb.ListLanesRequest(page_size=page_size, page_token=page_token))
    error = refused_error.value
    assert error.code() == Code.INVALID_ARGUMENT, f"{error.code().name}: {error.details()}"
    assert error_reason(error) == reason


@pytest.mark.parametrize("page_size", [0, 1, 1000])
async def test_list_lanes_page_size_bounds_are_accepted(lane_stub, page_size: int) -> None:
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=new_lane_id("bounds")))
    answer = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=page_size))
    assert 1 <= len(answer.lanes) <= (page_size or 100)


# -- 3. mutated wire bytes ----------------------------------------------------------------------

DOCUMENTED = {
    Code.OK,
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.FAILED_PRECONDITION,
    Code.ALREADY_EXISTS,
}
REQUEST_TYPES: dict[str, type[Message]] = {
    "StartRun": pb.StartRunRequest,
    "SettleAssistantMessage": pb.SettleAssistantMessageRequest,
    "StageToolOutcome": pb.StageToolOutcomeRequest,
}
TARGET_STATES = {
    "StartRun": "no_op",
    "SettleAssistantMessage": "turn",
    "StageToolOutcome": "pending",
}


def base_request(method: str, ctx: Ctx) -> Message:
    """A valid request for ``method`` against ``ctx`` (in TARGET_STATES[method])."""
    if method == "StartRun":
        return pb.StartRunRequest(
            lane_id=ctx.lane_id,
            prompt=[user("fuzz me"), _custom('{"k": [1, 2.5, "x"]}')],
            settings=pb.RunSettings(steering_mode=pb.DELIVERY_MODE_ONE_AT_A_TIME),
            request_id="fuzz-start",
        )
    if method == "SettleAssistantMessage":
        request = _settle_blocks(ctx, tool_call("c0", "t", {"a": 1}), tool_call("c1", "u", {}))
        request.request_id = "fuzz-settle"  # type: ignore[attr-defined]
        return request
    return pb.StageToolOutcomeRequest(
        lane_id=ctx.lane_id,
        operation_id=ctx.operation_id,
        tool_call_id="c0",
        executed=pb.ExecutedOutcome(
            result=result("out", details_json='{"exit": 0}', added_tool_names=["x"]),
            is_error=False,
        ),
        request_id="fuzz-stage",
    )


Mutation = tuple[str, int, int, bytes]  # (kind, position, bit or length, new bytes)


def mutate(base: bytes, mutations: list[Mutation]) -> bytes:
    """Apply bit flips, truncations, insertions, deletions and overwrites to ``base``."""
    data = bytearray(base)
    for kind, position, amount, patch in mutations:
        at = position % max(len(data), 1)
        if kind == "flip" and data:
            data[at] ^= 1 << (amount % 8)
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = patch
        elif kind == "delete" and data:
            del data[at : at + 1 + amount % 4]
        elif kind == "overwrite" and data:
            data[at : at + len(patch)] = patch
    return bytes(data)


mutation_lists = st.lists(
    st.tuples(
        st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite"]),
        st.integers(0, 1 << 16),
        st.integers(0, 255),
        st.binary(min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=4,
)


class Fuzzer:
    """Sends mutated requests through a raw channel method, one live lane per method (a fresh
    one once a mutated request was accepted, since the lane then moved on)."""

    def __init__(self, stub: Any, channel: grpc.aio.Channel) -> None:
        self.stub = stub
        self.channel = channel
        self.lanes: dict[str, Ctx] = {}
        self.probes: dict[str, Probe] = {}

    async def lane(self, method: str) -> Ctx:
        if method not in self.lanes:
            ctx = await build(self.stub, TARGET_STATES[method], prefix="fuzz")
            self.lanes[method] = ctx
            self.probes[method] = Probe(self.stub, ctx.lane_id)
            await self.probes[method].start()
        return self.lanes[method]

    async def body(self, method: str, mutations: list[Mutation]) -> bytes:
        base = base_request(method, await self.lane(method)).SerializeToString()
        return mutate(base, mutations)

    async def send(self, method: str, body: bytes) -> grpc.StatusCode:
        """Send ``body``; then the lane must still capture without a fault, and fold to its
        capture."""
        raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            f"/lane.v1.LaneService/{method}",
            request_serializer=None,
            response_deserializer=None,
        )
        code = Code.OK
        try:
            await raw(body)
        except grpc.aio.AioRpcError as error:
            code = error.code()
        await self.probes[method].check()
        if code == Code.OK:
            del self.lanes[method]
        return code


def _parses(method: str, body: bytes) -> bool:
    try:
        REQUEST_TYPES[method].FromString(body)
    except DecodeError:
        return False
    return True


FUZZ_SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def fuzz_state() -> dict[str, Any]:
    return {}


@FUZZ_SETTINGS
@given(method=st.sampled_from(sorted(REQUEST_TYPES)), mutations=mutation_lists)
async def test_mutated_requests_get_only_documented_codes(
    lane_stub, lane_channel, fuzz_state, method: str, mutations: list[Mutation]
) -> None:
    fuzzer = fuzz_state.setdefault("parsing", Fuzzer(lane_stub, lane_channel))
    body = await fuzzer.body(method, mutations)
    assume(_parses(method, body))
    code = await fuzzer.send(method, body)
    event(f"{method} {code.name}")
    assert code in DOCUMENTED, f"{method} answered {code.name} for {body!r}"


@settings(FUZZ_SETTINGS, max_examples=50, phases=[Phase.explicit, Phase.generate])
@given(method=st.sampled_from(sorted(REQUEST_TYPES)), mutations=mutation_lists)
async def test_undecodable_requests_are_invalid_argument(
    lane_stub, lane_channel, fuzz_state, method: str, mutations: list[Mutation]
) -> None:
    # Bytes that are not a valid request message are a malformed request: INVALID_ARGUMENT,
    # never UNKNOWN or INTERNAL (docs/contract.md: Requests and errors), and nothing changes.
    fuzzer = fuzz_state.setdefault("undecodable", Fuzzer(lane_stub, lane_channel))
    body = await fuzzer.body(method, mutations)
    assume(not _parses(method, body))
    code = await fuzzer.send(method, body)
    assert code == Code.INVALID_ARGUMENT, f"{method} answered {code.name} for {body!r}"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xff\xff\xff\xff", id="bad_tag"),
        pytest.param(b"\x0a\x05ab", id="length_past_the_end"),
        pytest.param(b"\x0a\x02\xff\xfe", id="lane_id_not_utf8"),
    ],
)
async def test_undecodable_bytes_are_invalid_argument(lane_channel, body: bytes) -> None:
    raw = lane_channel.unary_unary(
        "/lane.v1.LaneService/StartRun", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await raw(body)
    error = refused_error.value
    assert error.code() == Code.INVALID_ARGUMENT, f"{error.code().name}: {error.details()}"
    assert error_reason(error)
