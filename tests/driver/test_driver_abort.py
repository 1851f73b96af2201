"""Aborting a driven run: planned calls get CANCELLED results, running tools finish with their
real result (terminate forced false) or are cut off after the grace period, the run ends
ABORTED; the abort is seen through the event stream, lease renewals or command answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lane.client.driver import Driver
from lane.client.hooks import BeforeToolDecision, BeforeToolEvent, Hooks
from lane.client.model import ScriptedModel
from lane.client.tools import ToolContext, ToolResult, ToolResultLike
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.driver.support import (
    HangingModel,
    Recorder,
    by_call,
    open_operation_id,
    returns,
    rows,
    snapshot,
    started_probe,
    step,
    text_of,
    tool,
    tool_results,
    until,
    until_aborted,
)
from tests.integration.lanes import new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
CANCELLED_TEXT = "Tool execution was cancelled before it completed."


async def abort_when_running(stub: Any, lane: str, call_ids: dict[str, str]) -> str:
    """Wait until the lane's tool rows are ``call_ids``, then AbortOperation; return the run."""
    operation_id = await open_operation_id(stub, lane)

    async def ready() -> bool:
        return rows(await snapshot(stub, lane)) == call_ids

    await until(ready, what=f"tool rows {call_ids}")
    await stub.AbortOperation(pb.AbortOperationRequest(lane_id=lane, operation_id=operation_id))
    return operation_id


async def test_abort_mid_sequential_batch_cancels_planned_calls(lane_stub) -> None:
    lane = new_lane_id("abort-seq")
    probe = await started_probe(lane_stub, lane)
    recorder = Recorder()

    async def stubborn(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.abort_signal.wait()
        return ToolResult(content="stopped cleanly", terminate=True)

    tools = [
        tool("wait", stubborn, recorder=recorder),
        tool("next", returns("x"), recorder=recorder),
    ]
    model = ScriptedModel([step("three", ("wait", {}), ("next", {}), ("next", {})), step("no")])
    driver = Driver(
        lane_stub,
        lane,
        tools,
        settings=pb.RunSettings(tool_execution=pb.TOOL_EXECUTION_SEQUENTIAL),
    )
    running = asyncio.create_task(driver.run("go", model))
    await abort_when_running(lane_stub, lane, {"call_1_1": "running"})
    result = await running
    assert result.status == ABORTED and model.calls == 1
    assert recorder.executions == {"wait": 1}  # nothing new started after the abort
    await probe.check(["call_1_1", "call_1_2", "call_1_3"])
    snap = await snapshot(lane_stub, lane)
    results = by_call(snap)
    assert text_of(results["call_1_1"]) == "stopped cleanly" and not results["call_1_1"].is_error
    for call_id in ("call_1_2", "call_1_3"):
        assert results[call_id].is_error and text_of(results[call_id]) == CANCELLED_TEXT
    # The running tool asked to terminate, but a cancelled run's terminate is forced false.
    entries = [e for e in snap.transcript if e.message.message.HasField("tool_result")]
    assert [e.message.terminate for e in entries] == [False, False, False]
    assert snap.last_result.status == ABORTED and not snap.HasField("operation")


async def test_abort_in_a_parallel_batch_stops_starting_new_calls(lane_stub) -> None:
    lane = new_lane_id("abort-par")
    recorder = Recorder()
    gate_reached, release = asyncio.Event(), asyncio.Event()

    async def hold_second(event: BeforeToolEvent) -> BeforeToolDecision:
        # Holds the second call's start until the run was aborted. Whether the driver saw the
        # abort before its intent (then it cancels) or learns it from the refused intent, the
        # call is cancelled, never started.
        if event.tool_call_id == "call_1_2":
            gate_reached.set()
            await release.wait()
        return None

    tools = [
        tool("long", until_aborted("long stopped"), recorder=recorder),
        tool("quick", returns("quick"), recorder=recorder),
    ]
    model = ScriptedModel([step("two", ("long", {}), ("quick", {})), step("no")])
    driver = Driver(lane_stub, lane, tools, hooks=Hooks(before_tool=[hold_second]))
    running = asyncio.create_task(driver.run("go", model))
    operation_id = await open_operation_id(lane_stub, lane)
    await asyncio.wait_for(gate_reached.wait(), 10)
    await lane_stub.AbortOperation(
        pb.AbortOperationRequest(lane_id=lane, operation_id=operation_id)
    )
    release.set()
    result = await running
    assert result.status == ABORTED
    assert recorder.executions == {"long": 1}
    results = by_call(await snapshot(lane_stub, lane))
    assert text_of(results["call_1_1"]) == "long stopped"
    assert results["call_1_2"].is_error and text_of(results["call_1_2"]) == CANCELLED_TEXT


async def test_abort_is_seen_through_lease_renewal_alone(lane_stub) -> None:
    lane = new_lane_id("abort-renew")
    model = ScriptedModel([step("one", ("wait", {})), step("no")])
    driver = Driver(
        lane_stub, lane, [tool("wait", until_aborted("saw it"))], lease_seconds=1, watch_abort=False
    )
    running = asyncio.create_task(driver.run("go", model))
    await abort_when_running(lane_stub, lane, {"call_1_1": "running"})
    result = await asyncio.wait_for(running, 5)
    assert result.status == ABORTED
    (placed,) = tool_results(await snapshot(lane_stub, lane))
    assert text_of(placed) == "saw it"


async def test_abort_while_the_model_answers_ends_the_run_without_its_answer(lane_stub) -> None:
    lane = new_lane_id("abort-model")
    model = HangingModel()
    driver = Driver(lane_stub, lane, [])
    running = asyncio.create_task(driver.run("go", model))
    await model.wait_asked()
    assert await driver.abort()
    result = await asyncio.wait_for(running, 5)
    assert result.status == ABORTED
    snap = await snapshot(lane_stub, lane)
    assert [e.message.message.WhichOneof("message") for e in snap.transcript] == ["user"]


async def test_a_tool_ignoring_the_abort_is_interrupted_after_the_grace_period(lane_stub) -> None:
    lane = new_lane_id("abort-grace")

    async def deaf(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.checkpoint("halfway")
        await asyncio.sleep(60)
        return "not reached"

    model = ScriptedModel([step("one", ("deaf", {})), step("no")])
    driver = Driver(lane_stub, lane, [tool("deaf", deaf)], abort_grace_seconds=0.3)
    running = asyncio.create_task(driver.run("go", model))
    await abort_when_running(lane_stub, lane, {"call_1_1": "running"})
    result = await asyncio.wait_for(running, 5)
    assert result.status == ABORTED
    (placed,) = tool_results(await snapshot(lane_stub, lane))
    assert placed.is_error
    assert text_of(placed).startswith("halfway\n[interrupted]")
