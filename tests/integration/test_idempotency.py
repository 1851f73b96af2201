"""Request ids (lane_service.proto, docs/contract.md): a retry with the same id returns the first
answer and commits nothing new; the same id with different content is refused with
ALREADY_EXISTS / REQUEST_ID_REUSED; ids are scoped to their lane.

Lane set-up and the "nothing changed" checks come from test_refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from lane.client.testing import Aim
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.domain import placement
from tests.integration.lanes import (
    Probe,
    assistant,
    error_reason,
    kinds,
    result,
    text,
    tool_call,
    user,
)
from tests.integration.test_refusals import (
    Ctx,
    assert_unchanged,
    build,
    picture,
    start_tool,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

STOP = messages_pb2.STOP_REASON_STOP


def _configuration(variant: int) -> snapshot_pb2.LaneConfiguration:
    return snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="p", model_id=f"m{variant}"),
        thinking_level=snapshot_pb2.THINKING_LEVEL_LOW,
        active_tool_names=["read"],
    )


def _create(c: Ctx, v: int) -> Message:
    return pb.CreateLaneRequest(lane_id=c.lane_id, configuration=_configuration(v))


def _update_config(c: Ctx, v: int) -> Message:
    level = (snapshot_pb2.THINKING_LEVEL_HIGH, snapshot_pb2.THINKING_LEVEL_LOW)[v]
    return pb.UpdateLaneConfigRequest(lane_id=c.lane_id, thinking_level=level)


def _enqueue(c: Ctx, v: int) -> Message:
    return pb.EnqueueMessageRequest(
        lane_id=c.lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user(f"queued {v}")
    )


def _start_run(c: Ctx, v: int) -> Message:
    return pb.StartRunRequest(lane_id=c.lane_id, prompt=[user(f"prompt {v}")])


def _aim(c: Ctx) -> Aim:
    """The run and turn ``c`` names, for a request to aim at (no call, no request id)."""
    return Aim(c.lane_id, c.operation_id, turn_id=c.turn_id)


def _at_call(c: Ctx, call_id: str = "c0", request_id: str = "") -> Aim:
    return replace(_aim(c), tool_call_id=call_id, request_id=request_id)


def _abort(c: Ctx, v: int) -> Message:
    # The only content of an abort is the operation id.
    operation_id = c.operation_id if v == 0 else "op-other"
    return _aim(c).request(pb.AbortOperationRequest, operation_id=operation_id)


def _end_run(c: Ctx, v: int) -> Message:
    if v == 0:
        return _aim(c).request(
            pb.EndRunRequest, status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
        )
    return _aim(c).request(
        pb.EndRunRequest,
        status=snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
        error=snapshot_pb2.OperationError(code="e", message="m"),
    )


def _start_turn(c: Ctx, v: int) -> Message:
    # Variant 0 lets the service generate the turn id: a retry must still return it.
    return _aim(c).request(pb.StartTurnRequest, turn_id="" if v == 0 else "turn-chosen")


def _settle(c: Ctx, v: int) -> Message:
    return _aim(c).request(
        pb.SettleAssistantMessageRequest,
        message=assistant(
            text(f"answer {v}"),
            tool_call("c0", "t", {"v": v}),
            usage=messages_pb2.Usage(input=10 + v, output=5, total_tokens=15 + v),
        ),
    )


def _record_usage(c: Ctx, v: int) -> Message:
    return pb.RecordUsageRequest(
        lane_id=c.lane_id, usage=messages_pb2.Usage(input=1 + v, output=2, total_tokens=3 + v)
    )


def _start_tool(c: Ctx, v: int) -> Message:
    return _at_call(c).request(pb.StartToolCallRequest, arguments_json=f'{{"v": {v}}}')


def _update_tool(c: Ctx, v: int) -> Message:
    return _at_call(c).request(
        pb.UpdateToolCallRequest, partial_result=result(f"progress {v}"), checkpoint=True
    )


def _staged(c: Ctx, call_id: str, value: str, request_id: str = "") -> pb.StageToolOutcomeRequest:
    """StageToolOutcome of ``call_id`` executed with the result ``value``."""
    outcome = pb.ExecutedOutcome(result=result(value))
    return _at_call(c, call_id, request_id).request(pb.StageToolOutcomeRequest, executed=outcome)


def _stage(c: Ctx, v: int) -> Message:
    # c0 is the first call of the batch: its staging is followed by its placement.
    return _staged(c, "c0", f"final {v}")


# rpc -> (lane state, method, request(ctx, variant)); variants 0 and 1 differ in content.
RPCS: dict[str, tuple[str, str, Callable[[Ctx, int], Message]]] = {
    "CreateLane": ("no_lane", "CreateLane", _create),
    "UpdateLaneConfig": ("no_op", "UpdateLaneConfig", _update_config),
    "EnqueueMessage": ("no_op", "EnqueueMessage", _enqueue),
    "StartRun": ("no_op", "StartRun", _start_run),
    "AbortOperation": ("idle", "AbortOperation", _abort),
    "EndRun": ("may_finish", "EndRun", _end_run),
    "StartTurn": ("idle", "StartTurn", _start_turn),
    "SettleAssistantMessage": ("turn", "SettleAssistantMessage", _settle),
    "RecordUsage": ("no_op", "RecordUsage", _record_usage),
    "StartToolCall": ("planned", "StartToolCall", _start_tool),
    "UpdateToolCall": ("pending", "UpdateToolCall", _update_tool),
    "StageToolOutcome": ("pending", "StageToolOutcome", _stage),
}


def request_for(rpc: str, ctx: Ctx, variant: int, request_id: str) -> Message:
    message = RPCS[rpc][2](ctx, variant)
    message.request_id = request_id  # type: ignore[attr-defined]
    return message


async def send(stub: Any, rpc: str, request: Message) -> Any:
    return await getattr(stub, RPCS[rpc][1])(request)


async def prepared(stub: Any, rpc: str) -> tuple[Ctx, Probe]:
    """A fresh lane in the state ``rpc`` needs, and a Probe started on it (if it exists)."""
    ctx = await build(stub, RPCS[rpc][0], prefix="idem")
    probe = Probe(stub, ctx.lane_id)
    if rpc != "CreateLane":
        await probe.start()
    return ctx, probe


@pytest.mark.parametrize("rpc", RPCS)
async def test_retry_returns_the_first_answer_and_commits_nothing(lane_stub, store, rpc) -> None:
    ctx, probe = await prepared(lane_stub, rpc)
    request = request_for(rpc, ctx, 0, "retry-1")
    first = await send(lane_stub, rpc, request)
    if rpc == "CreateLane":
        assert first.created
    else:
        assert kinds(await probe.check()), f"{rpc} committed nothing"  # and fold == capture
    committed = await picture(lane_stub, store, ctx.lane_id)
    for _ in range(2):
        again = await send(lane_stub, rpc, request)
        assert again == first, f"{rpc}: the retry answered {again}, the first call {first}"
        assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), rpc)


@pytest.mark.parametrize("rpc", RPCS)
async def test_same_id_with_different_content_is_refused(lane_stub, store, rpc) -> None:
    ctx, _ = await prepared(lane_stub, rpc)
    await send(lane_stub, rpc, request_for(rpc, ctx, 0, "reused-1"))
    committed = await picture(lane_stub, store, ctx.lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await send(lane_stub, rpc, request_for(rpc, ctx, 1, "reused-1"))
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS, refused.value.details()
    assert error_reason(refused.value) == "REQUEST_ID_REUSED"
    assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), rpc)


async def test_same_id_on_another_method_is_refused(lane_stub, store) -> None:
    ctx = await build(lane_stub, "no_op", prefix="idem")
    await send(lane_stub, "EnqueueMessage", request_for("EnqueueMessage", ctx, 0, "shared-id"))
    committed = await picture(lane_stub, store, ctx.lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await send(lane_stub, "RecordUsage", request_for("RecordUsage", ctx, 0, "shared-id"))
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_reason(refused.value) == "REQUEST_ID_REUSED"
    assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), "RecordUsage")


@pytest.mark.parametrize("rpc", RPCS)
async def test_request_ids_are_per_lane(lane_stub, store, rpc) -> None:
    first_lane, _ = await prepared(lane_stub, rpc)
    other_lane, other_probe = await prepared(lane_stub, rpc)
    await send(lane_stub, rpc, request_for(rpc, first_lane, 0, "per-lane"))
    untouched = await picture(lane_stub, store, first_lane.lane_id)
    # The same id on another lane (so with other content: the lane id differs) is a new,
    # independent request: it commits there, and the first lane does not change.
    other = await send(lane_stub, rpc, request_for(rpc, other_lane, 0, "per-lane"))
    if rpc == "CreateLane":
        assert other.created
    else:
        assert kinds(await other_probe.check()), f"{rpc} on the other lane committed nothing"
    assert_unchanged(untouched, await picture(lane_stub, store, first_lane.lane_id), rpc)


@pytest.mark.parametrize("rpc", RPCS)
async def test_concurrent_identical_requests_commit_once(lane_stub, store, rpc) -> None:
    # The control: what one call commits, on a twin lane in the same state.
    twin, twin_probe = await prepared(lane_stub, rpc)
    await send(lane_stub, rpc, request_for(rpc, twin, 0, "twin"))
    if rpc == "CreateLane":
        await twin_probe.start()
    else:
        await twin_probe.check()
    one_commit = kinds(twin_probe.events) if rpc != "CreateLane" else ["lane_created"]

    ctx, probe = await prepared(lane_stub, rpc)
    request = request_for(rpc, ctx, 0, "concurrent-1")
    answers = await asyncio.gather(*(send(lane_stub, rpc, request) for _ in range(10)))
    assert all(a == answers[0] for a in answers), (
        f"{rpc}: different answers {set(map(str, answers))}"
    )
    if rpc == "CreateLane":
        await probe.start()
        assert probe.snapshot.revision == 1
        return
    assert kinds(await probe.check()) == one_commit, f"{rpc} committed more than once"
    committed = await picture(lane_stub, store, ctx.lane_id)
    assert await send(lane_stub, rpc, request) == answers[0]
    assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), rpc)


async def test_stage_retry_after_placement_returns_the_placed_ids(lane_stub, store) -> None:
    ctx, probe = await prepared(lane_stub, "StageToolOutcome")  # a lane in state "pending"
    await start_tool(lane_stub, ctx, "c1")
    # c1 settles first: staged, not placed (c0 still runs).
    late = _staged(ctx, "c1", "c1 done", "stage-c1")
    staged_c1 = await lane_stub.StageToolOutcome(late)
    assert list(staged_c1.placed_tool_call_ids) == []
    assert staged_c1.revision == staged_c1.staged_revision
    # c0 settles: its placement places c0 and c1 and completes the batch.
    early = _staged(ctx, "c0", "c0 done", "stage-c0")
    staged_c0 = await lane_stub.StageToolOutcome(early)
    assert list(staged_c0.placed_tool_call_ids) == ["c0", "c1"] and staged_c0.batch_complete
    await probe.check(["c0", "c1"])
    committed = await picture(lane_stub, store, ctx.lane_id)
    # Retries: each gets its own complete first answer, and nothing is committed.
    assert await lane_stub.StageToolOutcome(early) == staged_c0
    assert await lane_stub.StageToolOutcome(late) == staged_c1
    assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), "retries")
    assert staged_c0.staged.tool_call_id == "c0" and staged_c0.staged.content[0].text.text == (
        "c0 done"
    )


async def test_retry_after_the_lane_moved_on_still_commits_nothing(lane_stub, store) -> None:
    ctx = await build(lane_stub, "no_op", prefix="idem")
    start = pb.StartRunRequest(lane_id=ctx.lane_id, prompt=[user("go")], request_id="run-1")
    run = await lane_stub.StartRun(start)
    end = replace(_aim(ctx), operation_id=run.operation_id, request_id="end-1")
    await lane_stub.EndRun(
        end.request(pb.EndRunRequest, status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    )
    committed = await picture(lane_stub, store, ctx.lane_id)
    # The retried StartRun does not open a second run; the retried EndRun does not refuse.
    assert await lane_stub.StartRun(start) == run
    assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), "StartRun retry")
    assert committed.snapshot is not None and not committed.snapshot.HasField("operation")


async def test_a_refused_request_id_is_not_recorded(lane_stub) -> None:
    # Nothing is recorded for a refused command, so the same request succeeds once allowed.
    ctx = await build(lane_stub, "turn", prefix="idem")
    request = replace(_aim(ctx), request_id="turn-2").request(pb.StartTurnRequest)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.StartTurn(request)
    assert error_reason(refused.value) == "WRONG_RUN_PHASE"
    await lane_stub.SettleAssistantMessage(
        _aim(ctx).request(
            pb.SettleAssistantMessageRequest, message=assistant(text("done"), stop=STOP)
        )
    )
    turn = await lane_stub.StartTurn(request)
    assert turn.turn_id and turn.turn_id != ctx.turn_id
    assert await lane_stub.StartTurn(request) == turn


async def test_stage_concurrent_retries_after_staging_agree(lane_stub) -> None:
    # A retry that arrives while the first call is between its staging and its placement
    # commits must not get a different answer from the first call.
    for _ in range(5):
        ctx = await build(lane_stub, "pending", prefix="idem")
        request = _staged(ctx, "c0", "done", "stage-race")
        answers = await asyncio.gather(*(lane_stub.StageToolOutcome(request) for _ in range(3)))
        placed = [list(a.placed_tool_call_ids) for a in answers]
        assert placed == [["c0"]] * 3, f"answers disagree on what was placed: {placed}"
        assert len({a.revision for a in answers}) == 1


async def _stage_without_placement(stub: Any, request: Message, monkeypatch: Any) -> None:
    """Send ``request`` while placement fails: its staging commits, its placement does not
    (as when the service stops between the two commits)."""

    def stopped(*args: Any) -> Any:
        raise RuntimeError("the service stopped between staging and placement")

    with monkeypatch.context() as patch:
        patch.setattr(placement, "place_ready", stopped)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.StageToolOutcome(request)
    assert failed.value.code() == grpc.StatusCode.INTERNAL


async def test_stage_retry_places_what_the_first_call_left_unplaced(
    lane_stub, store, monkeypatch
) -> None:
    ctx, probe = await prepared(lane_stub, "StageToolOutcome")  # a lane in state "pending"
    request = _staged(ctx, "c0", "c0 done", "stage-stopped")
    await _stage_without_placement(lane_stub, request, monkeypatch)
    assert kinds(await probe.check()) == ["tool_end"]  # staged, not placed
    # The retry answers the staging as committed, and places c0 now.
    answer = await lane_stub.StageToolOutcome(request)
    assert list(answer.placed_tool_call_ids) == ["c0"]
    assert answer.revision > answer.staged_revision == probe.snapshot.revision
    assert "entry_added" in kinds(await probe.check(["c0"]))
    assert answer.staged.content[0].text.text == "c0 done"
    # Every later retry answers alike and commits nothing.
    committed = await picture(lane_stub, store, ctx.lane_id)
    assert await lane_stub.StageToolOutcome(request) == answer
    assert_unchanged(committed, await picture(lane_stub, store, ctx.lane_id), "retry")


async def test_stage_retry_without_request_id_is_refused_and_the_placement_finished(
    lane_stub, monkeypatch
) -> None:
    # Without a request id a retry cannot be told from a second outcome for the call: the call
    # is staged already, so it is refused. What the first call left unplaced is placed all the
    # same, in a placement commit of its own (service/lane/server/commands/pending_placement.py).
    ctx, probe = await prepared(lane_stub, "StageToolOutcome")  # a lane in state "pending"
    request = _staged(ctx, "c0", "c0 done")
    await _stage_without_placement(lane_stub, request, monkeypatch)
    assert kinds(await probe.check()) == ["tool_end"]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.StageToolOutcome(request)
    assert error_reason(refused.value) == "TOOL_CALL_WRONG_STATUS"
    assert kinds(await probe.check(["c0"])) == ["message_start", "message_end", "entry_added"]
