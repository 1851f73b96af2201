"""The Python client's ``watch_lanes`` against real servers: the listing, then changes folded
into one mapping of lanes; a new listing after the server went away; refusals raised."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lane.client import LaneError, LanesView, RetryPolicy, watch_lanes
from lane.client.connect import open_channel
from lane.client.testing import LaneScript, new_lane_id
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from lane.server.app.server import RunningServer, start_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

FAST = RetryPolicy(initial_backoff=0.05, max_backoff=0.3, max_attempts=200)


class Following:
    """Reads a watch_lanes iterator in the background, keeping every view."""

    def __init__(self, views: AsyncIterator[LanesView]) -> None:
        self.views: list[LanesView] = []
        self.error: BaseException | None = None
        self._iterator = views
        self._moved = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for view in self._iterator:
                self.views.append(view)
                async with self._moved:
                    self._moved.notify_all()
        except Exception as exc:
            self.error = exc
        async with self._moved:
            self._moved.notify_all()

    async def until(self, done: Any, within: float = 20.0) -> None:
        async with asyncio.timeout(within), self._moved:
            while not (self.views and done(self.views[-1])):
                if self.task.done():
                    raise AssertionError(f"the watch ended: {self.error!r}")
                await self._moved.wait()


@contextlib.asynccontextmanager
async def following(views: AsyncIterator[LanesView]) -> AsyncIterator[Following]:
    follower = Following(views)
    try:
        yield follower
    finally:
        follower.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower.task


async def test_the_listing_then_changes_fold_into_the_lanes(lane_stub) -> None:
    prefix = new_lane_id("client")
    for name in ("a", "b"):
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-{name}"))
    async with following(watch_lanes(lane_stub, prefix=prefix)) as follower:
        await follower.until(lambda view: len(view.lanes) == 2)
        first = follower.views[0]
        assert not first.relisted and len(first.changed) == 2
        run = await LaneScript(lane_stub, f"{prefix}-b").start_run("go")
        revision = run.started.revision
        await follower.until(lambda view: view.lanes[f"{prefix}-b"].revision == revision)
        (changed,) = follower.views[-1].changed
        assert changed.status == pb.LANE_STATUS_RUNNING
        await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=f"{prefix}-a"))
        await follower.until(lambda view: f"{prefix}-a" not in view.lanes)
        (removed,) = follower.views[-1].removed
        assert removed.lane_id == f"{prefix}-a" and removed.deleted
        listed = await lane_stub.ListLanes(pb.ListLanesRequest(lane_id_prefix=prefix))
        assert dict(follower.views[-1].lanes) == {line.lane_id: line for line in listed.lanes}


async def test_lists_again_after_the_server_went_away(lane_stub, session_database_url: str) -> None:
    prefix = new_lane_id("relist")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-a"))
    running = await start_server(session_database_url, listen="127.0.0.1:0")
    port = running.port
    channel = open_channel(f"127.0.0.1:{port}")
    stub = lane_service_pb2_grpc.LaneServiceStub(channel)
    restarted: RunningServer | None = None
    retries: list[str] = []
    try:
        views = watch_lanes(
            stub, prefix=prefix, retry=FAST, on_retry=lambda n, e: retries.append(e.reason)
        )
        async with following(views) as follower:
            await follower.until(lambda view: list(view.lanes) == [f"{prefix}-a"])
            await running.stop(0)
            # Changes while the followed server is gone, through another server.
            await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-b"))
            await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=f"{prefix}-a"))
            restarted = await start_server(session_database_url, listen=f"127.0.0.1:{port}")
            await follower.until(lambda view: view.relisted)
            relisted = follower.views[-1]
            assert list(relisted.lanes) == [f"{prefix}-b"]
            assert retries, "the watch never noticed the server went away"
            # Live again after the new listing.
            run = await LaneScript(lane_stub, f"{prefix}-b").start_run("go")
            await follower.until(
                lambda view: view.lanes[f"{prefix}-b"].revision == run.started.revision
            )
    finally:
        await channel.close()
        await running.stop(0)
        if restarted is not None:
            await restarted.stop(0)


async def test_a_refusal_is_raised(lane_stub) -> None:
    with pytest.raises(LaneError) as refused:
        async for _ in watch_lanes(lane_stub, lane_ids=["bad id "]):
            pass
    assert refused.value.reason == "INVALID_ID"
