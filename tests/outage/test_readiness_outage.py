"""Readiness tells the truth, and the pool comes back on its own (service/lane/server/app/
readiness.py, service/lane/server/store/pool.py), on a dedicated PostgreSQL that each test
stops, starts or turns read-only (tests/outage/restartable_postgres.py):

* an idle process (no command to notice) turns NOT_SERVING while its database is down, over gRPC
  health and ``GET /readyz``, stays live, and is SERVING again once the database is back;
* a database turned read-only under open connections (a primary fenced during a failover):
  commands are answered UNAVAILABLE with a retry delay, never INTERNAL, and nothing is written;
  the process is not ready until the database takes writes again;
* a command waiting while the database is unreachable makes the pool try to connect sooner
  than its own schedule would.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.config import Settings
from lane.server.app.readiness import LIVENESS_SERVICE
from lane.server.app.server import LANE_SERVICE_NAME, RunningServer
from lane.server.store.pool import LanePool
from tests.integration.lanes import new_lane_id, outcome, queue_next_run
from tests.outage.restartable_postgres import RestartablePostgres
from tests.support.servers import serve

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)
SERVING = "SERVING"
NOT_SERVING = "NOT_SERVING"
#: Readiness follows the database within this (it checks every 0.25-1 s).
READINESS_WITHIN = 10.0


async def _health(running: RunningServer, service: str) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


def _get(running: RunningServer, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{running.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def _readiness(running: RunningServer) -> tuple[str, str, int]:
    """(gRPC readiness of LaneService, of the server overall, HTTP status of /readyz)."""
    lane, overall = await asyncio.gather(_health(running, LANE_SERVICE_NAME), _health(running, ""))
    status, _ = await asyncio.to_thread(_get, running, "/readyz")
    return lane, overall, status


async def _until(check: Callable[[], Any], want: Any, within: float = READINESS_WITHIN) -> Any:
    give_up = time.monotonic() + within
    while (got := await check()) != want:
        assert time.monotonic() < give_up, f"still {got!r}, not {want!r}, after {within}s"
        await asyncio.sleep(0.1)
    return got


async def test_an_idle_process_is_not_ready_while_its_database_is_down(
    postgres: RestartablePostgres,
) -> None:
    settings = Settings(database_url=postgres.uri, http_listen="127.0.0.1:0")
    async with serve(settings) as (running, _):
        assert await _readiness(running) == (SERVING, SERVING, 200)
        await asyncio.to_thread(postgres.stop, "fast")
        try:
            await _until(lambda: _readiness(running), (NOT_SERVING, NOT_SERVING, 503))
            status, body = await asyncio.to_thread(_get, running, "/readyz")
            assert (status, body.split(" (")[0]) == (
                503,
                "not ready: no connection to a writable database",
            )
            # Live all along: restarting the process would not bring the database back.
            assert await _health(running, LIVENESS_SERVICE) == SERVING
            assert await asyncio.to_thread(_get, running, "/livez") == (200, "live\n")
        finally:
            await asyncio.to_thread(postgres.start)
        await _until(lambda: _readiness(running), (SERVING, SERVING, 200))
        assert await asyncio.to_thread(_get, running, "/readyz") == (200, "ready\n")


async def test_a_read_only_database_answers_unavailable_and_is_not_ready(
    postgres: RestartablePostgres,
) -> None:
    settings = Settings(database_url=postgres.uri, http_listen="127.0.0.1:0")
    async with serve(settings) as (running, stub):
        lane_id = new_lane_id("fenced")
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        before = (await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
        await asyncio.to_thread(_set_read_only, postgres.uri, True)
        try:
            # Every connection the pool holds sees the change; each command is refused alike.
            answers = [
                await outcome(
                    stub.EnqueueMessage(queue_next_run(lane_id, f"fenced-{n}"), timeout=30)
                )
                for n in range(12)
            ]
            assert {code for code, _, _ in answers} == {"UNAVAILABLE"}, answers
            assert all(reason == "UNAVAILABLE" and delay for _, reason, delay in answers)
            await _until(lambda: _readiness(running), (NOT_SERVING, NOT_SERVING, 503))
            _, body = await asyncio.to_thread(_get, running, "/readyz")
            assert "read-only" in body, body
        finally:
            await asyncio.to_thread(_set_read_only, postgres.uri, False)
        await _until(lambda: _readiness(running), (SERVING, SERVING, 200))
        after = (await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
        assert after == before, "a refused command wrote something"
        assert await outcome(stub.EnqueueMessage(queue_next_run(lane_id, "writable"))) == (
            "OK",
            "",
            None,
        )


def _set_read_only(uri: str, on: bool) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        if on:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        else:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
        conn.execute("SELECT pg_reload_conf()")


async def test_a_waiting_command_makes_the_pool_reconnect_sooner(
    postgres: RestartablePostgres,
) -> None:
    # The pool's own attempts come 10-20 s apart here; commands arriving while the database is
    # unreachable make one happen after a quarter of that (5 s) at most.
    settings = Settings(database_url=postgres.uri, db_reconnect_seconds=20.0)
    async with serve(settings) as (running, stub):
        pool = running.store.pool
        assert isinstance(pool, LanePool)
        lane_id = new_lane_id("waiting")
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        await asyncio.to_thread(postgres.stop, "fast")
        try:
            answer = await outcome(stub.EnqueueMessage(queue_next_run(lane_id, "down"), timeout=30))
            assert answer[:2] == ("UNAVAILABLE", "UNAVAILABLE")
            await _until(lambda: _async(not pool.reachable), True)
        finally:
            await asyncio.to_thread(postgres.start)
        back = time.monotonic()
        while (answer := await outcome(stub.EnqueueMessage(queue_next_run(lane_id, "back")))) != (
            "OK",
            "",
            None,
        ):
            assert answer[:2] == ("UNAVAILABLE", "UNAVAILABLE"), answer
            assert time.monotonic() - back < 9.0, "no commit within 9 s of the restart"
            await asyncio.sleep(0.1)


async def _async(value: Any) -> Any:
    return value
