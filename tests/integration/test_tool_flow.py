"""The tool flow (docs/contract.md, Tool calls) through the real service: orders, placement,
fold == capture."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from lane.client.testing import LaneScript, RunScript, ToolCallSpec
from lane.v1 import events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.store.commit_step import OFF_LOOP_BATCH_CALLS
from tests.support.lanes import Probe, error_reason, kinds, new_lane_id, result, user

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def open_batch(
    stub, probe: Probe, *calls: ToolCallSpec, settings: pb.RunSettings | None = None
) -> RunScript:
    """A run on the probe's lane whose first turn asks for ``calls``, checked after each step."""
    lane = await LaneScript.create(stub, probe.lane_id)
    await probe.start()
    run = await lane.start_run("go", settings=settings)
    await probe.check()
    await run.turn("calling tools", tool_calls=calls)
    await probe.check()
    return run


async def test_real_call_commits_and_events_in_seed_order(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    big = 2**64 + 7
    run = await open_batch(lane_stub, probe, ("c1", "shell", f'{{"n": {big}}}'))
    effective = f'{{"n": {big}, "cwd": "/tmp"}}'
    call = await run.call("c1").start(effective)
    assert kinds(await probe.check(["c1"])) == ["tool_start"]
    row = probe.snapshot.operation.running_tools[0].running
    assert row.arguments_json == effective  # byte for byte: the big integer survives
    for n, checkpoint in ((1, False), (2, True)):
        await call.progress(f"line {n}", checkpoint=checkpoint)
        assert kinds(await probe.check(["c1"])) == ["tool_update"]
    assert probe.snapshot.operation.running_tools[0].running.result == result("line 2")
    await call.stage("done", details_json='{"exit": 0}')
    staged = call.staged
    assert call.intent is not None and staged is not None
    events = await probe.check(["c1"])
    assert kinds(events) == [
        "tool_end",
        "message_start",
        "message_end",
        "entry_added",
        "turn_end",
    ]
    # Commit order is revision order: intent < updates < staging < placement.
    tool_start = next(e for e in probe.events if e.WhichOneof("kind") == "tool_start")
    assert tool_start.revision == call.intent.revision
    assert [u.revision for u in call.updates] == [
        call.intent.revision + 1,
        call.intent.revision + 2,
    ]
    assert events[0].revision == staged.staged_revision  # tool_end is the staging commit
    assert staged.revision == events[-1].revision > staged.staged_revision
    assert list(staged.placed_tool_call_ids) == ["c1"] and staged.batch_complete
    assert not events[0].tool_end.result.HasField("usage")
    assert events[0].tool_end.result.details_json == '{"exit": 0}'
    # Staging and placement are separate commits (two event groups).
    assert events[0].commit_time.ToDatetime() <= events[1].commit_time.ToDatetime()
    assert probe.snapshot.operation.running_tools == []
    placed = probe.snapshot.transcript[-1].message.message.tool_result
    assert placed.tool_call_id == "c1" and [c.text.text for c in placed.content] == ["done"]


async def test_immediate_synthetic_stages_start_and_end_in_one_group(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    run = await open_batch(lane_stub, probe, ("c1", "nope", {"x": 1}))
    staged = (await run.call("c1").synthetic(pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL)).staged
    assert staged is not None
    events = await probe.check(["c1"])
    assert kinds(events)[:2] == ["tool_start", "tool_end"]
    start, end = events[0], events[1]
    assert start.revision + 1 == end.revision == staged.staged_revision
    assert json.loads(start.tool_start.arguments_json) == {"x": 1}  # the source block's args
    assert end.tool_end.is_error and not end.tool_end.terminate
    assert "nope" in end.tool_end.result.content[0].text.text
    assert kinds(events)[2:] == ["message_start", "message_end", "entry_added", "turn_end"]


async def test_parallel_batch_settles_early_and_places_in_source_order(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    calls = ["c0", "c1", "c2"]
    run = await open_batch(lane_stub, probe, *calls)
    for call in calls:
        await run.call(call).start()
        await probe.check(calls[: calls.index(call) + 1])

    async def finish(call: str) -> pb.StageToolOutcomeResponse:
        staged = (await run.call(call).stage(f"{call} done")).staged
        assert staged is not None
        return staged

    staged = await finish("c2")
    assert list(staged.placed_tool_call_ids) == []
    await probe.check(calls)
    rows = {r.WhichOneof("state"): r for r in probe.snapshot.operation.running_tools}
    settled = [r.settled for r in probe.snapshot.operation.running_tools if r.HasField("settled")]
    assert [s.tool_call_id for s in settled] == ["c2"] and settled[0].result == result("c2 done")
    assert "running" in rows
    staged = await finish("c0")
    assert list(staged.placed_tool_call_ids) == ["c0"] and not staged.batch_complete
    await probe.check(calls)
    # c2 stays settled with its final result while c1 blocks it.
    still = [r.settled for r in probe.snapshot.operation.running_tools if r.HasField("settled")]
    assert [s.tool_call_id for s in still] == ["c2"] and still[0].result == result("c2 done")
    staged = await finish("c1")
    assert list(staged.placed_tool_call_ids) == ["c1", "c2"] and staged.batch_complete
    events = await probe.check(calls)
    added = [
        e.entry_added.entry.message.message.tool_result.tool_call_id
        for e in events
        if e.HasField("entry_added")
    ]
    assert added == ["c1", "c2"]
    assert kinds(events)[-1] == "turn_end"
    assert [r.tool_call_id for r in events[-1].turn_end.tool_results] == calls


async def test_sequential_batch_refuses_a_later_start(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    settings = pb.RunSettings(tool_execution=pb.TOOL_EXECUTION_SEQUENTIAL)
    run = await open_batch(lane_stub, probe, "a", "b", settings=settings)
    before = await probe.capture()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run.call("b").start()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "SEQUENTIAL_ORDER"
    assert await probe.capture() == before


async def test_abort_with_live_driver(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    run = await open_batch(lane_stub, probe, "run", "wait")
    running = (
        await run.call("run").start().progress("half", checkpoint=True, details_json='{"p": 50}')
    )
    await probe.check(["run"])
    abort = await run.abort()
    assert abort.newly_requested
    assert kinds(await probe.check(["run"])) == ["operation_abort"]
    assert probe.snapshot.operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING
    again = await run.abort()
    assert not again.newly_requested and again.revision == abort.revision
    # No new intent once aborting.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run.call("wait").start()
    assert error_reason(refused.value) == "OPERATION_CANCELLED"
    # The running tool still stages its real result, terminate forced false.
    await running.stage("finished", terminate=True)
    assert running.staged is not None and running.staged.cancel_requested
    events = await probe.check(["run"])
    assert not events[0].tool_end.terminate and not events[0].tool_end.result.terminate
    # The planned call gets the cancelled synthetic (start + end in one group), then run_end.
    end = await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    assert end.result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
    events = await probe.check(["run", "wait"])
    assert kinds(events)[:2] == ["tool_start", "tool_end"]
    assert kinds(events)[-2:] == ["turn_end", "run_end"]
    assert not probe.snapshot.HasField("operation")


async def test_end_run_interrupts_a_running_call_with_its_checkpoint(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    run = await open_batch(lane_stub, probe, "x")
    usage = messages_pb2.Usage(input=3, output=4, total_tokens=7)
    await (
        run.call("x")
        .start()
        .progress("partial out", checkpoint=True, details_json='{"k": 1}', usage=usage)
    )
    await probe.check(["x"])
    await run.end(
        snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
        snapshot_pb2.OperationError(code="driver_lost", message="gone"),
    )
    events = await probe.check(["x"])
    assert kinds(events)[0] == "tool_end"  # no new tool_start: the running row already exists
    end = events[0].tool_end
    assert end.result.content[0].text.text == "partial out"
    assert "interrupted" in end.result.content[-1].text.text
    assert end.result.details_json == '{"k": 1}' and end.result.usage == usage and end.is_error
    assert probe.snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
    assert probe.snapshot.last_result.error.code == "driver_lost"
    assert probe.snapshot.stats.usage.total_tokens == 7  # the result's usage was placed


async def test_placement_adds_tools_and_records_usage(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    run = await open_batch(lane_stub, probe, ("x", "load", {}))
    call = await run.call("x").start()
    assert kinds(await probe.check(["x"])) == ["tool_start"]
    usage = messages_pb2.Usage(input=1, output=2, total_tokens=3)
    await call.stage("loaded", usage=usage, added_tool_names=["grep"], terminate=True)
    events = await probe.check(["x"])
    assert kinds(events) == [
        "tool_end",
        "message_start",
        "message_end",
        "entry_added",
        "usage",
        "config_update",
        "turn_end",
    ]
    assert list(probe.snapshot.configuration.active_tool_names) == ["grep"]
    entry = probe.snapshot.transcript[-1]
    assert entry.message.terminate  # the durable terminate flag reaches the entry
    # Every call terminated: the run may finish without another assistant turn.
    await run.end()
    assert kinds(await probe.check())[-1] == "run_end"


async def test_concurrent_commands_on_one_lane_get_consecutive_revisions(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id())
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=probe.lane_id))
    await probe.start()
    answers = await asyncio.gather(
        *(
            lane_stub.EnqueueMessage(
                pb.EnqueueMessageRequest(
                    lane_id=probe.lane_id,
                    kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                    message=user(f"m{i}"),
                )
            )
            for i in range(20)
        )
    )
    assert sorted(a.revision for a in answers) == list(range(2, 22))
    events = await probe.check()
    assert all(e.HasField("queue_update") for e in events)
    assert len(probe.snapshot.queues) == 20


async def test_event_kinds_cover_the_catalog() -> None:
    # The envelope's oneof is the catalog: 28 kinds (docs/contract.md, Commits and their events).
    assert len(events_pb2.HarnessEvent.DESCRIPTOR.oneofs_by_name["kind"].fields) == 28


async def test_a_large_batch_commits_as_a_small_one(lane_stub) -> None:
    # Commands on a lane whose batch has OFF_LOOP_BATCH_CALLS calls or more are worked out in
    # a worker thread: the same commits, answers and recorded answers as on the event loop.
    probe = Probe(lane_stub, new_lane_id())
    count = OFF_LOOP_BATCH_CALLS + 8
    ids = [f"c{i:02d}" for i in range(count)]
    run = await open_batch(lane_stub, probe, *ids)
    for call_id in ids[:5]:
        await run.call(call_id).start()
    await probe.check(ids[:5])
    for call_id in ids[1:5]:  # later calls finish first: staged, not yet placed
        await run.call(call_id).stage(f"done {call_id}")
    await probe.check(ids[:5])
    assert placed_results(probe.snapshot) == []
    await run.call(ids[0]).stage("done c00")
    await probe.check()
    assert placed_results(probe.snapshot) == ids[:5]
    # A retried request id gets the answer recorded in the thread.
    request = run.call(ids[5]).aim.request(pb.StartToolCallRequest, arguments_json="{}")
    request.request_id = "large-batch-retry"
    answer = await lane_stub.StartToolCall(request)
    assert await lane_stub.StartToolCall(request) == answer
    await probe.check([ids[5]])
    # Ending the run settles and places every unfinished call in one commit.
    await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    await probe.check()
    assert placed_results(probe.snapshot) == ids


def placed_results(snapshot: snapshot_pb2.LaneSnapshot) -> list[str]:
    """The tool call ids of the tool results in the transcript, in transcript order."""
    return [
        entry.message.message.tool_result.tool_call_id
        for entry in snapshot.transcript
        if entry.WhichOneof("payload") == "message"
        and entry.message.message.HasField("tool_result")
    ]
