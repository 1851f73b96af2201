"""WatchLanes against real servers and PostgreSQL: the listing, one update per change, the
latest state only for a client that does not read, other processes' commits, deletion and
re-creation, filters, a stalled client cut off, shutdown; and the richer ListLanes (statuses,
times, filters, order by activity)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import grpc
import pytest
from lane.client.testing import LaneScript, new_lane_id
from lane.v1 import events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.integration.lanes import error_reason

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: A client window small enough that a client that reads nothing stops the stream's writes.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)]


class LanesWatcher:
    """Reads one WatchLanes stream in the background: the listing, then every message."""

    def __init__(self, stub: Any, request: pb.WatchLanesRequest | None = None) -> None:
        self.call = stub.WatchLanes(request or pb.WatchLanesRequest())
        self.listing: list[pb.LaneSummary] = []
        self.listed = False
        #: Every message after the listing, heartbeats left out.
        self.changes: list[pb.WatchLanesResponse] = []
        self.heartbeats = 0
        #: The lanes as the client holds them now.
        self.lanes: dict[str, pb.LaneSummary] = {}
        self.error: grpc.aio.AioRpcError | None = None
        self._moved = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                self.apply(response)
                async with self._moved:
                    self._moved.notify_all()
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        async with self._moved:
            self._moved.notify_all()

    def apply(self, response: pb.WatchLanesResponse) -> None:
        if response.heartbeat:
            assert self.listed and not response.lanes and not response.removed
            self.heartbeats += 1
            return
        ids = [line.lane_id for line in response.lanes] + [r.lane_id for r in response.removed]
        assert len(ids) == len(set(ids)), f"a lane twice in one message: {ids}"
        if not self.listed:
            assert not response.removed
            self.listing.extend(response.lanes)
            self.listed = response.listing_complete
        else:
            assert not response.listing_complete
            self.changes.append(response)
        for line in response.lanes:
            self.lanes[line.lane_id] = line
        for removal in response.removed:
            held = self.lanes.pop(removal.lane_id)
            assert held.incarnation == removal.incarnation

    async def until(self, done: Any, within: float = 20.0) -> None:
        async with asyncio.timeout(within), self._moved:
            while not done():
                if self.task.done():
                    raise AssertionError(f"the stream ended: {self.error}")
                await self._moved.wait()

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def listed(stub: Any, **request: Any) -> list[pb.LaneSummary]:
    """Every lane ListLanes gives for ``request``'s filters, page after page."""
    lines: list[pb.LaneSummary] = []
    token = ""
    while True:
        page = await stub.ListLanes(pb.ListLanesRequest(page_size=7, page_token=token, **request))
        lines.extend(page.lanes)
        token = page.next_page_token
        if not token:
            return lines


async def set_value(stub: Any, lane_id: str, value: str) -> int:
    """One commit on the lane (a value_update); its revision."""
    answer = await stub.SetLaneValue(
        pb.SetLaneValueRequest(
            lane_id=lane_id, session_name=events_pb2.SessionNameValue(name=value)
        )
    )
    return int(answer.revision)


async def lanes_in_every_status(stub: Any, prefix: str) -> dict[pb.LaneStatus.ValueType, str]:
    """One lane in each status, named ``prefix`` + the status name; status -> lane id."""
    lanes: dict[pb.LaneStatus.ValueType, str] = {}

    async def lane(status: pb.LaneStatus.ValueType) -> LaneScript:
        name = pb.LaneStatus.Name(status).removeprefix("LANE_STATUS_").lower()
        lanes[status] = f"{prefix}{name}"
        return await LaneScript.create(stub, lanes[status])

    await lane(pb.LANE_STATUS_IDLE)
    run = await (await lane(pb.LANE_STATUS_RUNNING)).start_run("go")
    await run.turn(tool_calls=["c1", "c2"])
    await run.call("c1").start()
    aborting = await (await lane(pb.LANE_STATUS_ABORTING)).start_run("go")
    await aborting.abort()
    suspended = await (await lane(pb.LANE_STATUS_SUSPENDED)).start_run("go")
    turn = replace(suspended.aim, turn_id=await suspended.start_turn())
    deferred = snapshot_pb2.DeferredState(handle_json="{}", poll_json="{}")
    await stub.SuspendRun(turn.request(pb.SuspendRunRequest, deferred=deferred))
    retrying = await (await lane(pb.LANE_STATUS_RETRY_WAITING)).start_run("go")
    turn = replace(retrying.aim, turn_id=await retrying.start_turn())
    await stub.ScheduleRetry(
        turn.request(pb.ScheduleRetryRequest, max_attempts=3, delay_ms=1000, error_message="529")
    )
    compacting = await lane(pb.LANE_STATUS_COMPACTING)
    await stub.StartCompaction(pb.StartCompactionRequest(lane_id=compacting.lane_id))
    faulted = await lane(pb.LANE_STATUS_FAULTED)
    await stub.ReportFault(pb.ReportFaultRequest(lane_id=faulted.lane_id, code="X", message="m"))
    return lanes


# -- ListLanes ----------------------------------------------------------------------------------


