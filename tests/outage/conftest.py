"""The outage tests' dedicated PostgreSQL: ``postgres``, a cluster of the test's own that it may
stop, start or reconfigure (tests/outage/restartable_postgres.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.outage.restartable_postgres import RestartablePostgres


@pytest_asyncio.fixture(loop_scope="session")
async def postgres(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RestartablePostgres]:
    """A PostgreSQL of this test's own, removed afterwards."""
    pg = await asyncio.to_thread(RestartablePostgres.create, tmp_path_factory.mktemp("pg"))
    try:
        yield pg
    finally:
        await asyncio.to_thread(pg.destroy)
