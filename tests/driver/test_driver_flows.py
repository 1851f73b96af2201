"""The driver SDK's tool flow against the real service: parallel and sequential batches,
synthetic outcomes from preparation, errors, progress, terminate, model failures."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from lane.client.driver import Driver
from lane.client.model import ScriptedModel
from lane.client.tools import ToolContext, ToolResult, ToolResultLike
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from tests.driver.support import (
    Recorder,
    by_call,
    returns,
    rows,
    snapshot,
    started_probe,
    step,
    text_of,
    tool,
    tool_results,
    until,
    waits_for,
)
from tests.integration.lanes import kinds, new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED


async def test_parallel_batch_a_later_call_settles_first_and_waits_for_placement(
    lane_stub,
) -> None:
    lane = new_lane_id("drv-par")
    probe = await started_probe(lane_stub, lane)
    release = asyncio.Event()
    recorder = Recorder()
    tools = [
        tool("slow", waits_for(release, "slow done"), recorder=recorder),
        tool("fast", returns("fast done"), recorder=recorder),
    ]
    model = ScriptedModel([step("two at once", ("slow", {}), ("fast", {})), step("done")])
    driver = Driver(lane_stub, lane, tools)
    running = asyncio.create_task(driver.run("go", model))

    async def fast_waits() -> bool:
        snap = await snapshot(lane_stub, lane)
        return rows(snap) == {"call_1_1": "running", "call_1_2": "settled"}

    await until(fast_waits, what="fast settled while slow runs")
    # Settled but not placed: fold == capture, each call in exactly one place.
    await probe.check(["call_1_1", "call_1_2"])
    settled = (await snapshot(lane_stub, lane)).operation.running_tools[1].settled
    assert settled.result.content[0].text.text == "fast done" and not settled.is_error
    assert tool_results(await snapshot(lane_stub, lane)) == []
    release.set()
    result = await running
    assert result.status == COMPLETED and result.turns == 2
    assert recorder.most_at_once == 2
    events = await probe.check(["call_1_1", "call_1_2"])
    final = await snapshot(lane_stub, lane)
    assert [r.tool_call_id for r in tool_results(final)] == ["call_1_1", "call_1_2"]
    assert [text_of(r) for r in tool_results(final)] == ["slow done", "fast done"]
    assert final.last_result.status == COMPLETED and not final.HasField("operation")
    ends = [e.tool_end.tool_call_id for e in probe.events if e.HasField("tool_end")]
    assert ends == ["call_1_2", "call_1_1"]  # the later call settled first
    assert "run_end" in kinds(events)


async def test_sequential_batch_runs_one_call_at_a_time_in_source_order(lane_stub) -> None:
    lane = new_lane_id("drv-seq")
    probe = await started_probe(lane_stub, lane)
    recorder = Recorder()

    async def nap(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await asyncio.sleep(0.05)
        return f"napped {args['n']}"

    tools = [tool("nap", nap, recorder=recorder)]
    model = ScriptedModel([step("three", *(("nap", {"n": n}) for n in range(3))), step("done")])
    driver = Driver(
        lane_stub,
        lane,
        tools,
        settings=pb.RunSettings(tool_execution=pb.TOOL_EXECUTION_SEQUENTIAL),
    )
    result = await driver.run("go", model)
    assert result.status == COMPLETED
    assert recorder.most_at_once == 1
    assert recorder.started == ["call_1_1", "call_1_2", "call_1_3"]
    await probe.check(["call_1_1", "call_1_2", "call_1_3"])
    final = await snapshot(lane_stub, lane)
    assert [text_of(r) for r in tool_results(final)] == ["napped 0", "napped 1", "napped 2"]
    # One call at a time: each call is placed before the next one starts.
    order = [
        (e.WhichOneof("kind"), e.tool_start.tool_call_id or e.entry_added.entry.id)
        for e in probe.events
        if e.WhichOneof("kind") in ("tool_start", "entry_added")
    ]
    starts = [i for i, (kind, _) in enumerate(order) if kind == "tool_start"]
    assert all(order[i + 1][0] == "entry_added" for i in starts)


async def test_unknown_tool_invalid_arguments_and_length_get_synthetic_results(lane_stub) -> None:
    lane = new_lane_id("drv-synth")
    probe = await started_probe(lane_stub, lane)
    recorder = Recorder()
    echo = tool(
        "echo",
        returns("echoed"),
        recorder=recorder,
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    )
    model = ScriptedModel(
        [
            step("mixed", ("nope", {}), ("echo", {"words": 1}), ("echo", {"text": "hi"})),
            step("cut off", ("echo", {"text": "hi"}), stop=messages_pb2.STOP_REASON_LENGTH),
            step("done"),
        ]
    )
    result = await Driver(lane_stub, lane, [echo]).run("go", model)
    assert result.status == COMPLETED and result.turns == 3
    assert recorder.executions == {"echo": 1}  # only the valid call ran
    await probe.check(["call_1_1", "call_1_2", "call_1_3", "call_2_1"])
    results = by_call(await snapshot(lane_stub, lane))
    assert results["call_1_1"].is_error
    assert text_of(results["call_1_1"]) == "Tool nope is not available."
    assert results["call_1_2"].is_error
    assert "'text' is a required property" in text_of(results["call_1_2"])
    assert not results["call_1_3"].is_error and text_of(results["call_1_3"]) == "echoed"
    assert results["call_2_1"].is_error
    assert "output token limit" in text_of(results["call_2_1"])
    # A synthetic call's tool_start and tool_end come in one staging commit.
    synthetic = [e for e in probe.events if e.tool_start.tool_call_id == "call_1_1"]
    assert len(synthetic) == 1 and synthetic[0].tool_start.tool_name == "nope"
    for result_message in results.values():
        assert not result_message.HasField("details_json")


async def test_a_tool_use_stop_without_calls_fails_the_run(lane_stub) -> None:
    # The service would refuse to complete the run on it (RUN_NEEDS_ASSISTANT): the driver
    # ends it FAILED, with the message kept in the transcript.
    lane = new_lane_id("drv-nocalls")
    model = ScriptedModel([step("I'll look", stop=messages_pb2.STOP_REASON_TOOL_USE)])
    result = await Driver(lane_stub, lane, []).run("go", model)
    assert result.status == FAILED and result.turns == 1
    assert result.result.error.code == "tool_use_without_calls"
    transcript = (await snapshot(lane_stub, lane)).transcript
    assert transcript[-1].message.message.assistant.stop_reason == (
        messages_pb2.STOP_REASON_TOOL_USE
    )


async def test_a_tool_that_raises_gets_an_error_result_with_its_message(lane_stub) -> None:
    lane = new_lane_id("drv-raise")

    async def broken(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        raise RuntimeError("disk on fire")

    model = ScriptedModel([step("try", ("broken", {})), step("done")])
    result = await Driver(lane_stub, lane, [tool("broken", broken)]).run("go", model)
    assert result.status == COMPLETED
    (placed,) = tool_results(await snapshot(lane_stub, lane))
    assert placed.is_error and text_of(placed) == "disk on fire"


async def test_a_result_over_the_services_limit_becomes_an_error_result(lane_stub) -> None:
    lane = new_lane_id("drv-huge")

    async def verbose(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        return "x" * int(args["size"])

    over, under = ("verbose", {"size": 600_000}), ("verbose", {"size": 500_000})
    model = ScriptedModel([step("big", over), step("fits", under), step("done")])
    result = await Driver(lane_stub, lane, [tool("verbose", verbose)]).run("go", model)
    assert result.status == COMPLETED
    too_big, fits = tool_results(await snapshot(lane_stub, lane))
    assert too_big.is_error and "more than the 524288" in text_of(too_big)
    assert not fits.is_error and text_of(fits) == "x" * 500_000


async def test_progress_and_checkpoints_are_tool_updates(lane_stub) -> None:
    lane = new_lane_id("drv-progress")
    probe = await started_probe(lane_stub, lane)

    async def counting(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.progress("1 of 3")
        await ctx.checkpoint(ToolResult(content="2 of 3", details={"done": 2}))
        await ctx.progress(messages_pb2.ToolResult(content=[]))
        return ToolResult(content="3 of 3", details={"done": 3, "big": 2**70})

    model = ScriptedModel([step("count", ("count", {})), step("done")])
    result = await Driver(lane_stub, lane, [tool("count", counting)]).run("go", model)
    assert result.status == COMPLETED
    await probe.check(["call_1_1"])
    updates = [e.tool_update for e in probe.events if e.HasField("tool_update")]
    assert [u.checkpoint for u in updates] == [False, True, False]
    assert updates[0].partial_result.content[0].text.text == "1 of 3"
    assert json.loads(updates[1].partial_result.details_json) == {"done": 2}
    (placed,) = tool_results(await snapshot(lane_stub, lane))
    assert json.loads(placed.details_json) == {"done": 3, "big": 2**70}


async def test_a_batch_whose_calls_all_terminate_completes_the_run(lane_stub) -> None:
    lane = new_lane_id("drv-term")

    async def final(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        return ToolResult(content="that's it", terminate=True)

    model = ScriptedModel([step("last", ("final", {}), ("final", {})), step("never asked")])
    result = await Driver(lane_stub, lane, [tool("final", final)]).run("go", model)
    assert result.status == COMPLETED and result.turns == 1 and model.calls == 1
    snap = await snapshot(lane_stub, lane)
    entries = [e for e in snap.transcript if e.message.message.HasField("tool_result")]
    assert [e.message.terminate for e in entries] == [True, True]


async def test_a_model_that_raises_ends_the_run_failed(lane_stub) -> None:
    lane = new_lane_id("drv-model")

    async def broken_model(request: Any) -> messages_pb2.AssistantMessage:
        raise ConnectionError("provider down")

    result = await Driver(lane_stub, lane, []).run("go", broken_model)
    assert result.status == FAILED
    assert result.result.error.code == "model_error"
    assert result.result.error.message == "provider down"
    snap = await snapshot(lane_stub, lane)
    assert snap.last_result.status == FAILED and not snap.HasField("operation")


async def test_a_tool_the_lane_does_not_activate_is_unknown(lane_stub) -> None:
    lane = new_lane_id("drv-active")
    await lane_stub.CreateLane(
        pb.CreateLaneRequest(
            lane_id=lane, configuration=snapshot_pb2.LaneConfiguration(active_tool_names=["echo"])
        )
    )
    recorder = Recorder()
    offered: list[list[str]] = []
    scripted = ScriptedModel([step("both", ("echo", {}), ("other", {})), step("done")])

    async def model(request: Any) -> messages_pb2.AssistantMessage:
        offered.append([t.name for t in request.tools])
        return await scripted(request)

    tools = [tool("echo", returns("e"), recorder=recorder), tool("other", returns("o"))]
    result = await Driver(lane_stub, lane, tools).run("go", model)
    assert result.status == COMPLETED
    assert offered == [["echo"], ["echo"]]
    results = by_call(await snapshot(lane_stub, lane))
    assert text_of(results["call_1_1"]) == "e"
    assert results["call_1_2"].is_error and text_of(results["call_1_2"]) == (
        "Tool other is not available."
    )


async def test_a_plain_function_tool_runs_in_a_thread_and_its_result_is_placed(
    lane_stub,
) -> None:
    """``Tool(execute=<plain def>)``: once every call failed ("An asyncio.Future ... is
    required") while the run reported completed."""
    from lane.client import Tool

    threads: list[str] = []

    def add(args: dict[str, Any], ctx: ToolContext) -> str:
        import threading

        threads.append(threading.current_thread().name)
        return f"{args['a'] + args['b']} (call {ctx.tool_call_id})"

    adder = Tool(name="add", parameters={"type": "object"}, execute=add)
    lane = new_lane_id("drv-plain")
    model = ScriptedModel([step("adding", ("add", {"a": 2, "b": 3})), step("done")])
    result = await Driver(lane_stub, lane, [adder]).run("add", model)
    assert result.status == COMPLETED
    placed = by_call(await snapshot(lane_stub, lane))["call_1_1"]
    assert not placed.is_error and text_of(placed) == "5 (call call_1_1)"
    assert threads and threads[0] != "MainThread"


async def test_what_the_readme_examples_import_comes_from_lane_client() -> None:
    import lane.client as client

    for name in ("Deny", "ReplaceArguments", "AfterToolPatch", "RunSettings", "Unreachable"):
        assert name in client.__all__ and hasattr(client, name), name
    settings = client.RunSettings(tool_execution=client.TOOL_EXECUTION_SEQUENTIAL)
    assert settings.tool_execution == pb.TOOL_EXECUTION_SEQUENTIAL
