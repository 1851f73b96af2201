"""Attach storms: many WatchLane streams opened at once, as clients reconnecting after a
restart do. Each is admitted or refused by the service with a documented reason and a retry
delay; none is reset by the transport."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from lane.v1 import lane_service_pb2 as pb

from lane.server.api import WatchSettings
from tests.integration.lanes import new_lane_id
from tests.integration.servers import extra_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: More than gRPC core's own queue of calls not yet taken up held before the service raised it
#: (1,000): streams past it were cancelled with no status of the service's.
STORM = 1_500
LIMIT = 1_000


async def test_a_storm_is_admitted_up_to_the_limit_and_the_rest_told_when_to_retry(
    session_database_url: str,
) -> None:
    # Reads one at a time: the snapshots of the storm queue behind each other.
    watch = WatchSettings(max_watchers_per_process=LIMIT, max_concurrent_reads=1)
    async with extra_server(session_database_url, watch=watch) as (_, stub):
        lanes = [new_lane_id("storm") for _ in range(10)]
        for lane_id in lanes:
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        outcomes: collections.Counter[str] = collections.Counter()
        delays: set[float] = set()
        calls = []

        async def attach(lane_id: str) -> None:
            call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id), timeout=120)
            try:
                first = await call.read()
            except grpc.aio.AioRpcError as error:
                status = rpc_status.from_call(error)
                info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
                for detail in status.details if status else ():
                    if not detail.Unpack(info):
                        detail.Unpack(retry)
                outcomes[f"{error.code().name} {info.reason or error.details()}"] += 1
                if retry.HasField("retry_delay"):
                    delays.add(retry.retry_delay.ToTimedelta().total_seconds())
                return
            assert isinstance(first, pb.WatchLaneResponse)
            outcomes[first.WhichOneof("item") or ""] += 1
            calls.append(call)

        try:
            await asyncio.gather(*(attach(lanes[i % len(lanes)]) for i in range(STORM)))
        finally:
            for call in calls:
                call.cancel()
        assert outcomes == {
            "snapshot": LIMIT,
            "RESOURCE_EXHAUSTED TOO_MANY_WATCHERS": STORM - LIMIT,
        }
        assert delays == {watch.full_retry_seconds}
