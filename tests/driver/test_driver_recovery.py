"""Recovery by a second driver after the first one died: safe replay executes again, a
never-replay call gets an interruption result, staged results are never executed again,
planned calls take the ordinary flow; and a driver whose lease was taken over stops."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from lane.client.driver import Driver, LeaseLost
from lane.client.hooks import BeforeToolDecision, BeforeToolEvent, Hooks
from lane.client.model import ScriptedModel
from lane.client.tools import Tool, ToolContext, ToolResultLike
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.driver.support import (
    HangingModel,
    Recorder,
    by_call,
    open_operation_id,
    operation_state,
    returns,
    snapshot,
    started_probe,
    step,
    text_of,
    tool,
    until,
)
from tests.integration.lanes import new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED


def hangs_after_checkpoint(text: str) -> Any:
    """A first incarnation that checkpoints ``text`` and then never finishes (the crash)."""

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.checkpoint(text)
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    return run


async def crash(task: asyncio.Task[Any]) -> None:
    """Kill a driver the way a crash would: no EndRun, no lease release."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def rows_ready(stub: Any, lane: str, expected: dict[str, str]) -> None:
    """Wait until the tool rows have these states, running rows with their checkpoint."""

    async def ready() -> bool:
        found = {}
        for row in (await snapshot(stub, lane)).operation.running_tools:
            state = row.WhichOneof("state") or ""
            body = getattr(row, state)
            if state == "running" and not body.HasField("result"):
                return False
            found[body.tool_call_id] = state
        return found == expected

    await until(ready, what=f"tool rows {expected}")


