"""Helpers of the driver tests: the shared ones of :mod:`tests.support.driver_tools`
(re-exported here for the tests that import them from this module), and the driver tests' own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lane.client.model import ModelRequest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

# Every name, rather than a list kept in step with driver_tools by hand.
from tests.support.driver_tools import *  # noqa: F403
from tests.support.lanes import Probe


async def started_probe(stub: Any, lane_id: str) -> Probe:
    """Create the lane and follow it with a :class:`Probe` (fold == capture) from its start."""
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    probe = Probe(stub, lane_id)
    await probe.start()
    return probe


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
