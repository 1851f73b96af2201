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
from lane.v1 import events_pb2, lane_service_pb2_grpc, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api import WatchSettings
from tests.integration.lanes import error_reason
from tests.integration.servers import extra_server

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


async def test_a_commit_on_one_of_three_lanes_is_one_update_of_that_lane(lane_stub) -> None:
    ids = [new_lane_id("three") for _ in range(3)]
    for lane_id in ids:
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    watcher = LanesWatcher(lane_stub, pb.WatchLanesRequest(lane_ids=ids))
    try:
        await watcher.until(lambda: watcher.listed)
        assert sorted(line.lane_id for line in watcher.listing) == sorted(ids)
        run = await LaneScript(lane_stub, ids[1]).start_run("go")
        await watcher.until(lambda: watcher.changes)
        (update,) = watcher.changes
        (line,) = update.lanes
        assert not update.removed
        assert (line.lane_id, line.revision) == (ids[1], run.started.revision)
        assert line.status == pb.LANE_STATUS_RUNNING and line.operation_id == run.operation_id
        # Nothing else came for it: the next message is the next commit's, on another lane.
        revision = await set_value(lane_stub, ids[2], "next")
        await watcher.until(lambda: len(watcher.changes) == 2)
        assert [(x.lane_id, x.revision) for x in watcher.changes[1].lanes] == [(ids[2], revision)]
    finally:
        await watcher.close()


async def test_a_client_that_does_not_read_gets_each_lane_once_in_its_latest_state(
    lane_server,
) -> None:
    # Many lanes and a small client window: the listing alone fills it, so the stream's
    # writes wait while the commits land. What the client then reads after the listing holds
    # each lane at most once, in its latest state: the stream kept one pending change per lane.
    prefix = f"unread-{uuid.uuid4().hex[:8]}-" + "x" * 80
    ids = [f"{prefix}{n:03d}" for n in range(200)]
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{lane_server.port}", options=SMALL_WINDOW
    ) as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        for lane_id in ids:
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        call = stub.WatchLanes(pb.WatchLanesRequest(lane_id_prefix=prefix))
        await call.wait_for_connection()
        latest: dict[str, int] = {}
        for round_ in range(3):
            for lane_id in ids:
                latest[lane_id] = await set_value(stub, lane_id, f"r{round_}")
        held: dict[str, int] = {}
        entries_after_listing = 0
        listed_all = False
        async with asyncio.timeout(30):
            async for response in call:
                if response.heartbeat:
                    continue
                if listed_all:
                    entries_after_listing += len(response.lanes)
                for line in response.lanes:
                    held[line.lane_id] = line.revision
                listed_all = listed_all or response.listing_complete
                if listed_all and held == latest:
                    break
        call.cancel()
    assert held == latest
    assert entries_after_listing <= len(ids)


async def test_a_commit_in_another_process_reaches_the_stream(
    session_database_url, lane_stub
) -> None:
    # The stream's server polls once a minute: only a doorbell delivers in time. (Its first
    # commit may race the announcement of the namespace; the second cannot.)
    async with extra_server(session_database_url, poll_interval=60) as (_, stub):
        lane_id = new_lane_id("remote")
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        watcher = LanesWatcher(stub, pb.WatchLanesRequest(lane_id_prefix=lane_id))
        try:
            await watcher.until(lambda: watcher.listed)
            first = await set_value(lane_stub, lane_id, "one")
            await watcher.until(lambda: watcher.lanes[lane_id].revision == first)
            run = await LaneScript(lane_stub, lane_id).start_run("go")
            await watcher.until(lambda: watcher.lanes[lane_id].revision == run.started.revision)
            line = watcher.lanes[lane_id]
            assert line.status == pb.LANE_STATUS_RUNNING and line.operation_id == run.operation_id
        finally:
            await watcher.close()


async def test_without_notify_the_poll_delivers_other_processes_changes(
    session_database_url, lane_stub
) -> None:
    async with extra_server(session_database_url, notify=False, poll_interval=0.2) as (_, stub):
        prefix = new_lane_id("polled")
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-a"))
        watcher = LanesWatcher(stub, pb.WatchLanesRequest(lane_id_prefix=prefix))
        try:
            await watcher.until(lambda: watcher.listed)
            revision = await set_value(lane_stub, f"{prefix}-a", "moved")
            await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-b"))
            await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=f"{prefix}-a"))
            await watcher.until(lambda: list(watcher.lanes) == [f"{prefix}-b"])
            seen = [line for change in watcher.changes for line in change.lanes]
            removed = [r for change in watcher.changes for r in change.removed]
            assert [(r.lane_id, r.deleted) for r in removed] == [(f"{prefix}-a", True)]
            # The poll may have seen the value commit, or only the deletion after it.
            assert all(line.revision <= revision for line in seen if line.lane_id.endswith("-a"))
        finally:
            await watcher.close()


