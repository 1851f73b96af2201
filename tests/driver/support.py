"""Helpers of the driver tests: the shared ones of :mod:`tests.support.driver_tools`
(re-exported here for the tests that import them from this module), and the driver tests' own.
"""

from __future__ import annotations

import asyncio

from lane.client.model import ModelRequest
from lane.v1 import messages_pb2

# Every name, rather than a list kept in step with driver_tools by hand.
from tests.support.driver_tools import *  # noqa: F403


class HangingModel:
    """A model that never answers: the test aborts, or crashes, the run that asked it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        self.asked.set()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    async def wait_asked(self) -> None:
        """Wait until the run asked the model (its turn is open)."""
        await asyncio.wait_for(self.asked.wait(), 10)
