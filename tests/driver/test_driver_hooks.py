"""before_tool and after_tool hooks through the real service."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from lane.client.driver import Driver
from lane.client.hooks import (
    AfterToolEvent,
    AfterToolPatch,
    BeforeToolDecision,
    BeforeToolEvent,
    Deny,
    Hooks,
    ReplaceArguments,
)
from lane.client.model import ScriptedModel
from lane.client.tools import ToolContext, ToolResult, ToolResultLike
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from tests.driver.support import (
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
    until,
    until_aborted,
)
from tests.integration.lanes import new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
TEXT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def echo_tool(recorder: Recorder, seen: list[dict[str, Any]]) -> Any:
    async def echo(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        seen.append(args)
        return f"echo {args['text']}"

    return tool("echo", echo, recorder=recorder, parameters=TEXT_SCHEMA)


async def test_before_tool_replaces_arguments_revalidated(lane_stub) -> None:
    lane = new_lane_id("hook-replace")
    probe = await started_probe(lane_stub, lane)
    recorder, seen = Recorder(), list[dict[str, Any]]()

    def rewrite(event: BeforeToolEvent) -> BeforeToolDecision:
        if event.args["text"] == "bad":
            return ReplaceArguments({"text": 42})  # fails the schema
        return ReplaceArguments({"text": event.args["text"].upper()})

    model = ScriptedModel(
        [step("two", ("echo", {"text": "quiet"}), ("echo", {"text": "bad"})), step("done")]
    )
    driver = Driver(
        lane_stub, lane, [echo_tool(recorder, seen)], hooks=Hooks(before_tool=[rewrite])
    )
    result = await driver.run("go", model)
    assert result.status == COMPLETED
    assert seen == [{"text": "QUIET"}]
    await probe.check(["call_1_1", "call_1_2"])
    starts = {
        e.tool_start.tool_call_id: e.tool_start for e in probe.events if e.HasField("tool_start")
    }
    assert json.loads(starts["call_1_1"].arguments_json) == {"text": "QUIET"}  # effective args
    results = by_call(await snapshot(lane_stub, lane))
    assert text_of(results["call_1_1"]) == "echo QUIET"
    assert results["call_1_2"].is_error
    assert "42 is not of type 'string'" in text_of(results["call_1_2"])


async def test_before_tool_deny_with_terminate_and_a_raising_hook_denies(lane_stub) -> None:
    lane = new_lane_id("hook-deny")
    recorder, seen = Recorder(), list[dict[str, Any]]()

    async def guard(event: BeforeToolEvent) -> BeforeToolDecision:
        if event.args["text"] == "boom":
            raise ValueError("guard crashed")
        return Deny("not today", terminate=True)

    model = ScriptedModel([step("two", ("echo", {"text": "x"}), ("echo", {"text": "boom"}))])
    driver = Driver(lane_stub, lane, [echo_tool(recorder, seen)], hooks=Hooks(before_tool=[guard]))
    result = await driver.run("go", model)
    assert recorder.executions == {}
    results = by_call(await snapshot(lane_stub, lane))
    assert results["call_1_1"].is_error and text_of(results["call_1_1"]) == "not today"
    assert results["call_1_2"].is_error
    assert text_of(results["call_1_2"]) == "before_tool hook failed: guard crashed"
    # The raising hook's denial does not terminate: the run takes another turn.
    assert result.status == COMPLETED and result.turns == 2


async def test_a_denial_with_terminate_on_every_call_ends_the_run(lane_stub) -> None:
    lane = new_lane_id("hook-deny-all")
    recorder, seen = Recorder(), list[dict[str, Any]]()
    model = ScriptedModel([step("one", ("echo", {"text": "x"})), step("never asked")])
    hooks = Hooks(before_tool=[lambda event: Deny("stop here", terminate=True)])
    result = await Driver(lane_stub, lane, [echo_tool(recorder, seen)], hooks=hooks).run(
        "go", model
    )
    assert result.status == COMPLETED and result.turns == 1 and model.calls == 1
    snap = await snapshot(lane_stub, lane)
    (entry,) = [e for e in snap.transcript if e.message.message.HasField("tool_result")]
    assert entry.message.terminate and text_of(entry.message.message.tool_result) == "stop here"


async def test_after_tool_patches_content_details_error_usage_and_terminate(lane_stub) -> None:
    lane = new_lane_id("hook-after")
    seen_events: list[AfterToolEvent] = []

    async def produce(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        return ToolResult(content="raw", details={"raw": True})

    def patch(event: AfterToolEvent) -> AfterToolPatch:
        seen_events.append(event)
        return AfterToolPatch(
            content=["patched", "twice"],
            details={"patched": True},
            is_error=True,
            usage=messages_pb2.Usage(input=3, output=4, total_tokens=7),
            terminate=True,
        )

    def keep_going(event: AfterToolEvent) -> AfterToolPatch:
        assert event.is_error and event.details == {"patched": True}  # sees the earlier patch
        return AfterToolPatch(details=None)

    model = ScriptedModel([step("one", ("produce", {"a": 1})), step("never asked")])
    hooks = Hooks(after_tool=[patch, keep_going])
    result = await Driver(lane_stub, lane, [tool("produce", produce)], hooks=hooks).run("go", model)
    assert result.status == COMPLETED and result.turns == 1  # terminate patched in
    (event,) = seen_events
    assert event.args == {"a": 1} and event.details == {"raw": True} and not event.is_error
    assert [b.text.text for b in event.content] == ["raw"] and not event.replayed
    snap = await snapshot(lane_stub, lane)
    (entry,) = [e for e in snap.transcript if e.message.message.HasField("tool_result")]
    placed = entry.message.message.tool_result
    assert [b.text.text for b in placed.content] == ["patched", "twice"]
    assert placed.is_error and not placed.HasField("details_json")
    assert placed.usage.total_tokens == 7 and entry.message.terminate


async def test_a_raising_after_tool_hook_makes_an_error_result(lane_stub) -> None:
    lane = new_lane_id("hook-after-raise")

    def broken(event: AfterToolEvent) -> AfterToolPatch:
        raise KeyError("missing")

    model = ScriptedModel([step("one", ("ok", {})), step("done")])
    hooks = Hooks(after_tool=[broken])
    result = await Driver(lane_stub, lane, [tool("ok", returns("fine"))], hooks=hooks).run(
        "go", model
    )
    assert result.status == COMPLETED
    (placed,) = by_call(await snapshot(lane_stub, lane)).values()
    assert placed.is_error and text_of(placed) == "after_tool hook failed: 'missing'"


async def test_after_tool_is_skipped_once_an_abort_began(lane_stub) -> None:
    lane = new_lane_id("hook-after-abort")
    patched: list[str] = []

    def patch(event: AfterToolEvent) -> AfterToolPatch:
        patched.append(event.tool_call_id)
        return AfterToolPatch(content="patched")

    model = ScriptedModel([step("one", ("wait", {})), step("never asked")])
    driver = Driver(
        lane_stub,
        lane,
        [tool("wait", until_aborted("stopped early"))],
        hooks=Hooks(after_tool=[patch]),
    )
    running = asyncio.create_task(driver.run("go", model))
    operation_id = await open_operation_id(lane_stub, lane)

    async def tool_running() -> bool:
        return rows(await snapshot(lane_stub, lane)) == {"call_1_1": "running"}

    await until(tool_running, what="the tool to run")
    await lane_stub.AbortOperation(
        pb.AbortOperationRequest(lane_id=lane, operation_id=operation_id)
    )
    result = await running
    assert result.status == ABORTED
    assert patched == []
    (placed,) = by_call(await snapshot(lane_stub, lane)).values()
    assert text_of(placed) == "stopped early" and not placed.is_error
