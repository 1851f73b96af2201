"""A database that cannot be reached answers UNAVAILABLE, never the busy pool's
RESOURCE_EXHAUSTED ``DATABASE_BUSY`` (service/lane/server/store/pool.py), and does so without
waiting for the checkout timeout: here 120 s, longer than every call's deadline, so a command that
waited for it would end DEADLINE_EXCEEDED instead.

A dedicated PostgreSQL (tests/outage/restartable_postgres.py) is stopped while the service's
pool has a single connection, lent out, and a command is waiting for it. The command is
answered UNAVAILABLE as soon as the pool fails to replace the connection, and so are the
commands after it; once PostgreSQL is back, commands commit again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer
from lane.server.store.pool import LanePool
from tests.integration.lanes import new_lane_id, outcome, queue_next_run
from tests.outage.restartable_postgres import RestartablePostgres
from tests.support.servers import serve

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)

#: A call's deadline: far below the checkout timeout the service is configured with.
DEADLINE = 30.0
CHECKOUT_TIMEOUT = 120.0


@pytest_asyncio.fixture(loop_scope="session")
async def service(postgres: RestartablePostgres) -> AsyncIterator[tuple[RunningServer, Stub]]:
    settings = Settings(
        database_url=postgres.uri, db_pool_size=1, db_checkout_timeout_seconds=CHECKOUT_TIMEOUT
    )
    async with serve(settings) as served:
        yield served


async def test_an_unreachable_database_answers_unavailable_at_once(
    postgres: RestartablePostgres, service: tuple[RunningServer, Stub]
) -> None:
    running, stub = service
    lane_id = new_lane_id("down")
    configuration = snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="p", model_id="m")
    )
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id, configuration=configuration))
    pool = running.store.pool
    assert isinstance(pool, LanePool)

    # The pool's only connection is lent (to this test), another command waits for it.
    conn = await pool.getconn()
    waiting_before = pool.get_stats().get("requests_waiting", 0)
    waiting = asyncio.ensure_future(
        outcome(stub.EnqueueMessage(queue_next_run(lane_id, "waiting"), timeout=DEADLINE))
    )
    await _until(lambda: pool.get_stats().get("requests_waiting", 0) > waiting_before)

    await asyncio.to_thread(postgres.stop, "fast")
    try:
        # The lent connection comes back broken, as a command's would: the pool replaces it,
        # cannot connect, and the waiting command is answered at once.
        with pytest.raises(psycopg.OperationalError):
            await conn.execute("SELECT 1")
        await pool.putconn(conn)
        assert (await waiting)[:2] == ("UNAVAILABLE", "UNAVAILABLE")
        for n in range(3):
            request = queue_next_run(lane_id, f"later-{n}")
            code, reason, retry_after = await outcome(
                stub.EnqueueMessage(request, timeout=DEADLINE)
            )
            assert (code, reason) == ("UNAVAILABLE", "UNAVAILABLE")
            assert retry_after is not None and 0 < retry_after <= 1.0
        assert not pool.reachable
    finally:
        await asyncio.to_thread(postgres.start)

    # Back: the pool reconnects on its own and commands commit again.
    give_up = time.monotonic() + 60
    while (answer := await outcome(stub.EnqueueMessage(queue_next_run(lane_id, "back"))))[
        0
    ] != "OK":
        assert answer[:2] == ("UNAVAILABLE", "UNAVAILABLE")
        assert time.monotonic() < give_up, "no commit within 60 s of PostgreSQL's restart"
        await asyncio.sleep(0.2)
    assert pool.reachable


async def _until(condition: Any) -> None:
    give_up = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < give_up, "condition never met"
        await asyncio.sleep(0.02)
