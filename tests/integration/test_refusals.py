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

States are built by ``lane.client.testing.LaneScript``; the requests posed to them are built
by its ``Aim`` (a ``Ctx`` here), so that a case names only what it is about.

test_idempotency and test_capture_corruption reuse this module's lane builders.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st
from lane.client.testing import Aim, LaneScript, RunScript
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
from tests.outage.fuzz_encoding import MUTATION_KINDS, Mutation, mutate
from tests.support import refusal_matrix
from tests.support.refusal_matrix import Expected, Refusal, params

pytestmark = pytest.mark.asyncio(loop_scope="session")

Code = grpc.StatusCode
STOP = messages_pb2.STOP_REASON_STOP
COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED


# -- lanes in a given state ---------------------------------------------------------------------

#: A lane and the ids a command against it names (``Aim.request`` builds the request). Until a
#: state opens them, its operation and turn are ids that never were; its call is the one the
#: state is named after.
Ctx = Aim


def _method(request: Message) -> str:
    """The RPC that takes ``request`` (StartRunRequest: StartRun)."""
    return request.DESCRIPTOR.name.removesuffix("Request")


async def start_tool(stub: Any, ctx: Ctx, call_id: str) -> Any:
    """StartToolCall of ``call_id``, no arguments."""
    request = replace(ctx, tool_call_id=call_id).request(
        pb.StartToolCallRequest, arguments_json="{}"
    )
    return await stub.StartToolCall(request)


async def stage(stub: Any, ctx: Ctx, call_id: str, **outcome: Any) -> Any:
    """StageToolOutcome of ``call_id`` with ``outcome`` (``executed=`` or ``synthetic=``)."""
    return await stub.StageToolOutcome(_stage(replace(ctx, tool_call_id=call_id), **outcome))


UNKNOWN_TOOL = pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL)


async def build(stub: Any, state: str, prefix: str = "refuse") -> Ctx:
    """A fresh lane in ``state``, one of the refusal matrix's (tests/support/refusal_matrix.py).

    The tool states hold one batch: [text, c0, c1] (tool calls at source indexes 1 and 2).
    ``ctx.tool_call_id`` is the call the state is named after. An ``a_`` state is its state
    with the run's abort requested last.
    """
    ctx = Ctx(
        new_lane_id(prefix),
        operation_id="op-never-opened",
        turn_id="turn-never-opened",
        tool_call_id="c0",
    )
    if state == "no_lane":
        return ctx
    lane = await LaneScript.create(stub, ctx.lane_id)
    if state == "no_op":
        return ctx
    run = await lane.start_run("go")
    ctx = replace(ctx, operation_id=run.operation_id)
    if state.removeprefix("a_") != "idle":
        ctx = await _in_turn(run, replace(ctx, turn_id=await run.start_turn()), state)
    if state.startswith("a_"):
        await run.abort()
    return ctx


async def _in_turn(run: RunScript, ctx: Ctx, state: str) -> Ctx:
    """The rest of ``state`` (its abort aside) once the run's turn ``ctx.turn_id`` started."""
    step = state.removeprefix("a_")
    if step == "turn":
        return ctx
    if step == "no_calls":
        await run.settle(ctx.turn_id, "let me look", stop=messages_pb2.STOP_REASON_TOOL_USE)
        return ctx
    if step == "trunc":
        length = messages_pb2.STOP_REASON_LENGTH
        await run.settle(ctx.turn_id, "cut", tool_calls=["c0", "c1"], stop=length)
        return ctx
    if step in ("may_finish", "ended"):
        await run.settle(ctx.turn_id, "done")
        if step == "ended":
            await run.end()
        return ctx
    turn = await run.settle(ctx.turn_id, "calling", tool_calls=["c0", "c1"])
    if step == "planned":
        return ctx
    if step == "completed":
        await turn.call("c0").synthetic(UNKNOWN_TOOL.cause)  # placed at once: c0 is first
        return ctx
    await turn.call("c0").start()
    if step == "pending":
        return ctx
    assert step == "blocked", state
    c1 = await turn.call("c1").start().stage("c1 done")
    assert c1.staged is not None and list(c1.staged.placed_tool_call_ids) == []  # c0 blocks it
    return replace(ctx, tool_call_id="c1")


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


