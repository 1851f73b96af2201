"""The driver and the service over time: the lease is renewed while a tool outlives it, and a
run rides out a service restart (commands retried with their request ids, the lane's watch
resumed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from lane.client.commands import call
from lane.client.connect import open_channel
from lane.client.driver import Driver
from lane.client.errors import LaneError
from lane.client.model import ScriptedModel
from lane.client.tools import ToolContext, ToolResultLike
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, snapshot_pb2

from lane.server.app.server import start_server
from tests.driver.support import (
    open_operation_id,
    operation_state,
    rows,
    snapshot,
    step,
    text_of,
    tool,
    tool_results,
    until,
)
from tests.integration.lanes import new_lane_id

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED


def naps(seconds: float, started: asyncio.Event | None = None) -> Any:
    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        if started is not None:
            started.set()
        await asyncio.sleep(seconds)
        return f"napped {seconds}s"

    return run


async def test_lease_renewal_keeps_a_tool_alive_past_the_initial_lease(lane_stub) -> None:
    lane = new_lane_id("lease-renew")
    model = ScriptedModel([step("nap", ("nap", {})), step("done")])
    driver = Driver(lane_stub, lane, [tool("nap", naps(3.0))], lease_seconds=1)
    began = time.monotonic()
    running = asyncio.create_task(driver.run("go", model))
    operation_id = await open_operation_id(lane_stub, lane)
    first = await operation_state(lane_stub, lane, operation_id)

    async def napping() -> bool:
        return rows(await snapshot(lane_stub, lane)) == {"call_1_1": "running"}

    await until(napping, what="the nap to start")
    await asyncio.sleep(2.0)  # twice the lease: only renewals keep it
    with pytest.raises(LaneError) as refused:
        await call(
            lane_stub.AcquireOperation,
            pb.AcquireOperationRequest(
                lane_id=lane, operation_id=operation_id, driver_id="intruder"
            ),
        )
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.reason == "LEASE_HELD"
    later = await operation_state(lane_stub, lane, operation_id)
    assert later.lease.token == first.lease.token
    assert later.lease.expire_time.ToDatetime() > first.lease.expire_time.ToDatetime()
    result = await running
    assert result.status == COMPLETED
    assert time.monotonic() - began > 3.0
    (placed,) = tool_results(await snapshot(lane_stub, lane))
    assert text_of(placed) == "napped 3.0s"


async def test_a_run_rides_out_a_service_restart(fresh_database_url: str) -> None:
    server = await start_server(fresh_database_url, listen="127.0.0.1:0")
    port = server.port
    lane = new_lane_id("restart")
    napping = asyncio.Event()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            model = ScriptedModel([step("nap", ("nap", {})), step("done")])
            driver = Driver(stub, lane, [tool("nap", naps(2.0, napping))], lease_seconds=10)
            running = asyncio.create_task(driver.run("go", model))
            await asyncio.wait_for(napping.wait(), 10)
            await server.stop(grace=0.2)
            await asyncio.sleep(2.5)  # the nap ends while the service is down
            server = await start_server(fresh_database_url, listen=f"127.0.0.1:{port}")
            result = await asyncio.wait_for(running, 30)
            assert result.status == COMPLETED
            snap = await snapshot(stub, lane)
            assert [text_of(r) for r in tool_results(snap)] == ["napped 2.0s"]
            assert snap.last_result.status == COMPLETED
    finally:
        await server.stop(grace=0.2)
