"""Lane identity across deletes: a lane deleted and created again under its id is a new
incarnation, and nothing of the old one holds for it.

- every snapshot carries the lane's incarnation, a new one after a delete and create;
- a WatchLane resume with a revision of the earlier incarnation is refused FAILED_PRECONDITION
  ``LANE_INCARNATION_CHANGED`` (raw stub), even when the new lane has grown past it;
- the Python and TypeScript watchers, away while the lane was deleted and created again,
  re-snapshot and show the new lane (their view equals a fresh snapshot);
- a lease of the deleted lane does not hold the new lane's run, even one given the same
  operation id: ``STALE_LEASE``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from lane.client.retry import RetryPolicy
from lane.client.testing import user
from lane.client.watch import LaneView, watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.integration.lanes import error_info, new_lane_id
from tests.integration.test_typescript_watcher import NodeFollower
from tests.support.servers import Restartable, restartable

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any
FAST = RetryPolicy(initial_backoff=0.05, max_backoff=0.2)


async def snapshot_of(stub: Stub, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    answer = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    snapshot: snapshot_pb2.LaneSnapshot = answer.snapshot
    return snapshot


async def busy_lane(stub: Stub, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    """A lane with a transcript and an open run; its snapshot."""
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("hello"), user("you")]))
    return await snapshot_of(stub, lane_id)


async def created_again(stub: Stub, lane_id: str, past: int) -> snapshot_pb2.LaneSnapshot:
    """Delete the lane (its run with it) and create it again, grown to revision ``past`` + 1
    with configuration changes only: an empty lane whose revisions reach past the old one's."""
    await stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id, force=True))
    revision = (await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))).revision
    n = 0
    while revision <= past:
        n += 1
        update = pb.UpdateLaneConfigRequest(
            lane_id=lane_id, active_tool_names=pb.ToolNames(names=[f"tool-{n}"])
        )
        revision = (await stub.UpdateLaneConfig(update)).revision
    return await snapshot_of(stub, lane_id)


