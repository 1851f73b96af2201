"""Extra service instances for tests that need more than the session server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from lane.v1 import lane_service_pb2_grpc

from lane.server.api import WatchSettings
from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from lane.server.store import Clock, system_clock


@asynccontextmanager
async def extra_server(
    database_url: str,
    *,
    notify: bool = True,
    poll_interval: float = 1.0,
    watch: WatchSettings | None = None,
    listen: str = "127.0.0.1:0",
    clock: Clock = system_clock,
    orphan_seconds: float = Settings.orphan_seconds,
) -> AsyncIterator[tuple[RunningServer, lane_service_pb2_grpc.LaneServiceAsyncStub]]:
    """Another service process's worth of server, hub and store on ``database_url``; its
    store decides with ``clock`` (tests/support/clock.py moves one without sleeping)."""
    settings = Settings(
        database_url=database_url,
        notify=notify,
        poll_interval_seconds=poll_interval,
        orphan_seconds=orphan_seconds,
    )
    running = await start_server(settings, listen=listen, watch=watch, clock=clock)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield running, lane_service_pb2_grpc.LaneServiceStub(channel)
    finally:
        await channel.close()
        await running.stop(grace=0.5)