async def test_deletion_and_creation_again(lane_stub) -> None:
    lane_id = new_lane_id("again")
    created = await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    await set_value(lane_stub, lane_id, "first life")
    watcher = LanesWatcher(lane_stub, pb.WatchLanesRequest(lane_id_prefix=lane_id))
    try:
        await watcher.until(lambda: watcher.listed)
        (old,) = watcher.listing
        await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
        await watcher.until(lambda: lane_id not in watcher.lanes)
        (removal,) = watcher.changes[-1].removed
        assert (removal.lane_id, removal.incarnation, removal.deleted) == (
            lane_id,
            old.incarnation,
            True,
        )
        again = await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        assert again.revision == 1 and created.revision == 1
        await watcher.until(lambda: lane_id in watcher.lanes)
        fresh = watcher.lanes[lane_id]
        assert fresh.revision == 1 and fresh.incarnation != old.incarnation
        assert fresh.status == pb.LANE_STATUS_IDLE
    finally:
        await watcher.close()


async def test_lane_ids_and_statuses_filter_the_stream(lane_stub) -> None:
    prefix = new_lane_id("filtered")
    named, other, later = f"{prefix}-named", f"{prefix}-other", f"{prefix}-later"
    for lane_id in (named, other):
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    by_id = LanesWatcher(lane_stub, pb.WatchLanesRequest(lane_ids=[named, later]))
    running = LanesWatcher(
        lane_stub,
        pb.WatchLanesRequest(lane_id_prefix=prefix, statuses=[pb.LANE_STATUS_RUNNING]),
    )
    try:
        await by_id.until(lambda: by_id.listed)
        await running.until(lambda: running.listed)
        assert [line.lane_id for line in by_id.listing] == [named]
        assert running.listing == []
        # A lane named before it existed is sent once created; the other lane never is.
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=later))
        await set_value(lane_stub, other, "unnamed")
        await by_id.until(lambda: later in by_id.lanes)
        # A lane that starts running enters the status filter; once it ends, it leaves it.
        run = await LaneScript(lane_stub, other).start_run("go")
        await running.until(lambda: other in running.lanes)
        assert running.lanes[other].operation_id == run.operation_id
        await run.turn("done")
        await run.end()
        await running.until(lambda: other not in running.lanes)
        removed = [r for change in running.changes for r in change.removed]
        assert [(r.lane_id, r.deleted) for r in removed] == [(other, False)]
        await set_value(lane_stub, named, "named again")
        await by_id.until(lambda: by_id.lanes[named].revision > by_id.listing[0].revision)
        assert set(by_id.lanes) == {named, later}
        assert all(line.lane_id in (named, later) for c in by_id.changes for line in c.lanes)
    finally:
        await by_id.close()
        await running.close()


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"lane_ids": [f"l{n}" for n in range(1001)]}, "TOO_MANY_LANE_IDS"),
        ({"statuses": [pb.LANE_STATUS_UNSPECIFIED]}, "UNKNOWN_ENUM_VALUE"),
        ({"statuses": [42]}, "UNKNOWN_ENUM_VALUE"),
        ({"lane_ids": ["ok", " padded"]}, "INVALID_ID"),
        ({"lane_id_prefix": "x" * 200}, "INVALID_ID"),
    ],
)
async def test_bad_requests_are_refused(lane_stub, request_fields, reason) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.WatchLanes(pb.WatchLanesRequest(**request_fields)).read()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == reason


async def test_a_stalled_client_is_cut_off_with_the_reason(session_database_url) -> None:
    watch = WatchSettings(write_deadline_seconds=1.0)
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        prefix = f"stalled-{uuid.uuid4().hex[:8]}-" + "x" * 100
        for n in range(300):
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}{n:03d}"))
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{running.port}", options=SMALL_WINDOW
        ) as channel:
            call = lane_service_pb2_grpc.LaneServiceStub(channel).WatchLanes(
                pb.WatchLanesRequest(lane_id_prefix=prefix)
            )
            await call.wait_for_connection()
            # The client reads nothing: the listing cannot go out, the stream is cut and its
            # slot freed while the client still reads nothing.
            async with asyncio.timeout(30):
                while not running.hub.lane_changes.followers():  # noqa: ASYNC110 (no event)
                    await asyncio.sleep(0.05)
                while running.hub.lane_changes.followers():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async with asyncio.timeout(30):
                    async for _ in call:
                        pass
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(caught.value) == "WATCHER_TOO_SLOW"


async def test_shutdown_ends_the_stream_unavailable(session_database_url) -> None:
    async with extra_server(session_database_url) as (running, stub):
        watcher = LanesWatcher(stub, pb.WatchLanesRequest(lane_id_prefix=new_lane_id("down")))
        await watcher.until(lambda: watcher.listed)
        await running.stop(grace=30)
        await asyncio.wait_for(watcher.task, 10)
        assert watcher.error is not None
        assert watcher.error.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(watcher.error) == "SERVER_SHUTTING_DOWN"


async def test_an_idle_stream_heartbeats(session_database_url) -> None:
    watch = WatchSettings(heartbeat_seconds=0.2)
    async with extra_server(session_database_url, watch=watch) as (_, stub):
        watcher = LanesWatcher(stub, pb.WatchLanesRequest(lane_id_prefix=new_lane_id("idle")))
        try:
            await watcher.until(lambda: watcher.heartbeats >= 2)
            assert watcher.changes == []
        finally:
            await watcher.close()
