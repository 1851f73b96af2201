"""Commits larger than one gRPC message, as every reader sees them.

Once such commits were refused (``COMMIT_TOO_LARGE``); now a commit of any size is stored, and
what it leaves to deliver over 4 MiB travels in parts (lane.v1.MessagePart). A run ends a
batch at the call limit whose staged results were never placed: the run's end places them all
in one event group of some 40 MiB. Then the lane as folded by a watcher that followed all
along, by a raw stream resumed from revision 0, by the TypeScript watcher, from ExportLane's
event log, from a fresh WatchLane snapshot and from GetLaneSnapshot over DriveLane (its answer
in parts) is one and the same.

A lane whose inbox holds 20 MiB of queued messages (beyond one message, within the inbox
budget) starts a run that captures them all, in one commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from lane.client.driver import Driver
from lane.client.errors import LaneError
from lane.client.message_parts import PartJoiner
from lane.client.model import ScriptedModel
from lane.client.reducer import fold
from lane.client.session import LaneSession
from lane.client.testing import LaneScript
from lane.client.watch import watch_lane
from lane.limits import MAX_INBOX_BYTES, MAX_MESSAGE_BYTES, MAX_PAYLOAD_BYTES
from lane.v1 import events_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.server import RunningServer
from lane.server.domain.export_format import EVENT_GROUP
from lane.server.domain.limits import MAX_TOOL_CALLS
from tests.integration.lanes import assistant, error_info, text, tool_call
from tests.integration.test_typescript_session import node_session
from tests.integration.test_typescript_watcher import NodeFollower
from tests.support.driver_tools import step, tool

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]

ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
#: Each staged result; the batch's results add up to some 13 MiB, and ending the run places
#: each in three events (message_start, message_end, entry_added): a group of some 40 MiB.
RESULT_BYTES = 52 * 1024


async def first_view(stub: Any, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    """A fresh WatchLane snapshot (its transcript in chunks)."""
    async with contextlib.aclosing(watch_lane(stub, lane_id)) as views:
        async for view in views:
            return view.snapshot
    raise AssertionError("the watch ended without a snapshot")


async def follow(stub: Any, lane_id: str, latest: list[snapshot_pb2.LaneSnapshot]) -> None:
    """Follow the lane for ever, ``latest`` holding only the latest view's snapshot."""
    async with contextlib.aclosing(watch_lane(stub, lane_id, idle_timeout=None)) as views:
        async for view in views:
            latest[:] = [view.snapshot]


async def reached(latest: list[snapshot_pb2.LaneSnapshot], revision: int) -> None:
    """Wait until the follower's latest view is at ``revision``."""
    async with asyncio.timeout(120):
        while not latest or latest[0].revision < revision:  # noqa: ASYNC110 (no event to await)
            await asyncio.sleep(0.05)


async def resumed_from_zero(
    stub: Any, lane_id: str, until: int, after: int = 0
) -> tuple[list[list[events_pb2.HarnessEvent]], int]:
    """Every event group of the lane after ``after``, read raw with WatchLane(after_revision),
    its parts joined: the groups, and how many part messages came (each checked within the
    limit)."""
    groups: list[list[events_pb2.HarnessEvent]] = []
    parts = 0
    joiner: PartJoiner[pb.WatchLaneResponse] = PartJoiner()
    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id, after_revision=after))
    try:
        async for received in call:
            assert received.ByteSize() <= MAX_MESSAGE_BYTES
            if received.HasField("part"):
                parts += 1
            response = joiner.take(received)
            if response is None or response.WhichOneof("item") != "event_group":
                continue
            groups.append(list(response.event_group.events))
            if groups[-1][-1].revision >= until:
                break
    finally:
        call.cancel()
    return groups, parts


async def exported_groups(stub: Any, lane_id: str) -> list[list[events_pb2.HarnessEvent]]:
    """The event groups of the lane's ExportLane file."""
    data = b"".join(
        [piece.data async for piece in stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))]
    )
    groups = []
    for line in data.splitlines()[1:]:
        record = json.loads(line)
        if EVENT_GROUP in record:
            events = record[EVENT_GROUP]["events"]
            groups.append([json_format.ParseDict(e, events_pb2.HarnessEvent()) for e in events])
    return groups