async def test_a_second_driver_replays_safe_calls_and_interrupts_never_calls(lane_stub) -> None:
    lane = new_lane_id("recover")
    probe = await started_probe(lane_stub, lane)
    recorder = Recorder()
    script = [
        step("three", ("launch", {"n": 1}), ("fetch", {"n": 2}), ("quick", {"n": 3})),
        step("all done"),
    ]
    first: list[Tool] = [
        tool("launch", hangs_after_checkpoint("launch halfway"), recorder=recorder),
        tool("fetch", hangs_after_checkpoint("fetch halfway"), recorder=recorder, replay="safe"),
        tool("quick", returns("quick result"), recorder=recorder, replay="safe"),
    ]
    driver1 = Driver(lane_stub, lane, first, driver_id="driver-1", lease_seconds=1)
    running = asyncio.create_task(driver1.run("go", ScriptedModel(script)))
    operation_id = await open_operation_id(lane_stub, lane)
    await rows_ready(
        lane_stub, lane, {"call_1_1": "running", "call_1_2": "running", "call_1_3": "settled"}
    )
    await crash(running)
    await probe.check(["call_1_1", "call_1_2", "call_1_3"])

    replay_args: list[dict[str, Any]] = []

    async def fetch_again(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        assert ctx.replaying
        replay_args.append(args)
        return "fetched again"

    second: list[Tool] = [
        tool("launch", returns("launched twice!"), recorder=recorder),
        tool("fetch", fetch_again, recorder=recorder, replay="safe"),
        tool("quick", returns("quick twice!"), recorder=recorder, replay="safe"),
    ]
    driver2 = Driver(lane_stub, lane, second, driver_id="driver-2")
    model2 = ScriptedModel(script)
    result = await driver2.recover(operation_id, model2, wait_seconds=10)
    assert result.status == COMPLETED and result.turns == 1 and model2.calls == 1
    # Executions over both drivers: only the safe call ran twice.
    assert recorder.executions == {"launch": 1, "fetch": 2, "quick": 1}
    assert replay_args == [{"n": 2}]
    await probe.check(["call_1_1", "call_1_2", "call_1_3"])
    results = by_call(await snapshot(lane_stub, lane))
    assert results["call_1_1"].is_error
    assert text_of(results["call_1_1"]).startswith("launch halfway\n[interrupted]")
    assert text_of(results["call_1_2"]) == "fetched again" and not results["call_1_2"].is_error
    assert text_of(results["call_1_3"]) == "quick result"
    recovered = [e for e in probe.events if e.recovery]
    assert recovered[0].WhichOneof("kind") == "turn_start"
    replay_starts = [e.tool_start.tool_call_id for e in recovered if e.HasField("tool_start")]
    assert replay_starts == ["call_1_2"]


async def test_recovery_of_a_sequential_batch_runs_its_planned_calls_normally(lane_stub) -> None:
    lane = new_lane_id("recover-seq")
    recorder = Recorder()
    hooked: list[str] = []

    def note(event: BeforeToolEvent) -> BeforeToolDecision:
        hooked.append(event.tool_call_id)
        return None

    script = [step("two", ("launch", {}), ("quick", {})), step("done")]
    sequential = pb.RunSettings(tool_execution=pb.TOOL_EXECUTION_SEQUENTIAL)
    first = [
        tool("launch", hangs_after_checkpoint("started"), recorder=recorder),
        tool("quick", returns("quick"), recorder=recorder),
    ]
    driver1 = Driver(lane_stub, lane, first, lease_seconds=1, settings=sequential)
    running = asyncio.create_task(driver1.run("go", ScriptedModel(script)))
    operation_id = await open_operation_id(lane_stub, lane)
    await rows_ready(lane_stub, lane, {"call_1_1": "running"})
    await crash(running)
    second = [tool("quick", returns("quick"), recorder=recorder)]  # launch is gone entirely
    driver2 = Driver(lane_stub, lane, second, hooks=Hooks(before_tool=[note]))
    result = await driver2.recover(operation_id, ScriptedModel(script), wait_seconds=10)
    assert result.status == COMPLETED
    assert recorder.executions == {"launch": 1, "quick": 1}
    assert hooked == ["call_1_2"]  # the planned call went through before_tool
    results = by_call(await snapshot(lane_stub, lane))
    assert results["call_1_1"].is_error and "[interrupted]" in text_of(results["call_1_1"])
    assert text_of(results["call_1_2"]) == "quick"


async def test_recovery_of_an_open_turn_asks_the_model_again(lane_stub) -> None:
    lane = new_lane_id("recover-turn")
    model = HangingModel()
    driver1 = Driver(lane_stub, lane, [], lease_seconds=1)
    running = asyncio.create_task(driver1.run("go", model))
    operation_id = await open_operation_id(lane_stub, lane)
    await model.wait_asked()
    await crash(running)
    driver2 = Driver(lane_stub, lane, [])
    result = await driver2.recover(operation_id, ScriptedModel([step("answered")]), wait_seconds=10)
    assert result.status == COMPLETED
    snap = await snapshot(lane_stub, lane)
    kinds = [e.message.message.WhichOneof("message") for e in snap.transcript]
    assert kinds == ["user", "assistant"]


async def test_a_driver_whose_lease_was_taken_over_stops_with_lease_lost(lane_stub) -> None:
    lane = new_lane_id("recover-fenced")
    recorder = Recorder()
    model = ScriptedModel([step("one", ("launch", {})), step("done")])
    driver1 = Driver(
        lane_stub,
        lane,
        [tool("launch", hangs_after_checkpoint("working"), recorder=recorder)],
        lease_seconds=1,
    )
    running = asyncio.create_task(driver1.run("go", model))
    operation_id = await open_operation_id(lane_stub, lane)
    await rows_ready(lane_stub, lane, {"call_1_1": "running"})
    state = await operation_state(lane_stub, lane, operation_id)
    # Someone forces the run away from driver 1 (as an operator would after a partition).
    await lane_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(
            lane_id=lane, operation_id=operation_id, lease_token=state.lease.token
        )
    )
    taken = await lane_stub.AcquireOperation(
        pb.AcquireOperationRequest(lane_id=lane, operation_id=operation_id, driver_id="operator")
    )
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(running, 5)
    ended = await lane_stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane,
            operation_id=operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            lease_token=taken.lease.token,
        )
    )
    assert ended.result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
    assert recorder.executions == {"launch": 1}