async def test_a_resume_from_an_earlier_incarnation_is_refused(lane_stub: Stub) -> None:
    lane_id = new_lane_id("incarnation")
    old = await busy_lane(lane_stub, lane_id)
    assert old.incarnation
    new = await created_again(lane_stub, lane_id, old.revision)
    assert new.incarnation not in ("", old.incarnation)
    assert not new.transcript and not new.HasField("operation")

    # The old revision is within the new lane's log, but of another lane: refused.
    stale = pb.WatchLaneRequest(
        lane_id=lane_id, after_revision=old.revision, incarnation=old.incarnation
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await lane_stub.WatchLane(stale).read()
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(caught.value)
    assert info.reason == "LANE_INCARNATION_CHANGED"
    assert dict(info.metadata) == {
        "laneId": lane_id,
        "incarnation": new.incarnation,
        "resumedIncarnation": old.incarnation,
    }
    # A resume naming the lane's own incarnation goes on, and its heartbeats name it too.
    current = pb.WatchLaneRequest(
        lane_id=lane_id, after_revision=new.revision - 1, incarnation=new.incarnation
    )
    call = lane_stub.WatchLane(current)
    try:
        group = await call.read()
        assert [e.revision for e in group.event_group.events] == [new.revision]
    finally:
        call.cancel()
    # A watch without a resume point gets the new lane, and says which.
    fresh = lane_stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
    try:
        head = (await fresh.read()).snapshot.snapshot
        assert (head.incarnation, head.revision) == (new.incarnation, new.revision)
    finally:
        fresh.cancel()


async def test_a_malformed_incarnation_is_refused(lane_stub: Stub) -> None:
    request = pb.WatchLaneRequest(lane_id="x", after_revision=1, incarnation=" 7")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await lane_stub.WatchLane(request).read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["field"] == "incarnation"


async def test_a_lease_of_the_deleted_lane_does_not_hold_the_new_one(lane_stub: Stub) -> None:
    lane_id = new_lane_id("incarnation-lease")
    # A caller-chosen operation id, so the new lane's run can carry the same one.
    operation_id = new_lane_id("run")

    async def leased_run(driver: str) -> pb.StartRunResponse:
        answer: pb.StartRunResponse = await lane_stub.StartRun(
            pb.StartRunRequest(
                lane_id=lane_id,
                operation_id=operation_id,
                prompt=[user("go")],
                driver_id=driver,
                lease_seconds=60,
            )
        )
        return answer

    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    old = await leased_run("driver-old")
    await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id, force=True))
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    new = await leased_run("driver-new")
    assert new.operation_id == old.operation_id == operation_id
    assert new.lease.token != old.lease.token

    # The old driver's token does not drive the new run: every command is refused.
    for request in (
        pb.RenewLeaseRequest(
            lane_id=lane_id, operation_id=operation_id, lease_token=old.lease.token
        ),
        pb.StartTurnRequest(
            lane_id=lane_id, operation_id=operation_id, lease_token=old.lease.token
        ),
    ):
        method = getattr(lane_stub, type(request).__name__.removesuffix("Request"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(request)
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert error_info(caught.value).reason == "STALE_LEASE"
    # The new driver's does.
    renewed = await lane_stub.RenewLease(
        pb.RenewLeaseRequest(
            lane_id=lane_id, operation_id=operation_id, lease_token=new.lease.token
        )
    )
    assert renewed.lease.driver_id == "driver-new"


# -- the watchers, away while the lane was deleted and created again ----------------------------


async def away_while_created_again(
    service: Restartable, other: Stub, lane_id: str, old: snapshot_pb2.LaneSnapshot
) -> snapshot_pb2.LaneSnapshot:
    """Stop the watchers' server, delete and create the lane again through ``other`` (a
    server of the same database), start it again: the new lane's snapshot."""
    await service.stop(grace=0.2)
    new = await created_again(other, lane_id, old.revision)
    await service.restart()
    return new


@pytest.fixture
async def service(session_database_url: str) -> AsyncIterator[Restartable]:
    async with restartable(session_database_url) as served:
        yield served


async def test_the_python_watcher_re_snapshots_a_lane_created_again(
    service: Restartable, lane_stub: Stub
) -> None:
    lane_id = new_lane_id("incarnation-py")
    old = await busy_lane(lane_stub, lane_id)
    errors: list[str] = []
    views: list[LaneView] = []
    watch = watch_lane(
        service.stub, lane_id, retry=FAST, on_retry=lambda _, error: errors.append(error.reason)
    )
    try:
        views.append(await anext(watch))
        assert views[0].snapshot == old
        new = await away_while_created_again(service, lane_stub, lane_id, old)
        async with asyncio.timeout(30):
            views.append(await anext(watch))
    finally:
        await watch.aclose()
    assert "LANE_INCARNATION_CHANGED" in errors
    assert views[-1].resnapshotted
    assert views[-1].snapshot == new == await snapshot_of(lane_stub, lane_id)


async def test_the_typescript_watcher_re_snapshots_a_lane_created_again(
    service: Restartable, lane_stub: Stub
) -> None:
    lane_id = new_lane_id("incarnation-ts")
    old = await busy_lane(lane_stub, lane_id)
    follower = await NodeFollower.start(lane_id, service.port)
    try:
        first = await follower.reach(old.revision)
        assert first.snapshot == old
        new = await away_while_created_again(service, lane_stub, lane_id, old)
        last = await follower.reach(new.revision)
        assert last.kind == "snapshot"  # a re-snapshot, not events folded onto the old lane
        assert last.snapshot == new == await snapshot_of(lane_stub, lane_id)
        # It said why: the service refused the resume (LANE_INCARNATION_CHANGED).
        assert "resnapshot" in follower.stderr and "created again" in follower.stderr
    finally:
        await follower.close()