async def test_list_lanes_shows_each_status_and_filters_by_it(lane_stub) -> None:
    prefix = f"status-{uuid.uuid4().hex[:8]}-"
    lanes = await lanes_in_every_status(lane_stub, prefix)
    lines = {line.lane_id: line for line in await listed(lane_stub, lane_id_prefix=prefix)}
    assert {lines[lane_id].status: lane_id for lane_id in lines} == lanes
    running = lines[lanes[pb.LANE_STATUS_RUNNING]]
    assert running.running_tool_calls == 1
    assert running.operation_kind == snapshot_pb2.OPERATION_KIND_RUN
    assert running.HasField("operation_started_time") and running.operation_id
    assert lines[lanes[pb.LANE_STATUS_FAULTED]].faulted
    compacting = lines[lanes[pb.LANE_STATUS_COMPACTING]]
    assert compacting.operation_kind == snapshot_pb2.OPERATION_KIND_COMPACTION
    idle = lines[lanes[pb.LANE_STATUS_IDLE]]
    assert not idle.operation_id and not idle.HasField("operation_started_time")
    for status, lane_id in lanes.items():
        only = await listed(lane_stub, lane_id_prefix=prefix, statuses=[status])
        assert [line.lane_id for line in only] == [lane_id]
    both = await listed(
        lane_stub, lane_id_prefix=prefix, statuses=[pb.LANE_STATUS_IDLE, pb.LANE_STATUS_FAULTED]
    )
    assert {line.lane_id for line in both} == {
        lanes[pb.LANE_STATUS_IDLE],
        lanes[pb.LANE_STATUS_FAULTED],
    }


async def test_list_lanes_shows_usage_last_result_and_last_activity(lane_stub) -> None:
    lane = await LaneScript.create(lane_stub, new_lane_id("used"))
    run = await lane.start_run("go")
    usage = messages_pb2.Usage(input=100, output=20, total_tokens=120)
    await run.turn("done", usage=usage)
    ended = await run.end()
    snapshot = await lane.snapshot()
    (line,) = await listed(lane_stub, lane_id_prefix=lane.lane_id)
    assert line.usage_totals == snapshot.stats.usage
    assert line.usage_totals.total_tokens == 120
    assert line.last_operation_id == run.operation_id
    assert line.last_result_status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    assert line.status == pb.LANE_STATUS_IDLE and line.revision == ended.revision
    assert line.incarnation == snapshot.incarnation
    events = await lane_stub.WatchLane(
        pb.WatchLaneRequest(lane_id=lane.lane_id, after_revision=ended.revision - 1)
    ).read()
    assert line.last_activity_time == events.event_group.events[-1].commit_time


async def test_list_lanes_by_last_activity_pages_newest_first(lane_stub) -> None:
    prefix = f"active-{uuid.uuid4().hex[:8]}-"
    ids = [f"{prefix}{n}" for n in range(5)]
    for lane_id in ids:
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    # Touched in this order: the last touched is the most recently active.
    touched = [ids[3], ids[0], ids[4], ids[1], ids[2]]
    for lane_id in touched:
        await set_value(lane_stub, lane_id, "x")
    order = [
        line.lane_id
        for line in await listed(
            lane_stub, lane_id_prefix=prefix, order=pb.LANE_ORDER_LAST_ACTIVITY
        )
    ]
    assert order == touched[::-1]
    # An id-order token is not a last-activity one.
    first = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=2, lane_id_prefix=prefix))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.ListLanes(
            pb.ListLanesRequest(
                page_size=2,
                lane_id_prefix=prefix,
                page_token=first.next_page_token,
                order=pb.LANE_ORDER_LAST_ACTIVITY,
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == "INVALID_PAGE_TOKEN"


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"statuses": [0]}, "UNKNOWN_ENUM_VALUE"),
        ({"statuses": [99]}, "UNKNOWN_ENUM_VALUE"),
        ({"order": 7}, "UNKNOWN_ENUM_VALUE"),
        ({"lane_id_prefix": "bad\n"}, "INVALID_ID"),
        ({"order": 1, "page_token": "not-a-token"}, "INVALID_PAGE_TOKEN"),
    ],
)
async def test_list_lanes_refuses_bad_filters(lane_stub, request_fields, reason) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.ListLanes(pb.ListLanesRequest(**request_fields))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == reason


# -- WatchLanes ---------------------------------------------------------------------------------


async def test_the_listing_matches_list_lanes_then_changes_follow(lane_stub) -> None:
    prefix = f"watch-{uuid.uuid4().hex[:8]}-"
    lanes = await lanes_in_every_status(lane_stub, prefix)
    watcher = LanesWatcher(lane_stub, pb.WatchLanesRequest(lane_id_prefix=prefix))
    try:
        await watcher.until(lambda: watcher.listed)
        assert watcher.listing == await listed(lane_stub, lane_id_prefix=prefix)
        # Every status computed from a commit's state (no read) is the one ListLanes reads.
        before = {line.lane_id: line.revision for line in watcher.listing}
        for lane_id in lanes.values():
            await set_value(lane_stub, lane_id, "again")
        await watcher.until(
            lambda: all(watcher.lanes[lane_id].revision > before[lane_id] for lane_id in before)
        )
        assert list(watcher.lanes.values()) != watcher.listing
        fresh = {line.lane_id: line for line in await listed(lane_stub, lane_id_prefix=prefix)}
        assert watcher.lanes == fresh
    finally:
        await watcher.close()