def folded(
    start: snapshot_pb2.LaneSnapshot, groups: list[list[events_pb2.HarnessEvent]]
) -> snapshot_pb2.LaneSnapshot:
    """``start`` with the events after its revision folded, group by group."""
    events = [e for group in groups for e in group if e.revision > start.revision]
    assert [e.revision for e in events] == list(
        range(start.revision + 1, start.revision + 1 + len(events))
    )
    return fold(start, events).snapshot


async def test_a_run_ending_a_batch_of_40_mib_reads_the_same_everywhere(
    lane_stub: Any, lane_server: RunningServer
) -> None:
    stub = lane_stub
    lane = await LaneScript.create(stub, prefix="large-group")
    lane_id = lane.lane_id
    created = await first_view(stub, lane_id)
    assert created.revision == 1
    run = await lane.start_run("go")
    turn_id = await run.start_turn()
    ids = [f"c{i}" for i in range(MAX_TOOL_CALLS)]
    many = assistant(text("many"), *(tool_call(c, "t", {"i": c}) for c in ids))
    await run.settle(turn_id, message=many)
    # Every call starts; all but the first stage their results: waiting for the first, none
    # is placed.
    for call_id in ids:
        await run.call(call_id).start()
    for call_id in ids[1:]:
        await run.call(call_id).stage(call_id[-1] * RESULT_BYTES)
    before_end = await first_view(stub, lane_id)
    latest: list[snapshot_pb2.LaneSnapshot] = []
    follower = asyncio.create_task(follow(stub, lane_id, latest))
    node = await NodeFollower.start(lane_id, lane_server.port)
    try:
        await node.reach(before_end.revision)
        # Ending the run settles the first call and places the whole batch, in one commit.
        await run.abort()
        ended = await run.end(ABORTED)
        final_revision = ended.revision
        await reached(latest, final_revision)
        followed = latest[0]
        typescript = await node.reach(final_revision)
    finally:
        follower.cancel()
        await node.close()

    groups, parts = await resumed_from_zero(stub, lane_id, final_revision)
    last_group = groups[-1]
    group_bytes = sum(event.ByteSize() for event in last_group)
    assert group_bytes > 35 * 1024 * 1024, group_bytes
    assert parts >= group_bytes // MAX_MESSAGE_BYTES
    assert last_group[-1].revision == final_revision
    assert groups[0][0].revision == 1

    fresh = await first_view(stub, lane_id)
    assert fresh.revision == final_revision
    placed = [
        e.message.message.tool_result.tool_call_id
        for e in fresh.transcript
        if e.message.message.WhichOneof("message") == "tool_result"
    ]
    assert placed == ids
    assert fresh.last_result.status == ABORTED

    async with LaneSession(stub) as session:
        answer = await session.call(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert answer.snapshot == fresh

    assert followed == fresh
    assert typescript.snapshot == fresh
    assert folded(created, groups) == fresh
    assert folded(created, await exported_groups(stub, lane_id)) == fresh


async def test_a_run_captures_an_inbox_of_20_mib(lane_stub: Any) -> None:
    stub = lane_stub
    lane = await LaneScript.create(stub, prefix="large-inbox")
    item_text = MAX_PAYLOAD_BYTES - 1024
    count = 20 * 1024 * 1024 // item_text + 1
    assert count * item_text < MAX_INBOX_BYTES
    for index in range(count):
        await lane.enqueue(f"{index:03d}" + "q" * item_text, snapshot_pb2.QUEUE_KIND_NEXT_RUN)
    queued = await first_view(stub, lane.lane_id)
    assert len(queued.queues) == count
    assert sum(item.ByteSize() for item in queued.queues) > 20 * 1024 * 1024

    run = await lane.start_run("and the inbox")
    after = await first_view(stub, lane.lane_id)
    assert len(after.queues) == 0
    assert after.operation.id == run.operation_id
    users = [
        e.message.message.user.content[0].text.text
        for e in after.transcript
        if e.message.message.WhichOneof("message") == "user"
    ]
    captured = [u[:3] for u in users if u != "and the inbox"]
    assert captured == [f"{index:03d}" for index in range(count)]
    # The commit that captured them is one group of more than one message, sent in parts.
    groups, parts = await resumed_from_zero(stub, lane.lane_id, after.revision, queued.revision)
    assert len(groups) == 1 and parts > 1
    assert folded(queued, groups) == after


async def test_a_run_state_over_one_message_is_read_over_drive_lane(
    lane_stub: Any, lane_server: RunningServer, tmp_path: Path
) -> None:
    """A run whose calls' checkpoints add up past 4 MiB: its durable state is refused on the
    unary RPCs (ANSWER_TOO_LARGE; AcquireOperation's commit happened) and answered whole over
    DriveLane, in parts; AcquireOperation sent again there with its request id gets the answer
    recorded when it ran."""
    stub = lane_stub
    lane = await LaneScript.create(stub, prefix="large-state")
    run = await lane.start_run("go")
    turn_id = await run.start_turn()
    ids = [f"c{i}" for i in range(MAX_TOOL_CALLS)]
    await run.settle(
        turn_id, message=assistant(text("many"), *(tool_call(c, "t", {}) for c in ids))
    )
    for call_id in ids:
        await run.call(call_id).start().progress(call_id[-1] * 20_000, checkpoint=True)
    get = pb.GetOperationRequest(lane_id=lane.lane_id, operation_id=run.operation_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.GetOperation(get)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(refused.value)
    assert info.reason == "ANSWER_TOO_LARGE"
    assert info.metadata["method"] == "GetOperation"
    assert int(info.metadata["bytes"]) > MAX_MESSAGE_BYTES
    assert "DriveLane" in (refused.value.details() or "")

    acquire = pb.AcquireOperationRequest(
        lane_id=lane.lane_id, operation_id=run.operation_id, driver_id="d-1", request_id="take-1"
    )
    before = (await first_view(stub, lane.lane_id)).revision
    with pytest.raises(grpc.aio.AioRpcError) as too_large:
        await stub.AcquireOperation(acquire)
    assert error_info(too_large.value).reason == "ANSWER_TOO_LARGE"
    taken = (await first_view(stub, lane.lane_id)).revision
    assert taken > before  # the takeover committed

    async with LaneSession(stub) as session:
        state = (await session.call(get)).state
        answer = await session.call(acquire)
    assert [c.tool_call_id for c in state.tool_calls] == ids
    assert all(
        c.checkpoint.content[0].text.text[-1] == c.tool_call_id[-1] for c in state.tool_calls
    )
    assert pb.GetOperationResponse(state=state).ByteSize() > MAX_MESSAGE_BYTES
    # The TypeScript LaneClient sending unary RPCs reads it over DriveLane too.
    async with node_session(f"127.0.0.1:{lane_server.port}", tmp_path) as node:
        with pytest.raises(LaneError) as refused_in_node:
            await node.call(get, via="unary")
        assert refused_in_node.value.reason == "ANSWER_TOO_LARGE"
        assert (await node.call(get, via="unary-client")).state == state
        await node.close()
    # The recorded answer: the same lease, and nothing committed again.
    assert answer.lease.driver_id == "d-1"
    assert answer.revision == taken
    assert answer.state.tool_calls == state.tool_calls
    assert (await first_view(stub, lane.lane_id)).revision == taken

    # A driver sending unary RPCs reads that state over DriveLane too: it takes the run over
    # (its calls interrupted and placed, in a commit over one message) and ends it.
    async def unused(args: dict[str, Any], ctx: Any) -> str:
        raise AssertionError("the calls were interrupted, not run again")

    driver = Driver(stub, lane.lane_id, [tool("t", unused)], driver_id="d-1", session=False)
    ended = await driver.recover(run.operation_id, ScriptedModel([step("done")]))
    assert ended.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    results = [
        e.message.message.tool_result
        for e in (await first_view(stub, lane.lane_id)).transcript
        if e.message.message.WhichOneof("message") == "tool_result"
    ]
    assert [r.tool_call_id for r in results] == ids
    assert all(r.is_error for r in results)
