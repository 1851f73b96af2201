"""Fair shares: watchers, DriveLane sessions, exports and imports capped per namespace too.

On a real server with two namespaces' tokens and small caps, on the gRPC port and the HTTP port
(Connect: the same handlers):

- a namespace at its watcher cap is refused ``TOO_MANY_WATCHERS`` (scope ``namespace``, with a
  RetryInfo) while another namespace still attaches; the process cap still holds for all;
- the same for DriveLane sessions (``TOO_MANY_SESSIONS``; the Python ``LaneSession`` of a
  namespace at its cap carries on with unary calls) and for exports and imports
  (``TOO_MANY_TRANSFERS``);
- a slot given back is free again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio
from connectrpc.errors import ConnectError
from connectrpc.protocol import ProtocolType
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from lane.client.connect import open_channel
from lane.client.session import LaneSession
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2
from pyqwest import HTTPVersion

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import error_info, new_lane_id
from tests.integration.test_connect import Caller, connect_reason, http_client, method
from tests.support.servers import lane_stubs

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKEN_A = "fair-shares-team-a-0123456789"
TOKEN_B = "fair-shares-team-b-0123456789"
TOKENS = {TOKEN_A: "team-a", TOKEN_B: "team-b"}


@pytest_asyncio.fixture(loop_scope="session")
async def server(session_database_url: str) -> AsyncIterator[RunningServer]:
    settings = Settings(
        database_url=session_database_url,
        auth_tokens=TOKENS,
        max_watchers=3,
        max_watchers_per_namespace=2,
        max_sessions=2,
        max_sessions_per_namespace=1,
        max_transfers=2,
        max_transfers_per_namespace=1,
    )
    running = await start_server(settings, listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


@pytest_asyncio.fixture(loop_scope="session")
async def stubs(server: RunningServer) -> AsyncIterator[tuple[Any, Any]]:
    """Stubs of team-a and team-b."""
    channels = [open_channel(server.address, token=token) for token in (TOKEN_A, TOKEN_B)]
    async with lane_stubs(*channels) as (stub_a, stub_b):
        yield stub_a, stub_b


def retry_seconds(error: grpc.aio.AioRpcError) -> float:
    """The google.rpc.RetryInfo delay of a refusal."""
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            seconds: float = retry.retry_delay.ToTimedelta().total_seconds()
            return seconds
    raise AssertionError("no RetryInfo")


async def refused(first: Callable[[], Any], reason: str, scope: str) -> None:
    """``first()`` (the call's first answer) fails RESOURCE_EXHAUSTED ``reason`` in ``scope``,
    asking for a retry after 2 s."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await first()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    info = error_info(caught.value)
    assert (info.reason, info.metadata["scope"]) == (reason, scope)
    assert retry_seconds(caught.value) == 2.0


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (the server has no event for it)
            await asyncio.sleep(0.02)


async def test_a_namespace_at_its_watcher_cap_leaves_another_its_watchers(
    server: RunningServer, stubs: tuple[Any, Any]
) -> None:
    stub_a, stub_b = stubs
    lane_id = new_lane_id("shared")
    for stub in stubs:  # one id, two namespaces: two lanes
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    calls: list[Any] = []

    def watch(stub: Any) -> Any:
        call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        calls.append(call)
        return call

    try:
        for _ in range(2):  # team-a at its cap: 2 of the process's 3
            assert (await watch(stub_a).read()).WhichOneof("item") == "snapshot"
        await refused(watch(stub_a).read, "TOO_MANY_WATCHERS", "namespace")
        # The HTTP port serves the same handler: team-a is refused there too ...
        async with http_client(HTTPVersion.HTTP1) as http:
            caller = Caller(http_url(server), ProtocolType.CONNECT, "json", http)
            with pytest.raises(ConnectError) as caught:
                async for _ in caller.watch(pb.WatchLaneRequest(lane_id=lane_id), TOKEN_A):
                    break
            assert connect_reason(caught.value) == "TOO_MANY_WATCHERS"
            # ... while team-b attaches, over HTTP, and takes the process's last place.
            stream: Any = caller.watch(pb.WatchLaneRequest(lane_id=lane_id), TOKEN_B)
            async with contextlib.aclosing(stream):
                async for first in stream:
                    assert first.WhichOneof("item") == "snapshot"
                    assert first.snapshot.snapshot.lane_id == lane_id
                    # The process is full now: its cap holds for every namespace.
                    await refused(watch(stub_b).read, "TOO_MANY_WATCHERS", "process")
                    break
        # A team-a watcher leaves: team-a has a place again.
        calls[0].cancel()
        await until(lambda: lane_servicer_of(server).watcher_shares.held("team-a") == 1)
        assert (await watch(stub_a).read()).WhichOneof("item") == "snapshot"
    finally:
        for call in calls:
            call.cancel()


async def test_a_watch_lanes_stream_holds_one_watcher_slot_of_its_namespace(
    server: RunningServer, stubs: tuple[Any, Any]
) -> None:
    stub_a, stub_b = stubs
    calls: list[Any] = []

    def follow(stub: Any) -> Any:
        call = stub.WatchLanes(pb.WatchLanesRequest(lane_id_prefix=new_lane_id("few")))
        calls.append(call)
        return call

    try:
        for _ in range(2):  # team-a at its cap: 2 of the process's 3
            assert (await follow(stub_a).read()).listing_complete
        await refused(follow(stub_a).read, "TOO_MANY_WATCHERS", "namespace")
        assert (await follow(stub_b).read()).listing_complete
        await refused(follow(stub_b).read, "TOO_MANY_WATCHERS", "process")
        calls[0].cancel()
        await until(lambda: lane_servicer_of(server).watcher_shares.held("team-a") == 1)
        assert (await follow(stub_a).read()).listing_complete
    finally:
        for call in calls:
            call.cancel()


async def test_a_namespace_at_its_session_cap_leaves_another_its_sessions(
    stubs: tuple[Any, Any],
) -> None:
    stub_a, stub_b = stubs
    lane_id = new_lane_id("driven")
    await stub_a.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    list_lanes = pb.DriveLaneRequest(sequence=1, list_lanes=pb.ListLanesRequest())
    first = stub_a.DriveLane()
    others: list[Any] = []
    try:
        await first.write(list_lanes)
        assert (await first.read()).HasField("list_lanes")  # team-a holds its one session
        second = stub_a.DriveLane()
        others.append(second)
        await refused(second.read, "TOO_MANY_SESSIONS", "namespace")
        for_b = stub_b.DriveLane()
        others.append(for_b)
        await for_b.write(list_lanes)
        assert (await for_b.read()).HasField("list_lanes")
        # The Python session of a namespace at its cap sends its commands unary instead.
        async with LaneSession(stub_a) as session:
            snapshot = await session.call(pb.GetLaneSnapshotRequest(lane_id=lane_id))
            assert snapshot.snapshot.lane_id == lane_id
            update = pb.UpdateLaneConfigRequest(
                lane_id=lane_id, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
            )
            assert (await session.call(update)).revision == 2
            assert session.streams_opened == 1  # refused once, then unary
        # Team-a's session ends: its place is free again.
        await first.done_writing()
        assert await first.read() is grpc.aio.EOF
        again = stub_a.DriveLane()
        others.append(again)
        await again.write(list_lanes)
        assert (await again.read()).HasField("list_lanes")
    finally:
        first.cancel()
        for call in others:
            call.cancel()


async def test_a_namespace_at_its_transfer_cap_leaves_another_its_exports(
    server: RunningServer, stubs: tuple[Any, Any]
) -> None:
    stub_a, stub_b = stubs
    lane_id = new_lane_id("exported")
    for stub in stubs:
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    export = pb.ExportLaneRequest(lane_id=lane_id)
    file = b"".join([piece.data async for piece in stub_a.ExportLane(export)])
    assert lane_servicer_of(server).transfer_shares.held() == 0  # the export's slot is back
    # Team-a's import is under way (its file not yet all sent): team-a's one transfer.
    imported = new_lane_id("imported")
    upload = stub_a.ImportLane()
    try:
        await upload.write(pb.ImportLaneRequest(lane_id=imported, data=file[:10]))
        await until(lambda: lane_servicer_of(server).transfer_shares.held("team-a") == 1)
        await refused(stub_a.ExportLane(export).read, "TOO_MANY_TRANSFERS", "namespace")
        async with http_client(HTTPVersion.HTTP1) as http:
            caller = Caller(http_url(server), ProtocolType.CONNECT, "proto", http)
            with pytest.raises(ConnectError) as caught:
                async for _ in caller.client.execute_server_stream(
                    request=export,
                    method=method("ExportLane"),
                    headers={"authorization": f"Bearer {TOKEN_A}"},
                ):
                    break
            assert connect_reason(caught.value) == "TOO_MANY_TRANSFERS"
        # Team-b exports meanwhile.
        assert b"".join([p.data async for p in stub_b.ExportLane(export)]).startswith(b"{")
        await upload.write(pb.ImportLaneRequest(data=file[10:]))
        await upload.done_writing()
        await upload
    finally:
        upload.cancel()
    # The import is done: team-a exports again.
    again = pb.ExportLaneRequest(lane_id=imported)
    assert b"".join([p.data async for p in stub_a.ExportLane(again)]).startswith(b"{")


def lane_servicer_of(server: RunningServer) -> Any:
    assert server.lane_servicer is not None
    return server.lane_servicer


def http_url(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.http_port}"
