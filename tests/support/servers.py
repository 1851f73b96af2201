"""Extra service instances for tests that need more than the session server, and helpers for
service processes.

- :func:`lane_stubs`: stubs on channels a test opened (one per token), closed after;
- :func:`serve`: a server started with given :class:`Settings` and a stub to it;
- :func:`extra_server`: another process's worth of server on a database (notify, polling,
  clock and reconciler settings by keyword);
- fixtures ``http_server`` / ``http_server_stub`` (one per test module): a service with both
  ports (gRPC and HTTP), auth off, and a gRPC stub to it;
- :func:`restartable`: a service that a test stops and starts again on the same port;
- :func:`serving` and :func:`stop_process`: for a service run as a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.v1 import lane_service_pb2_grpc

from lane.server.api import WatchSettings
from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from lane.server.store import Clock, system_clock

if TYPE_CHECKING:
    # In the type stubs only.
    from lane.v1.lane_service_pb2_grpc import LaneServiceAsyncStub as Stub


@asynccontextmanager
async def lane_stubs(*channels: grpc.aio.Channel) -> AsyncIterator[tuple[Stub, ...]]:
    """A LaneService stub on each of ``channels`` (one per caller, say), the channels closed on
    exit."""
    try:
        yield tuple(lane_service_pb2_grpc.LaneServiceStub(channel) for channel in channels)
    finally:
        for channel in channels:
            await channel.close()


@asynccontextmanager
async def serve(
    settings: Settings,
    *,
    listen: str = "127.0.0.1:0",
    watch: WatchSettings | None = None,
    clock: Clock = system_clock,
) -> AsyncIterator[tuple[RunningServer, Stub]]:
    """The service started with ``settings`` and a LaneService stub on an insecure channel to
    it; both closed on exit."""
    running = await start_server(settings, listen=listen, watch=watch, clock=clock)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield running, lane_service_pb2_grpc.LaneServiceStub(channel)
    finally:
        await channel.close()
        await running.stop(grace=0.5)


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
) -> AsyncIterator[tuple[RunningServer, Stub]]:
    """Another service process's worth of server, hub and store on ``database_url``; its
    store decides with ``clock`` (tests/support/clock.py moves one without sleeping)."""
    settings = Settings(
        database_url=database_url,
        notify=notify,
        poll_interval_seconds=poll_interval,
        orphan_seconds=orphan_seconds,
    )
    async with serve(settings, listen=listen, watch=watch, clock=clock) as served:
        yield served


@dataclass
class Restartable:
    """A service on ``database_url`` whose port outlives it: :meth:`restart` starts a new
    server on the same port (a client's channel reconnects to it)."""

    database_url: str
    server: RunningServer
    #: A stub on an insecure channel to the port.
    stub: Stub

    @property
    def port(self) -> int:
        """The port every server of this service listens on."""
        return self.server.port

    #: Whether the current server was stopped (by :meth:`stop`).
    stopped: bool = False

    async def stop(self, grace: float) -> None:
        """Stop the running server (its port stays this service's)."""
        self.stopped = True
        await self.server.stop(grace=grace)

    async def restart(self) -> None:
        """Start the service again on its port, after :meth:`stop`."""
        self.server = await start_server(self.database_url, listen=f"127.0.0.1:{self.port}")
        self.stopped = False


@asynccontextmanager
async def restartable(database_url: str) -> AsyncIterator[Restartable]:
    """A :class:`Restartable` service; the channel and the last server are closed on exit."""
    first = await start_server(database_url, listen="127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{first.port}")
    service = Restartable(database_url, first, lane_service_pb2_grpc.LaneServiceStub(channel))
    try:
        yield service
    finally:
        await channel.close()
        if not service.stopped:
            await service.server.stop(grace=0.5)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def http_server(session_database_url: str) -> AsyncIterator[RunningServer]:
    """One service with both ports (gRPC, and HTTP: Connect, gRPC-Web, the web view), auth
    off, on the session database; one per test module."""
    running = await start_server(session_database_url, http_listen="127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def http_server_stub(http_server: RunningServer) -> AsyncIterator[Stub]:
    """A LaneService stub on an insecure gRPC channel to ``http_server``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{http_server.port}") as channel:
        yield lane_service_pb2_grpc.LaneServiceStub(channel)


async def serving(port: int, process: asyncio.subprocess.Process) -> bool:
    """Wait until the service at ``port`` reports SERVING; False if ``process`` ended first."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while process.returncode is None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
            await asyncio.sleep(0.1)
    return False


async def stop_process(process: asyncio.subprocess.Process, grace: float) -> None:
    """Stop a service process still running: SIGTERM first (so it shuts down an embedded
    PostgreSQL, and a supervisor its workers), SIGKILL if not gone after ``grace`` seconds."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=grace)
    except TimeoutError:
        process.kill()
        await process.wait()
