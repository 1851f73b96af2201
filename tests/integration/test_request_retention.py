"""Stored answers are pruned after ``LANE_REQUEST_RETENTION_SECONDS``, never while the operation
they belong to is open (service/lane/server/store/retention.py), and a retry of a pruned request id
is a new request. Ages are made by backdating rows directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.app.maintenance import retention_pass
from lane.server.app.server import RunningServer
from lane.server.store.retention import prune_answers
from tests.integration.lanes import new_lane_id, user
from tests.integration.servers import extra_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)
DAY = timedelta(days=1)


@pytest_asyncio.fixture(loop_scope="session")
async def service(fresh_database_url: str) -> AsyncIterator[tuple[RunningServer, Stub]]:
    async with extra_server(fresh_database_url) as (running, stub):
        yield running, stub


@pytest_asyncio.fixture(loop_scope="session")
async def sql(fresh_database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(fresh_database_url, autocommit=True) as conn:
        yield conn


async def _lane(stub: Stub) -> str:
    lane_id = new_lane_id("kept")
    configuration = snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="p", model_id="m")
    )
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id, configuration=configuration))
    return lane_id


def _enqueue(lane_id: str, request_id: str) -> pb.EnqueueMessageRequest:
    return pb.EnqueueMessageRequest(
        lane_id=lane_id,
        kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
        message=user(f"message of {request_id}"),
        request_id=request_id,
    )


async def _age(sql: psycopg.AsyncConnection[Any], request_id: str, age: timedelta) -> None:
    cur = await sql.execute(
        "UPDATE requests SET created_time = now() - %s WHERE request_id = %s", (age, request_id)
    )
    assert cur.rowcount == 1


async def _stored(sql: psycopg.AsyncConnection[Any]) -> set[str]:
    cur = await sql.execute("SELECT request_id FROM requests")
    return {row[0] for row in await cur.fetchall()}


async def test_old_answers_are_pruned_unless_their_operation_is_open(
    service: tuple[RunningServer, Stub], sql: psycopg.AsyncConnection[Any]
) -> None:
    running, stub = service
    idle, busy = await _lane(stub), await _lane(stub)

    # A lane with no open operation: an old answer and a recent one.
    first = await stub.EnqueueMessage(_enqueue(idle, "idle-old"))
    recent = await stub.EnqueueMessage(_enqueue(idle, "idle-recent"))
    await _age(sql, "idle-old", 2 * DAY)

    # A lane whose run has been open for two days: the answer that opened it (created by the
    # database's clock a moment before the service's clock stamped the run's start) and one of
    # a command during it are kept; one from before the run is not.
    await stub.EnqueueMessage(_enqueue(busy, "busy-before"))
    run = await stub.StartRun(
        pb.StartRunRequest(lane_id=busy, prompt=[user("go")], request_id="busy-start")
    )
    await stub.EnqueueMessage(_enqueue(busy, "busy-during"))
    await sql.execute(
        "UPDATE operations SET started_time = now() - %s WHERE operation_id = %s",
        (2 * DAY - timedelta(seconds=1), run.operation_id),
    )
    await _age(sql, "busy-before", 3 * DAY)
    await _age(sql, "busy-start", 2 * DAY)
    await _age(sql, "busy-during", DAY + timedelta(hours=1))

    deleted = await prune_answers(running.store.pool, DAY, batch=1)

    assert deleted == 2
    assert await _stored(sql) == {"idle-recent", "busy-start", "busy-during"}

    # A retry within the retention returns the first answer; one after it is a new request.
    assert await stub.EnqueueMessage(_enqueue(idle, "idle-recent")) == recent
    again = await stub.EnqueueMessage(_enqueue(idle, "idle-old"))
    assert again.entry_id != first.entry_id
    assert again.revision > recent.revision
    # The retried run start is still answered from its stored answer.
    assert (
        await stub.StartRun(
            pb.StartRunRequest(lane_id=busy, prompt=[user("go")], request_id="busy-start")
        )
        == run
    )


async def test_answers_of_an_ended_operation_are_pruned_with_the_rest(
    service: tuple[RunningServer, Stub], sql: psycopg.AsyncConnection[Any]
) -> None:
    running, stub = service
    lane_id = await _lane(stub)
    run = await stub.StartRun(
        pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")], request_id="ended-start")
    )
    await stub.AbortOperation(
        pb.AbortOperationRequest(
            lane_id=lane_id, operation_id=run.operation_id, request_id="ended-abort"
        )
    )
    await stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane_id,
            operation_id=run.operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            request_id="ended-end",
        )
    )
    await sql.execute(
        "UPDATE operations SET started_time = now() - %s WHERE operation_id = %s",
        (2 * DAY, run.operation_id),
    )
    for request_id in ("ended-start", "ended-abort", "ended-end"):
        await _age(sql, request_id, 2 * DAY)

    await retention_pass(running.store, DAY)  # what the maintenance loop runs

    assert not {"ended-start", "ended-abort", "ended-end"} & await _stored(sql)
