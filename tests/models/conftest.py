"""Fixtures of the model adapter tests: a local provider server per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.models.fake_provider import FakeProvider


@pytest_asyncio.fixture(loop_scope="session")
async def provider() -> AsyncIterator[FakeProvider]:
    """A :class:`FakeProvider` on 127.0.0.1, a free port, for this test alone."""
    async with FakeProvider() as server:
        yield server
