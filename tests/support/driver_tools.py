"""Helpers for the driver SDK tests: tools that count and wait, polling, transcript reading."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from lane.client.model import ScriptedCall, ScriptStep
from lane.client.tools import Tool, ToolContext, ToolResultLike, content_text
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class Recorder:
    """Counts executions per tool and the largest number running at once."""

    executions: dict[str, int] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0

    def enter(self, name: str, call_id: str) -> None:
        self.executions[name] = self.executions.get(name, 0) + 1
        self.started.append(call_id)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)

    def leave(self) -> None:
        self.running -= 1


def tool(
    name: str,
    run: Callable[[dict[str, Any], ToolContext], Awaitable[ToolResultLike]],
    *,
    recorder: Recorder | None = None,
    parameters: dict[str, Any] | None = None,
    replay: str = "never",
) -> Tool:
    """A tool around ``run`` that records its executions in ``recorder``."""

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        if recorder is not None:
            recorder.enter(name, ctx.tool_call_id)
        try:
            return await run(args, ctx)
        finally:
            if recorder is not None:
                recorder.leave()

    return Tool(
        name=name,
        parameters=parameters or ANY_OBJECT,
        execute=execute,
        replay=replay,  # type: ignore[arg-type]
    )


def returns(text: str) -> Callable[[dict[str, Any], ToolContext], Awaitable[ToolResultLike]]:
    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        return text

    return run


def waits_for(
    event: asyncio.Event, text: str
) -> Callable[[dict[str, Any], ToolContext], Awaitable[ToolResultLike]]:
    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await event.wait()
        return text

    return run


def until_aborted(text: str) -> Callable[[dict[str, Any], ToolContext], Awaitable[ToolResultLike]]:
    """Runs until the run's abort is seen, then returns ``text`` (a real result)."""

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.abort_signal.wait()
        return text

    return run


def step(text: str, *calls: tuple[str, Any] | ScriptedCall, stop: int | None = None) -> ScriptStep:
    """A script step; calls as (name, args) pairs."""
    scripted = [c if isinstance(c, ScriptedCall) else ScriptedCall(c[0], c[1]) for c in calls]
    return ScriptStep(text, scripted, stop)  # type: ignore[arg-type]


async def snapshot(stub: Any, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    answer = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    result: snapshot_pb2.LaneSnapshot = answer.snapshot
    return result


async def until(
    check: Callable[[], Awaitable[bool]], *, seconds: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``check`` every 50 ms until it is true."""
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        await asyncio.sleep(0.05)


def rows(snap: snapshot_pb2.LaneSnapshot) -> dict[str, str]:
    """tool_call_id → "running" / "settled" for the open operation's tool rows."""
    return {
        getattr(row, row.WhichOneof("state") or "running").tool_call_id: row.WhichOneof("state")
        or ""
        for row in snap.operation.running_tools
    }


def tool_results(snap: snapshot_pb2.LaneSnapshot) -> list[messages_pb2.ToolResultMessage]:
    """The placed tool results, in transcript order."""
    return [
        e.message.message.tool_result
        for e in snap.transcript
        if e.WhichOneof("payload") == "message"
        and e.message.message.WhichOneof("message") == "tool_result"
    ]


def by_call(snap: snapshot_pb2.LaneSnapshot) -> dict[str, messages_pb2.ToolResultMessage]:
    return {r.tool_call_id: r for r in tool_results(snap)}


def text_of(result: messages_pb2.ToolResultMessage) -> str:
    return content_text(result.content)


async def operation_state(stub: Any, lane_id: str, operation_id: str) -> pb.OperationState:
    answer = await stub.GetOperation(
        pb.GetOperationRequest(lane_id=lane_id, operation_id=operation_id)
    )
    state: pb.OperationState = answer.state
    return state


async def open_operation_id(stub: Any, lane_id: str) -> str:
    """Wait for the lane's open operation; return its id."""
    found: list[str] = []

    async def has_operation() -> bool:
        try:
            snap = await snapshot(stub, lane_id)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return False  # the driver has not created the lane yet
            raise
        if snap.HasField("operation"):
            found.append(snap.operation.id)
            return True
        return False

    await until(has_operation, what="an open operation")
    return found[-1]