@contextlib.asynccontextmanager
async def lane_in(stub: Any, state: str, *, own: bool = False) -> AsyncIterator[Ctx]:
    """A lane in ``state`` for one case: a fresh one (``own``) or the shared one, which is
    forgotten when the case fails."""
    ctx = await build(stub, state) if own else await shared(stub, state)
    try:
        yield ctx
    except BaseException:
        forget(ctx)
        raise


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


async def call(stub: Any, request: Message) -> Any:
    """Send ``request`` to its RPC; WatchLane returns its first message."""
    method = _method(request)
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


def _start_run(ctx: Ctx) -> Message:
    return ctx.request(pb.StartRunRequest, prompt=[user("again")])


def _abort(ctx: Ctx) -> Message:
    return ctx.request(pb.AbortOperationRequest)


def _end_run(ctx: Ctx) -> Message:
    return ctx.request(pb.EndRunRequest, status=COMPLETED)


def _start_turn(ctx: Ctx) -> Message:
    return ctx.request(pb.StartTurnRequest)


def _settle(ctx: Ctx) -> Message:
    return ctx.request(
        pb.SettleAssistantMessageRequest, message=assistant(text("hello"), stop=STOP)
    )


def _start_tool(ctx: Ctx) -> Message:
    return ctx.request(pb.StartToolCallRequest, arguments_json='{"effective": true}')


def _update_tool(ctx: Ctx) -> Message:
    return ctx.request(pb.UpdateToolCallRequest, partial_result=result("progress"))


def _stage(ctx: Ctx, **outcome: Any) -> Message:
    if not outcome:
        outcome = {"executed": pb.ExecutedOutcome(result=result("final"))}
    return ctx.request(pb.StageToolOutcomeRequest, **outcome)


def _synthetic(cause: int) -> Callable[[Ctx], Message]:
    return lambda ctx: _stage(ctx, synthetic=pb.SyntheticOutcome(cause=cause))  # type: ignore[arg-type]


def _aimed(make: Callable[[Ctx], Message], **ids: Any) -> Callable[[Ctx], Message]:
    """``make``'s request aimed at other ids (a wrong operation, turn or call)."""
    return lambda ctx: make(replace(ctx, **ids))


