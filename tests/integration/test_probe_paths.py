"""The probes of a healthy service (service/lane/server/app/readiness.py, probe_paths.py): the
gRPC health service's liveness and readiness names, and the HTTP port's ``/livez`` and
``/readyz``, which need no token and answer whatever Host the probe sends (a kubelet sends the
pod's IP). Not ready while the database is away: tests/outage/test_readiness_outage.py and
tests/outage/test_failover.py.
"""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lane.server.app.config import Settings
from lane.server.app.readiness import LIVENESS_SERVICE
from lane.server.app.server import LANE_SERVICE_NAME, RunningServer, start_server

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def authed(session_database_url: str) -> AsyncIterator[RunningServer]:
    """A service with both ports and auth on."""
    settings = Settings(database_url=session_database_url, auth_tokens={"probe-token": "team"})
    running = await start_server(settings, listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


def _request(port: int, method: str, path: str, host: str) -> tuple[int, str, str]:
    """(status, body, content-type) of one plain HTTP/1.1 request with ``Host: host``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers={"Host": host})
        answer = conn.getresponse()
        return answer.status, answer.read().decode(), answer.getheader("content-type") or ""
    finally:
        conn.close()


@pytest.mark.parametrize("host", ["10.1.2.3:8080", "lane.internal", "127.0.0.1"])
async def test_http_probes_answer_without_a_token_whatever_the_host(
    authed: RunningServer, host: str
) -> None:
    assert authed.http_port is not None
    port = authed.http_port
    live = await asyncio.to_thread(_request, port, "GET", "/livez", host)
    ready = await asyncio.to_thread(_request, port, "GET", "/readyz", host)
    assert live == (200, "live\n", "text/plain; charset=utf-8")
    assert ready == (200, "ready\n", "text/plain; charset=utf-8")
    # Control: the service itself still wants the token on this port.
    refused = await asyncio.to_thread(
        _request, port, "POST", "/lane.v1.LaneService/ListLanes", host
    )
    assert refused[0] != 200


async def test_http_probes_take_head_and_refuse_other_methods(authed: RunningServer) -> None:
    assert authed.http_port is not None
    port = authed.http_port
    head = await asyncio.to_thread(_request, port, "HEAD", "/readyz", "127.0.0.1")
    assert head[:2] == (200, "")
    posted = await asyncio.to_thread(_request, port, "POST", "/readyz", "127.0.0.1")
    assert posted[:2] == (405, "use GET\n")


async def test_grpc_health_names_liveness_and_readiness_without_a_token(
    authed: RunningServer,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{authed.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in (LIVENESS_SERVICE, LANE_SERVICE_NAME, ""):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    assert authed.readiness is not None and authed.readiness.ready
