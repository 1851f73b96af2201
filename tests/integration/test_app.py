"""The app layer: configuration, start-up, health, reflection, migrations, graceful shutdown.

LaneService's own RPCs are tested elsewhere; here only what the process around them promises.
Subprocess tests run ``python -m lane.server.app`` exactly as an operator would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from lane.server.app.config import ConfigError, Settings, mask_password
from lane.server.app.server import LANE_SERVICE_NAME, RunningServer, StartupError, start_server
from lane.server.store import Store
from tests.support.servers import stop_process

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Retry connecting quickly while a child process starts, instead of gRPC's 1 s+ backoff.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
]


# --- the in-process server (conftest's lane_server) ---------------------------------------


@pytest.mark.parametrize("service", ["", "lane.v1.LaneService"])
async def test_health_reports_serving(lane_channel: grpc.aio.Channel, service: str) -> None:
    stub = health_pb2_grpc.HealthStub(lane_channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    assert response.status == SERVING


async def test_reflection_lists_and_describes_the_services(
    lane_channel: grpc.aio.Channel,
) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(lane_channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="lane.v1.LaneService"),
    ]
    call = stub.ServerReflectionInfo(iter(requests), timeout=5)
    listed, described = [response async for response in call]

    names = {service.name for service in listed.list_services_response.service}
    assert names == {
        "lane.v1.LaneService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
    # grpcurl and friends need the descriptors too, not just the names.
    assert described.file_descriptor_response.file_descriptor_proto


async def test_lane_server_reports_its_start(lane_server: RunningServer) -> None:
    assert lane_server.port > 0
    assert lane_server.address == f"127.0.0.1:{lane_server.port}"
    # conftest's store fixture migrated the database first, so the server found nothing to do.
    assert lane_server.applied_migrations == []


async def test_start_server_refuses_a_port_in_use_and_cleans_up(
    lane_server: RunningServer, session_database_url: str
) -> None:
    # Autocommit: pg_stat_activity is snapshotted once per transaction.
    async with await psycopg.AsyncConnection.connect(
        session_database_url, autocommit=True
    ) as observer:
        before = await _backends(observer)
        with pytest.raises(StartupError, match="cannot listen on"):
            await start_server(session_database_url, listen=f"127.0.0.1:{lane_server.port}")
        # The half-started service's pool and hub connections are all gone again (backends
        # exit asynchronously after the client closes, hence the wait).
        for _ in range(100):
            if await _backends(observer) == before:
                break
            await asyncio.sleep(0.05)
        assert await _backends(observer) == before


async def _backends(conn: psycopg.AsyncConnection[tuple[int]]) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def test_start_server_fails_fast_on_an_unreachable_database() -> None:
    port = _free_port()  # nothing listens there
    url = f"postgresql://lane:secret@127.0.0.1:{port}/lane"
    with pytest.raises(StartupError, match="cannot connect") as caught:
        await asyncio.wait_for(start_server(url), timeout=15)
    assert "secret" not in str(caught.value)


# --- migrations -----------------------------------------------------------------------------


async def test_migrations_are_idempotent(fresh_database_url: str, store: Store) -> None:
    fresh = await Store.open(fresh_database_url)
    try:
        first = await fresh.migrate()
        assert first, "a new database must get every migration"
        assert await fresh.migrate() == []
    finally:
        await fresh.close()
    # The shared session store was migrated at set-up; again is a no-op there too.
    assert await store.migrate() == []


async def test_concurrent_migrations_apply_the_schema_once(fresh_database_url: str) -> None:
    # The migrator's advisory lock key (private to the store). Holding it makes both migrators
    # provably wait at the same time, instead of hoping that two tasks overlap.
    from lane.server.store.migrations import _MIGRATION_LOCK

    stores = [await Store.open(fresh_database_url) for _ in range(2)]
    try:
        async with await psycopg.AsyncConnection.connect(fresh_database_url) as holder:
            async with holder.transaction():
                await holder.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                racing = [asyncio.ensure_future(store.migrate()) for store in stores]
                await _wait_until_advisory_waiters(holder, expected=2)
            results = await asyncio.wait_for(asyncio.gather(*racing), timeout=30)
        async with await psycopg.AsyncConnection.connect(fresh_database_url) as conn:
            cur = await conn.execute("SELECT name FROM schema_migrations ORDER BY version")
            recorded = [row[0] for row in await cur.fetchall()]
            cur = await conn.execute("SELECT to_regclass('lanes') IS NOT NULL")
            assert await cur.fetchone() == (True,)
    finally:
        for store in stores:
            await store.close()

    assert recorded, "the schema must have been applied"
    # One migrator applied everything; the other, let in after it, found nothing left to do.
    assert sorted(results, key=len) == [[], recorded]


async def _wait_until_advisory_waiters(
    conn: psycopg.AsyncConnection[tuple[int]], expected: int
) -> None:
    query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    for _ in range(200):
        # Read inside the holder's transaction, which is fine: pg_locks is live, not MVCC.
        cur = await conn.execute(query)
        row = await cur.fetchone()
        if row is not None and row[0] >= expected:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"expected {expected} migrators waiting on the advisory lock")


# --- the process: python -m lane.server.app ----------------------------------------------------


async def test_process_serves_and_shuts_down_gracefully_on_sigterm(
    fresh_database_url: str, tmp_path: Path
) -> None:
    port, grace = _free_port(), 2.0
    log = tmp_path / "service.log"
    env = {
        "LANE_DATABASE_URL": fresh_database_url,
        "LANE_LISTEN": f"127.0.0.1:{port}",
        "LANE_GRACE_SECONDS": str(grace),
    }
    async with _service_process(env, log, tmp_path) as process:
        await asyncio.wait_for(_wait_until_serving(port, process), timeout=30)
        output = log.read_text()
        assert f"listening on 127.0.0.1:{port}" in output
        assert mask_password(fresh_database_url) in output
        assert "migrations applied now: 0001_" in output

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING

            loop = asyncio.get_running_loop()
            process.send_signal(signal.SIGTERM)
            signalled = loop.time()
            # Health flips first, while calls in flight still have their grace period.
            assert (await asyncio.wait_for(watch.read(), timeout=5)).status == NOT_SERVING
            status = await asyncio.wait_for(process.wait(), timeout=grace + 15)
            elapsed = loop.time() - signalled

            # The open Watch stream is an in-flight call: it was given the grace period, no
            # more, then cancelled.
            with pytest.raises(grpc.aio.AioRpcError):
                await asyncio.wait_for(watch.read(), timeout=5)

    output = log.read_text()
    assert status == 0, output
    assert grace - 0.5 <= elapsed <= grace + 5, (elapsed, output)
    assert "received SIGTERM" in output
    assert _port_is_closed(port)


async def test_process_without_database_url_runs_embedded_postgres(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    cluster = data_dir / "postgres"
    try:
        # uvloop by default (a dependency wherever it builds); LANE_EVENT_LOOP=asyncio switches.
        runs = [("0001_", "uvloop"), ("none (schema up to date)", "asyncio")]
        for run, (expected_migrations, loop) in enumerate(runs):
            port = _free_port()
            log = tmp_path / f"service-{run}.log"
            env = {"LANE_DATA_DIR": str(data_dir), "LANE_LISTEN": f"127.0.0.1:{port}"}
            if loop == "asyncio":
                env["LANE_EVENT_LOOP"] = "asyncio"
            async with _service_process(env, log, tmp_path) as process:
                # The first run includes initdb.
                await asyncio.wait_for(_wait_until_serving(port, process), timeout=90)
                output = log.read_text()
                assert f"database: embedded PostgreSQL at {cluster}" in output
                assert f"migrations applied now: {expected_migrations}" in output
                assert f"event loop: {loop}" in output
                assert (cluster / "PG_VERSION").exists()

                process.send_signal(signal.SIGTERM)
                status = await asyncio.wait_for(process.wait(), timeout=30)
            assert status == 0, log.read_text()
            # Stopped, data kept: the second run reuses the cluster and its schema.
            assert not (cluster / "postmaster.pid").exists()
            assert (cluster / "PG_VERSION").exists()
    finally:
        _stop_stray_postgres(cluster)


async def test_process_exits_1_when_the_database_is_unreachable(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    url = f"postgresql://lane:secret@127.0.0.1:{_free_port()}/lane"
    env = {"LANE_DATABASE_URL": url, "LANE_LISTEN": f"127.0.0.1:{_free_port()}"}
    async with _service_process(env, log, tmp_path) as process:
        status = await asyncio.wait_for(process.wait(), timeout=30)
    output = log.read_text()
    assert status == 1, output
    assert "failed to start: cannot connect to the database postgresql://lane:***@" in output
    assert "secret" not in output


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LANE_LISTEN", "garbage"),
        ("LANE_GRACE_SECONDS", "-1"),
        ("LANE_NOTIFY", "maybe"),
        ("LANE_POLL_INTERVAL_SECONDS", "0"),
        ("LANE_DATABASE_URL", "not a url"),
        ("LANE_EVENT_LOOP", "trio"),
        ("LANE_DB_POOL_SIZE", "0"),
        ("LANE_DB_CHECKOUT_TIMEOUT_SECONDS", "-1"),
        ("LANE_REQUEST_RETENTION_SECONDS", "59"),
    ],
)
async def test_process_refuses_a_bad_config_value(
    variable: str, value: str, tmp_path: Path
) -> None:
    log = tmp_path / "service.log"
    # LANE_DATA_DIR points into tmp_path: if validation were skipped, nothing lands in the repo.
    env = {"LANE_DATA_DIR": str(tmp_path / "data"), variable: value}
    async with _service_process(env, log, tmp_path) as process:
        status = await asyncio.wait_for(process.wait(), timeout=30)
    output = log.read_text()
    assert status == 2, output
    assert f"configuration error: {variable}=" in output
    assert not (tmp_path / "data").exists()


# --- Settings ------------------------------------------------------------------------------


def test_settings_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({"LANE_DATABASE_URL": "", "UNRELATED": "x"})
    assert settings == Settings(
        database_url=None,
        data_dir=tmp_path / ".lane-data",
        listen="127.0.0.1:50051",
        grace_seconds=5.0,
        notify=True,
        poll_interval_seconds=1.0,
    )


def test_settings_read_every_variable(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "LANE_DATABASE_URL": "postgresql://lane:pw@db:5432/lane",
            "LANE_DATA_DIR": str(tmp_path),
            "LANE_LISTEN": "[::1]:0",
            "LANE_GRACE_SECONDS": "0",
            "LANE_NOTIFY": "OFF",
            "LANE_POLL_INTERVAL_SECONDS": "0.25",
            "LANE_EVENT_LOOP": "asyncio",
            "LANE_WATCH_WRITE_DEADLINE_SECONDS": "7.5",
            "LANE_WATCH_STREAM_BYTES": "1048576",
            "LANE_MAX_WATCHERS_PER_NAMESPACE": "7",
            "LANE_MAX_SESSIONS": "30",
            "LANE_MAX_SESSIONS_PER_NAMESPACE": "3",
            "LANE_MAX_TRANSFERS": "4",
            "LANE_MAX_TRANSFERS_PER_NAMESPACE": "2",
        }
    )
    assert (settings.max_watchers_per_namespace, settings.max_sessions) == (7, 30)
    assert (settings.max_sessions_per_namespace, settings.max_transfers) == (3, 4)
    assert settings.max_transfers_per_namespace == 2
    assert settings.event_loop == "asyncio"
    assert settings.watch_write_deadline_seconds == 7.5
    assert settings.watch_stream_bytes == 1 << 20
    assert settings.database_url == "postgresql://lane:pw@db:5432/lane"
    assert "pw" not in repr(settings)
    assert settings.data_dir == tmp_path
    assert settings.listen == "[::1]:0"
    assert settings.grace_seconds == 0.0
    assert settings.notify is False
    assert settings.poll_interval_seconds == 0.25


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LANE_LISTEN", "50051"),
        ("LANE_LISTEN", ":50051"),
        ("LANE_LISTEN", "127.0.0.1:65536"),
        ("LANE_LISTEN", "::1:50051"),
        ("LANE_GRACE_SECONDS", "soon"),
        ("LANE_GRACE_SECONDS", "nan"),
        ("LANE_POLL_INTERVAL_SECONDS", "-0.5"),
        ("LANE_POLL_INTERVAL_SECONDS", "1000"),
        ("LANE_NOTIFY", "2"),
        ("LANE_EVENT_LOOP", "UVLOOP!"),
        ("LANE_WATCH_WRITE_DEADLINE_SECONDS", "0"),
        ("LANE_WATCH_WRITE_DEADLINE_SECONDS", "86400"),
        ("LANE_WATCH_STREAM_BYTES", "8M"),
        ("LANE_WATCH_STREAM_BYTES", "1024"),
        ("LANE_MAX_WATCHERS_PER_NAMESPACE", "0"),
        ("LANE_MAX_SESSIONS", "many"),
        ("LANE_MAX_TRANSFERS_PER_NAMESPACE", "-1"),
    ],
)
def test_settings_name_the_bad_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}=") as caught:
        Settings.from_env({variable: value})
    assert caught.value.variable == variable


def test_settings_never_echo_a_bad_database_url() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"LANE_DATABASE_URL": "host=db password=hunter2 oops"})
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://lane:pw@db:5432/lane", "postgresql://lane:***@db:5432/lane"),
        ("postgresql://lane@db/lane?password=pw", "postgresql://lane@db/lane?password=***"),
        ("postgresql://lane@db/lane", "postgresql://lane@db/lane"),
        ("host=db password=pw dbname=lane", "password=*** dbname=lane host=db"),
    ],
)
def test_mask_password(dsn: str, masked: str) -> None:
    assert mask_password(dsn) == masked


# --- helpers -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _service_process(
    env: dict[str, str], log: Path, cwd: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run ``python -m lane.server.app`` with ``env`` over a LANE_-free copy of our environment."""
    # The developer's own LANE_* settings must not leak into the child.
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LANE_")} | env
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lane.server.app",
            env=child_env,
            cwd=cwd,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        yield process
    except BaseException:
        # pytest shows captured output of a failed test: include what the service said. (A
        # blocking read of a few KiB, once, after a failure: harmless here.)
        print(f"--- {log.name}:\n{log.read_text()}")  # noqa: ASYNC240
        raise
    finally:
        await stop_process(process, grace=15)  # still running: a failed test


async def _wait_until_serving(port: int, process: asyncio.subprocess.Process) -> None:
    """Poll health until the child reports LaneService SERVING; fail if it exits instead."""
    request = health_pb2.HealthCheckRequest(service=LANE_SERVICE_NAME)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=FAST_RECONNECT) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while process.returncode is None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                if (await stub.Check(request, timeout=1)).status == SERVING:
                    return
            await asyncio.sleep(0.1)
    pytest.fail(f"service exited with {process.returncode} before serving")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _stop_stray_postgres(cluster: Path) -> None:
    """If a failed test left the embedded PostgreSQL running, fast-shut it down."""
    pid_file = cluster / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGINT)
