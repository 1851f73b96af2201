"""A lane whose transcript is far beyond 4 MiB, which GetLaneSnapshot refuses: the driver reads
the lane from its run's watch instead, so runs start, continue, are taken over and complete on
it, and the model is asked with the whole transcript every turn."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import pytest
from lane.client.driver import Driver
from lane.client.errors import lane_error
from lane.client.model import Model, ModelRequest, ScriptedModel
from lane.client.tools import ToolContext, ToolResultLike
from lane.client.watch import watch_lane
from lane.v1 import messages_pb2, snapshot_pb2

from tests.driver.support import returns, snapshot, step, tool, tool_results
from tests.integration.lanes import new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
#: Each result just under the 512 KiB payload limit; twelve of them make about 5.3 MiB.
BLOB_BYTES = 450 * 1024


def counting(model: Model, asked: list[int]) -> Model:
    """``model``, noting how many messages each request carries."""

    async def answer(request: ModelRequest) -> messages_pb2.AssistantMessage:
        asked.append(len(request.messages))
        return await model(request)

    return answer


async def blob(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
    return ctx.tool_call_id[-1] * BLOB_BYTES


async def capture(stub: Any, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    """The lane now, from a watch (GetLaneSnapshot refuses it)."""
    async with contextlib.aclosing(watch_lane(stub, lane_id)) as views:
        async for view in views:
            return view.snapshot
    raise AssertionError("the watch ended without a snapshot")


async def test_runs_and_a_takeover_on_a_lane_beyond_4_mib(lane_stub: Any) -> None:
    lane = new_lane_id("large")
    asked: list[int] = []
    fill = [step(f"fill {k}", ("blob", {}), ("blob", {}), ("blob", {})) for k in range(4)]
    first = await Driver(lane_stub, lane, [tool("blob", blob)]).run(
        "fill the lane", counting(ScriptedModel(fill), asked)
    )
    assert first.status == COMPLETED
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await snapshot(lane_stub, lane)
    assert lane_error(refused.value).reason == "SNAPSHOT_TOO_LARGE"
    # The prompt, then each turn's assistant message and its three results.
    assert asked == [1, 5, 9, 13, 17]

    # A second run whose driver dies mid-call; a third driver takes it over.
    started = asyncio.Event()

    async def hangs(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.checkpoint("halfway")
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    script = [step("one more", ("launch", {})), step("done")]
    second = Driver(lane_stub, lane, [tool("launch", hangs)], driver_id="large-2", lease_seconds=1)
    running = asyncio.create_task(
        second.run("and once more", counting(ScriptedModel(script), asked))
    )
    await asyncio.wait_for(started.wait(), 30)
    operation_id = second.operation_id
    assert operation_id is not None
    running.cancel()  # a crash: no EndRun, no lease release
    with contextlib.suppress(asyncio.CancelledError):
        await running

    third = Driver(lane_stub, lane, [tool("launch", returns("again!"))], driver_id="large-3")
    result = await third.recover(
        operation_id, counting(ScriptedModel(script), asked), wait_seconds=10
    )
    assert result.status == COMPLETED
    # Run 1's 18 messages, the prompt (19), the launch turn (20), its interruption (21).
    assert asked == [1, 5, 9, 13, 17, 19, 21]
    lane_now = await capture(lane_stub, lane)
    assert lane_now.revision > 0 and len(lane_now.transcript) == 22
    interrupted = tool_results(lane_now)[-1]
    assert interrupted.is_error
    assert interrupted.content[0].text.text == "halfway"
