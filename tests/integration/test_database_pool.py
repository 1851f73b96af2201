"""The database pool as a setting: ``LANE_DB_POOL_SIZE``, ``LANE_DB_CHECKOUT_TIMEOUT_SECONDS``;
and a pool that is merely busy answers RESOURCE_EXHAUSTED ``DATABASE_BUSY``, not UNAVAILABLE
(service/lane/server/store/pool.py). A database that cannot be reached:
tests/outage/test_database_down.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest
import pytest_asyncio
from lane.client.commands import call
from lane.client.errors import lane_error
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2
from prometheus_client import CollectorRegistry

from lane.server.app.config import ConfigError, Settings
from lane.server.app.server import RunningServer
from lane.server.store.pool import LanePool
from tests.integration.lanes import new_lane_id, user
from tests.support.servers import serve

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)


# --- settings --------------------------------------------------------------------------------


def test_pool_settings_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.db_pool_size == 10
    assert settings.db_checkout_timeout_seconds == 10.0
    assert settings.db_reconnect_seconds == 1.0
    assert settings.request_retention_seconds == 86400.0


def test_pool_settings_read() -> None:
    settings = Settings.from_env(
        {
            "LANE_DB_POOL_SIZE": "25",
            "LANE_DB_CHECKOUT_TIMEOUT_SECONDS": "2.5",
            "LANE_REQUEST_RETENTION_SECONDS": "60",
            "LANE_DB_RECONNECT_SECONDS": "0.25",
        }
    )
    assert settings.db_pool_size == 25
    assert settings.db_checkout_timeout_seconds == 2.5
    assert settings.db_reconnect_seconds == 0.25
    assert settings.request_retention_seconds == 60.0


# --- a busy pool -----------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def one_connection_server(
    fresh_database_url: str,
) -> AsyncIterator[tuple[RunningServer, Stub]]:
    """A server whose pool has a single connection, waiting a second for it."""
    settings = Settings(
        database_url=fresh_database_url, db_pool_size=1, db_checkout_timeout_seconds=1.0
    )
    async with serve(settings) as served:
        yield served


def _enqueue(lane_id: str, text: str, request_id: str) -> pb.EnqueueMessageRequest:
    return pb.EnqueueMessageRequest(
        lane_id=lane_id,
        kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
        message=user(text),
        request_id=request_id,
    )


async def _create(stub: Stub, lane_id: str) -> None:
    configuration = snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="p", model_id="m")
    )
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id, configuration=configuration))


async def _until(predicate_query: str, conn: psycopg.AsyncConnection[tuple[int]]) -> None:
    """Poll ``predicate_query`` (a count) until it is positive; fail after 20 s."""
    give_up = time.monotonic() + 20
    while time.monotonic() < give_up:
        cur = await conn.execute(predicate_query)
        row = await cur.fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"never true: {predicate_query}")


async def test_a_busy_pool_answers_database_busy_and_writes_nothing(
    one_connection_server: tuple[RunningServer, Stub], fresh_database_url: str
) -> None:
    running, stub = one_connection_server
    held, other = new_lane_id("held"), new_lane_id("other")
    await _create(stub, held)
    await _create(stub, other)

    async with (
        await psycopg.AsyncConnection.connect(fresh_database_url, autocommit=True) as observer,
        await psycopg.AsyncConnection.connect(fresh_database_url) as holder,
    ):
        before = await _lane_revision(observer, other)
        async with holder.transaction():
            # Hold the lane's row lock: a command on it blocks, holding the pool's only
            # connection until the lock is released.
            await holder.execute("SELECT 1 FROM lanes WHERE lane_id = %s FOR UPDATE", (held,))
            blocked = asyncio.ensure_future(stub.EnqueueMessage(_enqueue(held, "a", "held-1")))
            await _until(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'",
                observer,
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.EnqueueMessage(_enqueue(other, "b", "busy-1"), timeout=30)
            error = lane_error(caught.value)
            assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            assert error.reason == "DATABASE_BUSY", error
            assert error.metadata["poolSize"] == "1"
            # Nothing was written: no event, no stored answer.
            assert await _lane_revision(observer, other) == before
            cur = await observer.execute(
                "SELECT count(*) FROM requests WHERE request_id = 'busy-1'"
            )
            assert await cur.fetchone() == (0,)
            assert not blocked.done()
            # The Python client retries DATABASE_BUSY (with the same request id).
            refused = _busy_refusals(running.registry)
            retried = asyncio.ensure_future(
                call(stub.EnqueueMessage, _enqueue(other, "b", "busy-1"), retry_seconds=120)
            )
            while _busy_refusals(running.registry) == refused:
                assert not retried.done(), retried.result()
                await asyncio.sleep(0.02)
        # The lock is released: the blocked command commits, and so does the retried one.
        assert (await blocked).revision > 0
        assert (await retried).revision == before + 1
    pool = running.store.pool
    assert isinstance(pool, LanePool)
    assert pool.lent == 0  # every connection given back


def _busy_refusals(registry: CollectorRegistry) -> float:
    """EnqueueMessage calls this process answered RESOURCE_EXHAUSTED so far."""
    labels = {"method": "EnqueueMessage", "code": "RESOURCE_EXHAUSTED"}
    return registry.get_sample_value("lane_commands_total", labels) or 0.0


async def _lane_revision(conn: psycopg.AsyncConnection[tuple[int]], lane_id: str) -> int:
    cur = await conn.execute("SELECT revision FROM lanes WHERE lane_id = %s", (lane_id,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LANE_DB_POOL_SIZE", "0"),
        ("LANE_DB_POOL_SIZE", "-3"),
        ("LANE_DB_POOL_SIZE", "2.5"),
        ("LANE_DB_POOL_SIZE", "many"),
        ("LANE_DB_CHECKOUT_TIMEOUT_SECONDS", "0"),
        ("LANE_DB_CHECKOUT_TIMEOUT_SECONDS", "-1"),
        ("LANE_DB_CHECKOUT_TIMEOUT_SECONDS", "10000"),
        ("LANE_DB_CHECKOUT_TIMEOUT_SECONDS", "inf"),
        ("LANE_DB_CHECKOUT_TIMEOUT_SECONDS", "soon"),
        ("LANE_REQUEST_RETENTION_SECONDS", "59"),
        ("LANE_REQUEST_RETENTION_SECONDS", "0"),
        ("LANE_REQUEST_RETENTION_SECONDS", "nan"),
        ("LANE_REQUEST_RETENTION_SECONDS", "a day"),
        ("LANE_DB_RECONNECT_SECONDS", "0"),
        ("LANE_DB_RECONNECT_SECONDS", "0.01"),
        ("LANE_DB_RECONNECT_SECONDS", "61"),
        ("LANE_DB_RECONNECT_SECONDS", "often"),
    ],
)
def test_pool_settings_name_the_bad_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}=") as caught:
        Settings.from_env({variable: value})
    assert caught.value.variable == variable
