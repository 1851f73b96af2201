"""Capture faults loudly on corrupt state (docs/contract.md: invariant 6, Tool calls).

Each test drives a dedicated lane into a tool batch through the RPCs, then corrupts its rows
with SQL. Capture must answer DATA_LOSS (reason LANE_STATE_CORRUPT) naming the lane and the
tool call, never a wrong snapshot. Placement reads the same staged results and must fault the
same way rather than place a result that is missing or belongs to another call.

The batch (from test_refusals' "blocked" state): the assistant message is
[text, c0, c1]; c0 (source index 1) is effect_pending, c1 (source index 2) is outcome_ready and
waits for c0.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from lane.client.testing import Aim
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

from tests.integration.lanes import error_info, hand_edit, result, text
from tests.integration.test_refusals import Ctx, build

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def corruptible_lane(stub: Any) -> Ctx:
    ctx = await build(stub, "blocked", prefix="corrupt")
    # The lane captures fine before it is corrupted.
    await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=ctx.lane_id))
    return ctx


async def execute(store: Any, sql: str, *params: Any) -> None:
    async with hand_edit(store) as conn, conn.transaction():
        cur = await conn.execute(sql, params)
        assert cur.rowcount == 1, f"{sql} changed {cur.rowcount} rows"


async def set_call(store: Any, ctx: Ctx, call_id: str, column: str, value: Any) -> None:
    await execute(
        store,
        f"UPDATE tool_calls SET {column} = %s WHERE operation_id = %s AND tool_call_id = %s",
        value,
        ctx.operation_id,
        call_id,
    )


def staged(call_id: str, name: str) -> bytes:
    message = messages_pb2.ToolResultMessage(
        tool_call_id=call_id, tool_name=name, content=[text("not mine")]
    )
    return message.SerializeToString(deterministic=True)


def assert_corrupt(error: grpc.aio.AioRpcError, ctx: Ctx, call_id: str) -> None:
    assert error.code() == grpc.StatusCode.DATA_LOSS, f"{error.code().name}: {error.details()}"
    info = error_info(error)
    assert info.reason == "LANE_STATE_CORRUPT" and info.domain == "lane.v1"
    details = error.details() or ""
    assert ctx.lane_id in details and call_id in details, details
    assert info.metadata["laneId"] == ctx.lane_id
    assert info.metadata["toolCallId"] == call_id


Corruption = Callable[[Any, Ctx], Awaitable[str]]  # corrupts the lane; returns the call id


async def outcome_ready_without_staged_result(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c1", "result_message", None)
    return "c1"


async def staged_result_of_another_call(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c1", "result_message", staged("c0", "t"))
    return "c1"


async def staged_result_of_another_tool(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c1", "result_message", staged("c1", "other_tool"))
    return "c1"


async def effect_pending_without_arguments(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c0", "arguments_json", None)
    return "c0"


async def source_index_at_a_text_block(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c0", "source_index", 0)  # content[0] is the text block
    return "c0"


async def source_index_past_the_content(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c1", "source_index", 7)
    return "c1"


async def call_row_naming_another_tool(store: Any, ctx: Ctx) -> str:
    await set_call(store, ctx, "c0", "tool_name", "renamed")
    return "c0"


CORRUPTIONS: dict[str, Corruption] = {
    "outcome_ready_without_staged_result": outcome_ready_without_staged_result,
    "staged_result_of_another_call": staged_result_of_another_call,
    "staged_result_of_another_tool": staged_result_of_another_tool,
    "effect_pending_without_arguments": effect_pending_without_arguments,
    "source_index_at_a_text_block": source_index_at_a_text_block,
    "source_index_past_the_content": source_index_past_the_content,
    "call_row_naming_another_tool": call_row_naming_another_tool,
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_snapshot_faults_on_corrupt_state(lane_stub, store, corruption: str) -> None:
    ctx = await corruptible_lane(lane_stub)
    call_id = await CORRUPTIONS[corruption](store, ctx)
    with pytest.raises(grpc.aio.AioRpcError) as faulted:
        answer = await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=ctx.lane_id))
        pytest.fail(f"captured a snapshot of a corrupt lane: {answer}")
    assert_corrupt(faulted.value, ctx, call_id)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_watch_faults_on_corrupt_state(lane_stub, store, corruption: str) -> None:
    ctx = await corruptible_lane(lane_stub)
    call_id = await CORRUPTIONS[corruption](store, ctx)
    watch = lane_stub.WatchLane(pb.WatchLaneRequest(lane_id=ctx.lane_id))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as faulted:
            first = await watch.read()
            pytest.fail(f"a watch of a corrupt lane sent {first}")
    finally:
        watch.cancel()
    assert_corrupt(faulted.value, ctx, call_id)


async def test_corruption_stays_on_its_lane(lane_stub, store) -> None:
    corrupt = await corruptible_lane(lane_stub)
    healthy = await corruptible_lane(lane_stub)
    await outcome_ready_without_staged_result(store, corrupt)
    snapshot = (
        await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=healthy.lane_id))
    ).snapshot
    rows = [row.WhichOneof("state") for row in snapshot.operation.running_tools]
    assert rows == ["running", "settled"]
    listed = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=1000))
    assert listed.lanes or listed.next_page_token


async def result_entry_id(store: Any, ctx: Ctx, call_id: str) -> str:
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT result_entry_id FROM tool_calls WHERE operation_id = %s AND tool_call_id = %s",
            (ctx.operation_id, call_id),
        )
        row = await cur.fetchone()
    assert row is not None
    entry_id: str = row[0]
    return entry_id


async def placed_entry(store: Any, ctx: Ctx, entry_id: str) -> bool:
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT 1 FROM entries WHERE lane_id = %s AND entry_id = %s", (ctx.lane_id, entry_id)
        )
        return await cur.fetchone() is not None


@pytest.mark.parametrize(
    "corruption",
    [
        "outcome_ready_without_staged_result",
        "staged_result_of_another_call",
        "staged_result_of_another_tool",
    ],
)
async def test_placement_faults_instead_of_placing_a_corrupt_result(
    lane_stub, store, corruption: str
) -> None:
    # Staging c0 makes [c0, c1] the ready prefix; c1's staged result is corrupt, so placement
    # must fault (docs/contract.md, invariant 6) and never place it.
    ctx = await corruptible_lane(lane_stub)
    c1_entry = await result_entry_id(store, ctx, "c1")
    call_id = await CORRUPTIONS[corruption](store, ctx)
    with pytest.raises(grpc.aio.AioRpcError) as faulted:
        c0 = Aim(ctx.lane_id, ctx.operation_id, tool_call_id="c0")
        answer = await lane_stub.StageToolOutcome(
            c0.request(
                pb.StageToolOutcomeRequest, executed=pb.ExecutedOutcome(result=result("c0 done"))
            )
        )
        pytest.fail(f"placed a corrupt staged result: {answer}")
    assert_corrupt(faulted.value, ctx, call_id)
    assert not await placed_entry(store, ctx, c1_entry)
