"""A retryable ModelError goes through ScheduleRetry/StartRetry; a driver taking the run over
while the retry is scheduled starts it and asks the model again (the adapters' own retry tests,
against local provider servers, are in tests/models)."""

from __future__ import annotations

import asyncio

import pytest
from lane.client.driver import Driver
from lane.client.model import ModelError, ModelRequest, assistant_message
from lane.v1 import messages_pb2, snapshot_pb2

from tests.driver.support import open_operation_id, snapshot, started_probe, until
from tests.driver.test_driver_recovery import crash
from tests.integration.lanes import kinds, new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED


class BusyOnce:
    """Says it is overloaded (retry after ``retry_after`` s) on its first call, then answers."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after
        self.calls = 0

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        self.calls += 1
        if self.calls == 1:
            raise ModelError("Overloaded", retryable=True, retry_after=self.retry_after)
        return assistant_message("answered")


async def test_a_driver_taking_over_a_run_with_a_scheduled_retry_starts_it(lane_stub) -> None:
    lane = new_lane_id("retry-takeover")
    probe = await started_probe(lane_stub, lane)
    model = BusyOnce(retry_after=1.0)
    first = asyncio.create_task(Driver(lane_stub, lane, lease_seconds=1).run("go", model))
    operation_id = await open_operation_id(lane_stub, lane)

    async def scheduled() -> bool:
        return (await snapshot(lane_stub, lane)).operation.HasField("retry")

    await until(scheduled, what="the scheduled retry")
    await crash(first)  # before StartRetry
    result = await Driver(lane_stub, lane, lease_seconds=5).recover(operation_id, model)
    assert result.status == COMPLETED
    assert model.calls == 2
    events = await probe.check()
    seen = kinds(events)
    assert seen.index("retry_scheduled") < seen.index("retry_start") < seen.index("retry_end")
    assert seen.count("retry_start") == 1
    final = await snapshot(lane_stub, lane)
    answers = [
        e.message.message.assistant.content[0].text.text
        for e in final.transcript
        if e.message.message.WhichOneof("message") == "assistant"
    ]
    assert answers == ["answered"]