COMMANDS: dict[str, Callable[[Ctx], Message]] = {
    "start_run": _start_run,
    "abort": _abort,
    "end_completed": _end_run,
    "start_turn": _start_turn,
    "settle": _settle,
    "start_tool": _start_tool,
    "update_tool": _update_tool,
    "stage_executed": _stage,
    "stage_unknown_tool": _synthetic(pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL),
    "stage_cancelled": _synthetic(pb.SYNTHETIC_CAUSE_CANCELLED),
    "stage_interrupted": _synthetic(pb.SYNTHETIC_CAUSE_INTERRUPTED),
    "stage_truncated": _synthetic(pb.SYNTHETIC_CAUSE_TRUNCATED),
    "abort_wrong_operation": _aimed(_abort, operation_id=WRONG_OPERATION),
    "end_wrong_operation": _aimed(_end_run, operation_id=WRONG_OPERATION),
    "start_turn_wrong_operation": _aimed(_start_turn, operation_id=WRONG_OPERATION),
    "settle_wrong_operation": _aimed(_settle, operation_id=WRONG_OPERATION),
    "start_tool_wrong_operation": _aimed(_start_tool, operation_id=WRONG_OPERATION),
    "update_tool_wrong_operation": _aimed(_update_tool, operation_id=WRONG_OPERATION),
    "stage_wrong_operation": _aimed(_stage, operation_id=WRONG_OPERATION),
    "settle_wrong_turn": _aimed(_settle, turn_id=WRONG_TURN),
    "start_unknown_call": _aimed(_start_tool, tool_call_id=UNKNOWN_CALL),
    "update_unknown_call": _aimed(_update_tool, tool_call_id=UNKNOWN_CALL),
    "stage_unknown_call": _aimed(_stage, tool_call_id=UNKNOWN_CALL),
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
    async with lane_in(lane_stub, state, own=expected.ok) as ctx:
        await _run_case(lane_stub, store, ctx, state, command, expected)


async def _run_case(
    lane_stub: Any, store: Any, ctx: Ctx, state: str, command: str, expected: Expected
) -> None:
    request = COMMANDS[command](ctx)
    before = await picture(lane_stub, store, ctx.lane_id)
    try:
        answer = await call(lane_stub, request)
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


async def assert_start_run_refused(
    stub: Any, store: Any, lane_id: str, operation_id: str, *others: str
) -> None:
    """StartRun on ``lane_id`` naming ``operation_id``, which is or was another run's, is
    refused and changes neither that lane nor the lanes ``others``."""
    watched = [lane_id, *others]
    before = [await picture(stub, store, lane) for lane in watched]
    request = Ctx(lane_id).request(
        pb.StartRunRequest, operation_id=operation_id, prompt=[user("mine")]
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await stub.StartRun(request)
    assert refused_error.value.code() in (Code.ALREADY_EXISTS, Code.FAILED_PRECONDITION)
    assert error_reason(refused_error.value)
    for lane, was in zip(watched, before, strict=True):
        assert_unchanged(was, await picture(stub, store, lane), lane)


async def test_operation_id_of_another_lanes_open_run_is_refused(lane_stub, store) -> None:
    # Operation ids identify operations; StartRun with an id already in use must not succeed
    # (it would share, and overwrite, the other lane's operation).
    owner = await build(lane_stub, "planned")
    other = await build(lane_stub, "no_op")
    await assert_start_run_refused(
        lane_stub, store, other.lane_id, owner.operation_id, owner.lane_id
    )
    # The owner's batch is intact: its planned call still starts.
    await start_tool(lane_stub, owner, "c0")


async def test_operation_id_of_an_ended_run_is_refused(lane_stub, store) -> None:
    ctx = await build(lane_stub, "ended")
    ended = await picture(lane_stub, store, ctx.lane_id)
    assert ended.snapshot is not None and ended.snapshot.last_result.operation_id
    await assert_start_run_refused(lane_stub, store, ctx.lane_id, ctx.operation_id)


# -- 2. malformed requests ----------------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    """A malformed request: sent to a lane in ``state``; refused INVALID_ARGUMENT."""

    state: str
    make: Callable[[Ctx], Message]
    reasons: frozenset[str]


def malformed(state: str, make: Callable[[Ctx], Message], *reasons: str) -> Malformed:
    return Malformed(state, make, frozenset(reasons))


async def assert_malformed(stub: Any, store: Any, case: Malformed, ctx: Ctx) -> None:
    request = case.make(ctx)
    method = _method(request)
    before = await picture(stub, store, ctx.lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused_error:
        await call(stub, request)
    error = refused_error.value
    reason = error_reason(error)
    assert error.code() == Code.INVALID_ARGUMENT, (
        f"{method}: {error.code().name} {reason}: {error.details()}"
    )
    assert reason in case.reasons, f"{method}: reason {reason}, expected {case.reasons}"
    assert_unchanged(before, await picture(stub, store, ctx.lane_id), method)


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


#: A valid request of each RPC that names a lane, but for its lane id.
WITH_LANE: list[Callable[[Ctx], Message]] = [
    lambda c: c.request(pb.CreateLaneRequest),
    lambda c: c.request(pb.GetLaneSnapshotRequest),
    lambda c: c.request(pb.WatchLaneRequest),
    lambda c: c.request(
        pb.UpdateLaneConfigRequest, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
    ),
    lambda c: c.request(
        pb.EnqueueMessageRequest, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user("m")
    ),
    _start_run,
    _abort,
    _end_run,
    _start_turn,
    _settle,
    lambda c: c.request(pb.RecordUsageRequest, usage=messages_pb2.Usage(input=1)),
    _start_tool,
    _update_tool,
    _stage,
]


def _with_lane(lane_id: str) -> dict[str, Message]:
    """The requests of :data:`WITH_LANE` for ``lane_id``, by RPC."""
    ctx = Ctx(lane_id, operation_id="op", turn_id="turn", tool_call_id="c0")
    return {_method(request): request for request in (make(ctx) for make in WITH_LANE)}


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
        await call(lane_stub, _with_lane(lane_id)[method])
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
        lambda c: c.request(pb.StartRunRequest, operation_id=LONG, prompt=[user("p")]),
        "INVALID_ID",
    ),
    "abort_without_operation_id": malformed(
        "idle",
        lambda c: c.request(pb.AbortOperationRequest, operation_id=""),
        "MISSING_FIELD",
    ),
    "end_run_without_operation_id": malformed(
        "may_finish",
        lambda c: c.request(pb.EndRunRequest, operation_id="", status=COMPLETED),
        "MISSING_FIELD",
    ),
    "start_turn_turn_id": malformed(
        "idle",
        lambda c: c.request(pb.StartTurnRequest, turn_id="t\n1"),
        "INVALID_ID",
    ),
    "settle_without_turn_id": malformed("turn", _aimed(_settle, turn_id=" "), "INVALID_ID"),
    "start_tool_without_call_id": malformed(
        "planned",
        lambda c: c.request(pb.StartToolCallRequest, tool_call_id="", arguments_json="{}"),
        "MISSING_FIELD",
    ),
    "stage_call_id_too_long": malformed("pending", _aimed(_stage, tool_call_id=LONG), "INVALID_ID"),
    "record_usage_entry_id": malformed(
        "no_op",
        lambda c: c.request(
            pb.RecordUsageRequest, usage=messages_pb2.Usage(input=1), entry_id="e\x00"
        ),
        "INVALID_ID",
    ),
    "request_id_too_long": malformed(
        "no_op",
        lambda c: c.request(
            pb.EnqueueMessageRequest,
            kind=snapshot_pb2.QUEUE_KIND_STEER,
            message=user("m"),
            request_id=LONG,
        ),
        "INVALID_ID",
    ),
    "request_id_non_printable": malformed(
        "idle",
        lambda c: c.request(pb.StartTurnRequest, request_id="r\x01"),
        "INVALID_ID",
    ),
    "create_lane_request_id": malformed(
        "no_lane",
        lambda c: c.request(pb.CreateLaneRequest, request_id=" r"),
        "INVALID_ID",
    ),
    "tool_call_block_without_id": malformed(
        "turn",
        lambda c: _settle_blocks(c, tool_call("", "t", {})),
        "MISSING_FIELD",
    ),
    "tool_call_block_id_non_printable": malformed(
        "turn",
        lambda c: _settle_blocks(c, tool_call("a\nb", "t", {})),
        "INVALID_ID",
    ),
    "tool_call_block_without_name": malformed(
        "turn",
        lambda c: _settle_blocks(c, tool_call("c0", "", {})),
        "MISSING_FIELD",
    ),
}


def _settle_blocks(
    ctx: Ctx, *blocks: messages_pb2.ContentBlock, stop: int = messages_pb2.STOP_REASON_TOOL_USE
) -> Message:
    message = assistant(text("calling"), *blocks, stop=stop)
    return ctx.request(pb.SettleAssistantMessageRequest, message=message)


@pytest.mark.parametrize("name", OTHER_ID_CASES)
async def test_malformed_identifier(lane_stub, store, name: str) -> None:
    case = OTHER_ID_CASES[name]
    async with lane_in(lane_stub, case.state) as ctx:
        await assert_malformed(lane_stub, store, case, ctx)


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
    return ctx.request(pb.SettleAssistantMessageRequest, message=message)


# name -> (state, build(ctx, json_text), must be an object)
JSON_FIELDS: dict[str, tuple[str, Callable[[Ctx, str], Message], bool]] = {
    "StartToolCall.arguments_json": (
        "planned",
        lambda c, j: c.request(pb.StartToolCallRequest, arguments_json=j),
        True,
    ),
    "Settle.tool_call.arguments_json": (
        "turn",
        lambda c, j: _settle_blocks(c, tool_call("c0", "t", j)),
        True,
    ),
    "Settle.diagnostics_json": ("turn", lambda c, j: _settle_with(c, diagnostics_json=j), False),
    "Stage.executed.result.details_json": (
        "pending",
        lambda c, j: _stage(c, executed=pb.ExecutedOutcome(result=result("r", details_json=j))),
        False,
    ),
    "UpdateToolCall.partial_result.details_json": (
        "pending",
        lambda c, j: c.request(
            pb.UpdateToolCallRequest, partial_result=result("p", details_json=j)
        ),
        False,
    ),
    "Enqueue.write.custom.data_json": ("no_op", lambda c, j: _enqueue_write(c, j), False),
    "Enqueue.follow_up.custom_message.data_json": (
        "no_op",
        lambda c, j: c.request(
            pb.EnqueueMessageRequest, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=_custom(j)
        ),
        False,
    ),
    "StartRun.prompt.custom.data_json": (
        "no_op",
        lambda c, j: c.request(pb.StartRunRequest, prompt=[user("p"), _custom(j)]),
        False,
    ),
    "EndRun.error.details_json": (
        "may_finish",
        lambda c, j: c.request(
            pb.EndRunRequest,
            status=FAILED,
            error=snapshot_pb2.OperationError(code="boom", message="m", details_json=j),
        ),
        False,
    ),
}


def _enqueue_write(ctx: Ctx, data_json: str) -> Message:
    custom = entries_pb2.CustomEntry(custom_type="note", data_json=data_json)
    return ctx.request(pb.EnqueueMessageRequest, kind=snapshot_pb2.QUEUE_KIND_WRITE, custom=custom)


JSON_CASES = [
    pytest.param(field_name, bad, id=f"{field_name}-{bad}")
    for field_name, (_, _, needs_object) in JSON_FIELDS.items()
    for bad in [*BAD_JSON, *(NOT_AN_OBJECT if needs_object else {})]
]


@pytest.mark.parametrize(("field_name", "bad"), JSON_CASES)
async def test_malformed_json(lane_stub, store, field_name: str, bad: str) -> None:
    state, make, _ = JSON_FIELDS[field_name]
    text_value = BAD_JSON.get(bad, NOT_AN_OBJECT.get(bad, ""))
    case = malformed(state, lambda c: make(c, text_value), "INVALID_JSON")
    async with lane_in(lane_stub, state) as ctx:
        await assert_malformed(lane_stub, store, case, ctx)


@pytest.mark.parametrize("field_name", JSON_FIELDS)
async def test_valid_json_is_kept_byte_for_byte(lane_stub, field_name: str) -> None:
    # The control case for test_malformed_json: the same request with valid JSON succeeds.
    state, make, _ = JSON_FIELDS[field_name]
    ctx = await build(lane_stub, state)
    valid = '{"n": 18446744073709551623, "f": 1.0, "s": "\\u00e9"}'
    probe = Probe(lane_stub, ctx.lane_id)
    await probe.start()
    await call(lane_stub, make(ctx, valid))
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


def _enum(make: Callable[[Ctx], Message], path: str, value: int) -> Callable[[Ctx], Message]:
    """``make``'s request with the enum at ``path`` set to ``value`` (see :func:`_set`)."""
    return lambda ctx: _set(make(ctx), path, value)


def _enqueue(kind: int = 0, **fields: Any) -> Callable[[Ctx], Message]:
    """EnqueueMessage of ``kind`` (a raw int: 0 is none) with ``fields``."""
    return _enum(lambda c: c.request(pb.EnqueueMessageRequest, **fields), "kind", kind)


UNKNOWN_ENUM = "UNKNOWN_ENUM_VALUE"
ENUM_CASES = {
    "enqueue_kind_99": malformed("no_op", _enqueue(99, message=user("m")), UNKNOWN_ENUM),
    "enqueue_kind_negative": malformed("no_op", _enqueue(-1, message=user("m")), UNKNOWN_ENUM),
    "start_tool_replay_42": malformed("planned", _enum(_start_tool, "replay", 42), UNKNOWN_ENUM),
    **{
        f"start_run_{name}_9": malformed(
            "no_op", _enum(_start_run, f"settings.{name}", 9), UNKNOWN_ENUM
        )
        for name in ("tool_execution", "steering_mode", "follow_up_mode")
    },
    "end_run_status_42": malformed(
        "may_finish", _enum(_end_run, "status", 42), UNKNOWN_ENUM, "INVALID_STATUS"
    ),
    "settle_stop_reason_99": malformed(
        "turn", _enum(_settle, "message.stop_reason", 99), UNKNOWN_ENUM, "INVALID_STOP_REASON"
    ),
    "stage_synthetic_cause_99": malformed(
        "planned",
        lambda c: _stage(c, synthetic=_set(pb.SyntheticOutcome(message="m"), "cause", 99)),
        UNKNOWN_ENUM,
    ),
    "update_config_thinking_level_99": malformed(
        "no_op",
        _enum(lambda c: c.request(pb.UpdateLaneConfigRequest), "thinking_level", 99),
        UNKNOWN_ENUM,
    ),
    "create_lane_thinking_level_99": malformed(
        "no_lane",
        _enum(lambda c: c.request(pb.CreateLaneRequest), "configuration.thinking_level", 99),
        UNKNOWN_ENUM,
    ),
}


def _end_run_with(**fields: Any) -> Callable[[Ctx], Message]:
    return lambda c: c.request(pb.EndRunRequest, **fields)


def _start_run_with(*prompt: messages_pb2.AgentMessage) -> Callable[[Ctx], Message]:
    return lambda c: c.request(pb.StartRunRequest, prompt=prompt)


STEER = snapshot_pb2.QUEUE_KIND_STEER
WRITE = snapshot_pb2.QUEUE_KIND_WRITE
OTHER_MALFORMED = {
    "settle_duplicate_tool_call_ids": malformed(
        "turn",
        lambda c: _settle_blocks(c, tool_call("c0", "t", {}), tool_call("c0", "u", {})),
        "DUPLICATE_TOOL_CALL_ID",
    ),
    "settle_stop_reason_pending": malformed(
        "turn",
        _enum(_settle, "message.stop_reason", messages_pb2.STOP_REASON_PENDING),
        "INVALID_STOP_REASON",
    ),
    "settle_stop_reason_unspecified": malformed(
        "turn",
        _enum(_settle, "message.stop_reason", messages_pb2.STOP_REASON_UNSPECIFIED),
        "INVALID_STOP_REASON",
    ),
    "settle_without_message": malformed(
        "turn", lambda c: c.request(pb.SettleAssistantMessageRequest), "MISSING_FIELD"
    ),
    "start_run_assistant_prompt": malformed(
        "no_op",
        _start_run_with(messages_pb2.AgentMessage(assistant=assistant(text("hi"), stop=STOP))),
        "INVALID_MESSAGE",
    ),
    "start_run_tool_result_prompt": malformed(
        "no_op",
        _start_run_with(
            user("ok"),
            messages_pb2.AgentMessage(
                tool_result=messages_pb2.ToolResultMessage(tool_call_id="c", tool_name="t")
            ),
        ),
        "INVALID_MESSAGE",
    ),
    "start_run_empty_message_prompt": malformed(
        "no_op", _start_run_with(messages_pb2.AgentMessage()), "INVALID_MESSAGE"
    ),
    "start_run_no_prompt_empty_inbox": malformed("no_op", _start_run_with(), "EMPTY_PROMPT"),
    "end_run_failed_without_error": malformed(
        "may_finish", _end_run_with(status=FAILED), "INVALID_ERROR"
    ),
    "end_run_completed_with_error": malformed(
        "may_finish",
        _end_run_with(status=COMPLETED, error=snapshot_pb2.OperationError(code="x", message="y")),
        "INVALID_ERROR",
    ),
    "end_run_failed_error_without_code": malformed(
        "may_finish",
        _end_run_with(status=FAILED, error=snapshot_pb2.OperationError(message="no code")),
        "MISSING_FIELD",
    ),
    "end_run_status_unspecified": malformed("may_finish", _end_run_with(), "INVALID_STATUS"),
    "end_run_status_declined": malformed(
        "may_finish",
        _end_run_with(status=snapshot_pb2.OPERATION_RESULT_STATUS_DECLINED),
        "INVALID_STATUS",
    ),
    "stage_without_outcome": malformed(
        "pending", lambda c: c.request(pb.StageToolOutcomeRequest), "MISSING_FIELD"
    ),
    "stage_executed_without_result": malformed(
        "pending",
        lambda c: _stage(c, executed=pb.ExecutedOutcome(is_error=True)),
        "MISSING_FIELD",
    ),
    "stage_synthetic_without_cause": malformed(
        "planned",
        lambda c: _stage(c, synthetic=pb.SyntheticOutcome(message="why")),
        "MISSING_FIELD",
    ),
    "stage_denied_without_message": malformed(
        "planned", _synthetic(pb.SYNTHETIC_CAUSE_DENIED), "MISSING_FIELD"
    ),
    "stage_invalid_arguments_without_message": malformed(
        "planned", _synthetic(pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS), "MISSING_FIELD"
    ),
    "update_tool_without_partial_result": malformed(
        "pending", lambda c: c.request(pb.UpdateToolCallRequest), "MISSING_FIELD"
    ),
    "record_usage_without_usage": malformed(
        "no_op", lambda c: c.request(pb.RecordUsageRequest), "MISSING_FIELD"
    ),
    "enqueue_without_kind": malformed("no_op", _enqueue(message=user("m")), "MISSING_FIELD"),
    "enqueue_steer_without_message": malformed("no_op", _enqueue(STEER), "INVALID_MESSAGE"),
    "enqueue_steer_assistant_message": malformed(
        "no_op",
        _enqueue(
            STEER, message=messages_pb2.AgentMessage(assistant=assistant(text("x"), stop=STOP))
        ),
        "INVALID_MESSAGE",
    ),
    "enqueue_write_without_custom": malformed(
        "no_op", _enqueue(WRITE, message=user("m")), "INVALID_MESSAGE"
    ),
    "enqueue_write_without_custom_type": malformed(
        "no_op", _enqueue(WRITE, custom=entries_pb2.CustomEntry(data_json="{}")), "MISSING_FIELD"
    ),
}


@pytest.mark.parametrize("name", [*ENUM_CASES, *OTHER_MALFORMED])
async def test_malformed_request(lane_stub, store, name: str) -> None:
    case = ENUM_CASES.get(name) or OTHER_MALFORMED[name]
    async with lane_in(lane_stub, case.state) as ctx:
        await assert_malformed(lane_stub, store, case, ctx)


async def test_no_prompt_with_only_a_write_queued_is_empty(lane_stub, store) -> None:
    # A WRITE item is captured by StartRun but is not a conversational message.
    ctx = await build(lane_stub, "no_op")
    await lane_stub.EnqueueMessage(_enqueue_write(ctx, "{}"))
    case = malformed("no_op", lambda c: pb.StartRunRequest(lane_id=c.lane_id), "EMPTY_PROMPT")
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
        return replace(ctx, request_id="fuzz-start").request(
            pb.StartRunRequest,
            prompt=[user("fuzz me"), _custom('{"k": [1, 2.5, "x"]}')],
            settings=pb.RunSettings(steering_mode=pb.DELIVERY_MODE_ONE_AT_A_TIME),
        )
    if method == "SettleAssistantMessage":
        calls = tool_call("c0", "t", {"a": 1}), tool_call("c1", "u", {})
        return _settle_blocks(replace(ctx, request_id="fuzz-settle"), *calls)
    outcome = pb.ExecutedOutcome(
        result=result("out", details_json='{"exit": 0}', added_tool_names=["x"]), is_error=False
    )
    return _stage(replace(ctx, request_id="fuzz-stage"), executed=outcome)


mutation_lists = st.lists(
    st.tuples(
        st.sampled_from(MUTATION_KINDS),
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


#: A method and the mutations of its request's bytes, for the tests below.
MUTATED_REQUESTS = given(method=st.sampled_from(sorted(REQUEST_TYPES)), mutations=mutation_lists)


@pytest.fixture(scope="module")
def fuzz_state() -> dict[str, Any]:
    return {}


async def send_mutated(
    fuzzer: Fuzzer, method: str, mutations: list[Mutation], *, parses: bool
) -> tuple[grpc.StatusCode, bytes]:
    """Send ``method``'s request mutated by ``mutations`` if the bytes still decode as one
    (``parses``), or if they no longer do; return the answer's code and the bytes."""
    body = await fuzzer.body(method, mutations)
    assume(_parses(method, body) == parses)
    return await fuzzer.send(method, body), body


@FUZZ_SETTINGS
@MUTATED_REQUESTS
async def test_mutated_requests_get_only_documented_codes(
    lane_stub, lane_channel, fuzz_state, method: str, mutations: list[Mutation]
) -> None:
    fuzzer = fuzz_state.setdefault("parsing", Fuzzer(lane_stub, lane_channel))
    code, body = await send_mutated(fuzzer, method, mutations, parses=True)
    event(f"{method} {code.name}")
    assert code in DOCUMENTED, f"{method} answered {code.name} for {body!r}"


@settings(FUZZ_SETTINGS, max_examples=50, phases=[Phase.explicit, Phase.generate])
@MUTATED_REQUESTS
async def test_undecodable_requests_are_invalid_argument(
    lane_stub, lane_channel, fuzz_state, method: str, mutations: list[Mutation]
) -> None:
    # Bytes that are not a valid request message are a malformed request: INVALID_ARGUMENT,
    # never UNKNOWN or INTERNAL (docs/contract.md: Requests and errors), and nothing changes.
    fuzzer = fuzz_state.setdefault("undecodable", Fuzzer(lane_stub, lane_channel))
    code, body = await send_mutated(fuzzer, method, mutations, parses=False)
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
