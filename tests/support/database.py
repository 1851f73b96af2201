"""Fixtures for a real PostgreSQL, fresh databases, a migrated store, the running service.

Where PostgreSQL comes from, first match wins (the choice is printed in the report header):

1. ``LANE_TEST_DATABASE_URL``: an existing server. The role needs CREATEDB: every database the
   tests use is created and dropped by them, the one in the URL is never touched.
2. testcontainers, when a Docker daemon answers.
3. An embedded PostgreSQL (the ``pgserver`` wheel) in a temporary directory: works as root and
   offline, so it is what runs on this project's machine.

Fixtures:

- ``database_url`` (session): URL of the server's maintenance database; connect to it to create
  databases, not to hold tables.
- ``fresh_database_url`` (per test): URL of a brand-new empty database, dropped after the test.
- ``session_database_url`` (session): URL of one migrated database shared by the session.
- ``store`` (session): a :class:`~lane.server.store.Store` on that database.
- ``lane_server`` (session): the whole service started on it, listening on 127.0.0.1, a free
  port (:class:`~lane.server.app.server.RunningServer`).
- ``lane_channel`` / ``lane_stub`` (session): a ``grpc.aio`` channel to it and a LaneService stub.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from lane.v1 import lane_service_pb2_grpc

from lane.server.app.config import mask_password
from lane.server.app.embedded import start_embedded
from lane.server.app.server import RunningServer, start_server
from lane.server.store import Store
from lane.server.testing import scratch_database

_ENV_URL = "LANE_TEST_DATABASE_URL"
_POSTGRES_IMAGE = "postgres:16-alpine"


@functools.cache
def _database_source() -> str:
    """Which PostgreSQL this run uses: "env", "testcontainers" or "embedded"."""
    if os.environ.get(_ENV_URL):
        return "env"
    if _docker_answers():
        return "testcontainers"
    return "embedded"


def pytest_report_header(config: pytest.Config) -> str:
    """Name the PostgreSQL the tests run against (decided before any test needs it)."""
    source = _database_source()
    if source == "env":
        return f"database: {_ENV_URL}={mask_password(os.environ[_ENV_URL])}"
    if source == "testcontainers":
        return f"database: testcontainers {_POSTGRES_IMAGE} (Docker answers)"
    return f"database: embedded pgserver in a temp dir (no {_ENV_URL}, no Docker daemon)"


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real PostgreSQL server's maintenance database, up for the whole session."""
    source = _database_source()
    if source == "env":
        yield os.environ[_ENV_URL]
    elif source == "testcontainers":
        container = _postgres_container_class()(_POSTGRES_IMAGE, driver=None)
        container.start()
        try:
            yield container.get_connection_url()
        finally:
            container.stop()
    else:
        embedded = start_embedded(tmp_path_factory.mktemp("embedded-pg"))
        try:
            yield embedded.uri
        finally:
            embedded.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_database_url(database_url: str) -> AsyncIterator[str]:
    """URL of a new, empty database for this test alone; dropped afterwards."""
    async with scratch_database(database_url, prefix="lane_test") as url:
        yield url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def session_database_url(database_url: str) -> AsyncIterator[str]:
    """URL of one database shared by the session (migrated by the ``store`` fixture)."""
    async with scratch_database(database_url, prefix="lane_test") as url:
        yield url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def store(session_database_url: str) -> AsyncIterator[Store]:
    """A :class:`Store` with every migration applied, on the session database."""
    opened = await Store.open(session_database_url)
    try:
        await opened.migrate()
        yield opened
    finally:
        await opened.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lane_server(session_database_url: str, store: Store) -> AsyncIterator[RunningServer]:
    """The full service (its own store, health, reflection) on 127.0.0.1, a free port."""
    # Depends on ``store`` so the schema exists before the server and the tests race for it.
    running = await start_server(session_database_url, listen="127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=1.0)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lane_channel(lane_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    """An insecure ``grpc.aio`` channel to ``lane_server``."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{lane_server.port}")
    try:
        yield channel
    finally:
        await channel.close()


@pytest.fixture(scope="session")
def lane_stub(lane_channel: grpc.aio.Channel) -> lane_service_pb2_grpc.LaneServiceAsyncStub:
    """A LaneService stub on ``lane_channel``."""
    return lane_service_pb2_grpc.LaneServiceStub(lane_channel)


def _docker_answers() -> bool:
    """True when a Docker daemon answers a ping within a couple of seconds."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False  # the common no-Docker case: skip importing docker at all
    # A failed ping leaves an unclosed socket behind in docker-py; its ResourceWarning would
    # surface later as an error under filterwarnings=error. Collect it while ignored.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        answered = _ping_docker()
        gc.collect()
    return answered


def _ping_docker() -> bool:
    # Kept separate from _docker_answers so the exception and its traceback (which hold the
    # socket) are gone when the caller collects garbage.
    try:
        # Through importlib: docker ships no type information and is optional here.
        docker: Any = importlib.import_module("docker")
        client = docker.from_env(timeout=2)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def _postgres_container_class() -> Any:
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        # Older testcontainers: the old module path warns that it is deprecated.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.postgres import PostgresContainer
    return PostgresContainer
