"""The rest of the harness through the real service: streamed responses, retries, deferred runs,
compaction, navigation, faults, handler errors, values — fold == capture around every command,
and a full scripted loop that a watcher follows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import grpc
import pytest
from lane.client.testing import Aim, LaneScript, RunScript
from lane.client.watch import watch_lane
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.integration.lanes import Probe, assistant, error_reason, kinds, new_lane_id, text

pytestmark = pytest.mark.asyncio(loop_scope="session")

PENDING = messages_pb2.STOP_REASON_PENDING
STOP = messages_pb2.STOP_REASON_STOP


def partial(value: str) -> pb.StreamedPartial:
    return pb.StreamedPartial(
        message=assistant(text(value), stop=PENDING), stream_event_json='{"type": "text_delta"}'
    )


async def open_turn(stub: Any, probe: Probe) -> tuple[RunScript, Aim]:
    """A run on the probe's new lane with its first turn open: the run, and the turn's ids."""
    lane = await LaneScript.create(stub, probe.lane_id)
    await probe.start()
    run = await lane.start_run("hi")
    turn = replace(run.aim, turn_id=await run.start_turn())
    await probe.check()
    return run, turn


async def test_streamed_response_is_shown_while_streaming_and_cleared_by_settlement(
    lane_stub,
) -> None:
    probe = Probe(lane_stub, new_lane_id("stream"))
    run, turn = await open_turn(lane_stub, probe)
    await lane_stub.AppendAssistantStream(
        turn.request(pb.AppendAssistantStreamRequest, partials=[partial("Hel")])
    )
    assert kinds(await probe.check()) == ["message_start"]
    await lane_stub.AppendAssistantStream(
        turn.request(
            pb.AppendAssistantStreamRequest, partials=[partial("Hello"), partial("Hello, wor")]
        )
    )
    events = await probe.check()
    assert kinds(events) == ["message_update", "message_update"]
    assert events[0].message_update.stream_event_json == '{"type": "text_delta"}'
    streaming = probe.snapshot.operation.streaming_message
    assert streaming.content[0].text.text == "Hello, wor"  # the capture holds the latest partial
    await run.settle(turn.turn_id, "Hello, world")
    events = await probe.check()
    assert kinds(events) == ["message_end", "entry_added", "turn_end"]
    assert not probe.snapshot.operation.HasField("streaming_message")
    # A settled message is no partial: PENDING is refused for settlement, required for streams.
    settled_partial = pb.StreamedPartial(message=assistant(text("x"), stop=STOP))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.AppendAssistantStream(
            turn.request(pb.AppendAssistantStreamRequest, partials=[settled_partial])
        )
    assert error_reason(refused.value) == "INVALID_STOP_REASON"


async def test_retry_is_scheduled_started_and_ended(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("retry"))
    run, turn = await open_turn(lane_stub, probe)
    await lane_stub.AppendAssistantStream(
        turn.request(pb.AppendAssistantStreamRequest, partials=[partial("par")])
    )
    await probe.check()
    failed = assistant(text("overloaded"), stop=messages_pb2.STOP_REASON_ERROR)
    failed.error_message = "529 overloaded"
    scheduled = await lane_stub.ScheduleRetry(
        turn.request(
            pb.ScheduleRetryRequest,
            failed_message=failed,
            max_attempts=3,
            delay_ms=1500,
            error_message="529 overloaded",
        )
    )
    events = await probe.check()
    assert kinds(events) == ["message_end", "entry_added", "retry_scheduled"]
    retry = probe.snapshot.operation.retry
    assert (retry.attempt, retry.max_attempts) == (2, 3) == (scheduled.attempt, 3)
    assert retry.next_attempt_time == scheduled.next_attempt_time
    assert not probe.snapshot.operation.HasField("streaming_message")
    # Settling before the retry starts is refused.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run.settle(turn.turn_id, message=assistant(stop=STOP))
    assert error_reason(refused.value) == "RETRY_PENDING"
    started = await lane_stub.StartRetry(turn.request(pb.StartRetryRequest))
    assert started.attempt == 2
    assert kinds(await probe.check()) == ["retry_start"]
    assert not probe.snapshot.operation.HasField("retry")
    await run.settle(turn.turn_id, "ok")
    events = await probe.check()
    assert kinds(events) == ["message_end", "entry_added", "retry_end", "turn_end"]
    assert events[2].retry_end.attempt == 2 and events[2].retry_end.success


async def test_deferred_run_suspends_and_resumes(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("deferred"))
    run, turn = await open_turn(lane_stub, probe)
    deferred = snapshot_pb2.DeferredState(
        handle_json='{"batch": "b-1", "n": 12345678901234567890}', poll_json='{"every_ms": 500}'
    )
    await lane_stub.SuspendRun(turn.request(pb.SuspendRunRequest, deferred=deferred))
    assert kinds(await probe.check()) == ["run_suspend"]
    assert probe.snapshot.operation.deferred == deferred
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.AppendAssistantStream(
            turn.request(pb.AppendAssistantStreamRequest, partials=[partial("x")])
        )
    assert error_reason(refused.value) == "RUN_SUSPENDED"
    await lane_stub.ResumeRun(run.aim.request(pb.ResumeRunRequest))
    assert kinds(await probe.check()) == ["run_resume"]
    assert not probe.snapshot.operation.HasField("deferred")


async def test_standalone_and_in_run_compaction(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("compact"))
    run, turn = await open_turn(lane_stub, probe)
    lane = probe.lane_id
    await run.settle(turn.turn_id, "a")
    await probe.check()
    summary = entries_pb2.CompactionEntry(summary="earlier: greetings", tokens_before=1234)
    compacted = await lane_stub.CompactRun(run.aim.request(pb.CompactRunRequest, entry=summary))
    events = await probe.check()
    assert kinds(events) == ["compaction_start", "entry_added", "compaction_end"]
    # The transcript starts anew at the compaction entry.
    assert [e.id for e in probe.snapshot.transcript] == [compacted.entry_id]
    await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    await probe.check()
    start = await lane_stub.StartCompaction(
        pb.StartCompactionRequest(lane_id=lane, reason=events_pb2.COMPACTION_REASON_MANUAL)
    )
    assert kinds(await probe.check()) == ["compaction_start"]
    assert probe.snapshot.operation.kind == snapshot_pb2.OPERATION_KIND_COMPACTION
    end = await lane_stub.EndCompaction(
        pb.EndCompactionRequest(
            lane_id=lane,
            operation_id=start.operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
            entry=entries_pb2.CompactionEntry(summary="all of it"),
        )
    )
    events = await probe.check()
    assert kinds(events) == ["entry_added", "compaction_end"]
    assert not probe.snapshot.HasField("operation")
    assert probe.snapshot.last_result == end.result
    assert end.result.kind == snapshot_pb2.OPERATION_KIND_COMPACTION
    assert len(probe.snapshot.transcript) == 1
    # Declined: no entry.
    start = await lane_stub.StartCompaction(pb.StartCompactionRequest(lane_id=lane))
    await lane_stub.EndCompaction(
        pb.EndCompactionRequest(
            lane_id=lane,
            operation_id=start.operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_DECLINED,
        )
    )
    events = await probe.check()
    assert kinds(events) == ["compaction_start", "compaction_end"]
    assert probe.snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_DECLINED


async def test_navigation_moves_the_tip_and_watchers_rebase(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("navigate"))
    run, turn = await open_turn(lane_stub, probe)
    lane = probe.lane_id
    first = probe.snapshot.tip_id  # the prompt entry
    await run.settle(turn.turn_id, "a")
    await run.end()
    await probe.check()
    views = watch_lane(lane_stub, lane)
    initial = await anext(views)
    assert initial.snapshot == await probe.capture()
    moved = await lane_stub.NavigateLane(
        pb.NavigateLaneRequest(
            lane_id=lane,
            target_entry_id=first,
            summary=entries_pb2.BranchSummaryEntry(summary="tried an answer"),
        )
    )
    after = await probe.capture()
    assert after.tip_id != first and after.transcript[-2].id == first
    assert after.transcript[-1].branch_summary.from_id  # the branch left behind
    assert after.last_result == moved.result
    assert moved.result.kind == snapshot_pb2.OPERATION_KIND_NAVIGATION
    # The Python watch client re-snapshots on navigation_end: its next view is a fresh capture.
    view = await anext(views)
    assert view.resnapshotted and view.snapshot == after
    await views.aclose()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.NavigateLane(pb.NavigateLaneRequest(lane_id=lane, target_entry_id="nope"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(refused.value) == "ENTRY_NOT_FOUND"
    # On a lane that does not exist the lane is what is missing, whatever the entry.
    target = after.transcript[0].id
    missing = new_lane_id("no-such-lane")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.NavigateLane(
            pb.NavigateLaneRequest(lane_id=missing, target_entry_id=target)
        )
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(refused.value) == "LANE_NOT_FOUND"


async def test_fault_handler_error_and_values(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("values"))
    await LaneScript.create(lane_stub, probe.lane_id)
    await probe.start()
    await lane_stub.SetLaneValue(
        pb.SetLaneValueRequest(
            lane_id=probe.lane_id, session_name=events_pb2.SessionNameValue(name="bugfix")
        )
    )
    await lane_stub.ReportHandlerError(
        pb.ReportHandlerErrorRequest(lane_id=probe.lane_id, error="boom", hook="before_tool")
    )
    events = await probe.check()
    assert kinds(events) == ["value_update", "handler_error"]
    assert events[1].handler_error.hook == "before_tool"
    assert not probe.snapshot.faulted
    await lane_stub.ReportFault(
        pb.ReportFaultRequest(lane_id=probe.lane_id, code="DRIVER_CRASHED", message="segfault")
    )
    assert kinds(await probe.check()) == ["fault"]
    assert probe.snapshot.faulted


async def test_a_full_scripted_loop_is_followed_by_a_watcher(lane_stub) -> None:
    """Streamed response, tool batch, retry, compaction, follow-up — one watcher sees it all."""
    probe = Probe(lane_stub, new_lane_id("loop"))
    script = await LaneScript.create(lane_stub, probe.lane_id)
    await probe.start()
    lane = probe.lane_id
    views = watch_lane(lane_stub, lane)
    await anext(views)
    run = await script.start_run("fix the bug", driver_id="d", lease_seconds=60)
    first = replace(run.aim, turn_id=await run.start_turn())
    await lane_stub.AppendAssistantStream(
        first.request(pb.AppendAssistantStreamRequest, partials=[partial("Let me")])
    )
    reads = [("c1", "read", {"p": "a"}), ("c2", "read", {"p": "b"})]
    await run.settle(first.turn_id, "Let me look", tool_calls=reads)
    for call in ("c1", "c2"):
        await run.call(call).start()
    for call in ("c2", "c1"):
        await run.call(call).stage(f"{call} text")
    second = replace(run.aim, turn_id=await run.start_turn())
    await lane_stub.ScheduleRetry(
        second.request(pb.ScheduleRetryRequest, max_attempts=2, delay_ms=0, error_message="timeout")
    )
    await lane_stub.StartRetry(second.request(pb.StartRetryRequest))
    await run.settle(second.turn_id, "found it")
    await lane_stub.CompactRun(
        run.aim.request(pb.CompactRunRequest, entry=entries_pb2.CompactionEntry(summary="s"))
    )
    await run.turn("compacted; done")
    # A follow-up arrives as the run could finish: the next turn places it first.
    await script.enqueue("and tests?", snapshot_pb2.QUEUE_KIND_FOLLOW_UP)
    await run.turn("added")
    end = await run.end()
    seen: list[str] = []
    async for view in views:
        seen.extend(kinds(view.events))
        if view.snapshot.revision >= end.revision:
            break
    await views.aclose()
    final = await probe.capture()
    assert view.snapshot == final
    for kind in (
        "run_start",
        "turn_start",
        "message_start",
        "tool_start",
        "tool_end",
        "entry_added",
        "turn_end",
        "retry_scheduled",
        "retry_start",
        "retry_end",
        "compaction_start",
        "compaction_end",
        "queue_update",
        "run_end",
    ):
        assert kind in seen, kind
    # The transcript starts at the compaction entry; the follow-up was placed before the last
    # turn's answer.
    assert final.transcript[0].WhichOneof("payload") == "compaction"
    roles = [e.message.message.WhichOneof("message") for e in final.transcript[1:]]
    assert roles == ["assistant", "user", "assistant"]
    assert final.transcript[2].message.message.user.content[0].text.text == "and tests?"
    assert final.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
