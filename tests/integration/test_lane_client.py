"""The typed client (``lane.client.LaneClient``) against the real service: its methods, the
lease tokens it keeps, the typed errors it raises, and its one retry policy."""

from __future__ import annotations

import json
import socket
import time

import grpc
import pytest
from lane.client import (
    LaneClient,
    LaneError,
    LaneNotFound,
    LeaseHeld,
    OperationCancelled,
    OperationNotOpen,
    RetryPolicy,
    StaleLease,
    TooLarge,
)
from lane.limits import MAX_PAYLOAD_BYTES
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.integration.lanes import assistant, new_lane_id, result, tool_call

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
async def client(lane_channel: grpc.aio.Channel) -> LaneClient:
    return LaneClient(channel=lane_channel)


async def test_a_leased_run_needs_no_token_from_the_caller(client: LaneClient) -> None:
    lane = new_lane_id("client")
    await client.create_lane(lane)
    started = await client.start_run(lane, "Read a.txt", driver_id="worker-1")
    run = started.operation_id
    assert client.lease_token(lane, run) == started.lease.token > 0
    turn = await client.start_turn(lane, run)
    await client.settle_assistant_message(
        lane, run, turn.turn_id, assistant(tool_call("c-1", "read", {"path": "a.txt"}))
    )
    await client.start_tool_call(lane, run, "c-1", json.dumps({"path": "a.txt"}))
    await client.update_tool_call(lane, run, "c-1", result("half"), checkpoint=True)
    staged = await client.stage_tool_outcome(
        lane, run, "c-1", pb.ExecutedOutcome(result=result("contents"))
    )
    assert staged.batch_complete
    error = snapshot_pb2.OperationError(code="stopped", message="the test stops here")
    await client.end_run(lane, run, snapshot_pb2.OPERATION_RESULT_STATUS_FAILED, error=error)
    assert client.lease_token(lane, run) is None  # the run ended: its token is dropped
    snapshot = await client.snapshot(lane)
    assert snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
    kinds = [entry.message.message.WhichOneof("message") for entry in snapshot.transcript]
    assert kinds == ["user", "assistant", "tool_result"]


async def test_a_released_and_taken_over_run_raises_the_typed_errors(
    client: LaneClient, lane_channel: grpc.aio.Channel
) -> None:
    lane = new_lane_id("takeover")
    other = LaneClient(channel=lane_channel)
    await client.create_lane(lane)
    run = (await client.start_run(lane, "go", driver_id="first")).operation_id
    with pytest.raises(LeaseHeld) as held:
        await other.acquire_operation(lane, run, driver_id="second")
    assert held.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert held.value.reason == "LEASE_HELD"
    await client.release_lease(lane, run)
    taken = await other.acquire_operation(lane, run, driver_id="second")
    assert other.lease_token(lane, run) == taken.lease.token
    with pytest.raises(StaleLease):  # the released lease's holder sends no token now
        await client.start_turn(lane, run)
    turn = await other.start_turn(lane, run)  # the new holder's token goes on by itself
    await other.settle_assistant_message(
        lane, run, turn.turn_id, assistant(tool_call("c-1", "read", {}))
    )
    await other.abort(lane, run)
    with pytest.raises(OperationCancelled):
        await other.start_tool_call(lane, run, "c-1", "{}")


async def test_refusals_are_typed(client: LaneClient) -> None:
    with pytest.raises(LaneNotFound) as missing:
        await client.snapshot(new_lane_id("nowhere"))
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    lane = new_lane_id("typed")
    await client.create_lane(lane)
    with pytest.raises(TooLarge) as large:
        await client.enqueue(lane, "x" * MAX_PAYLOAD_BYTES)
    assert large.value.reason == "PAYLOAD_TOO_LARGE"
    assert int(large.value.metadata["limit"]) == MAX_PAYLOAD_BYTES


async def test_operation_not_open_has_one_code_from_commands_and_get_operation(
    client: LaneClient, lane_stub: object
) -> None:
    lane = new_lane_id("not-open")
    await client.create_lane(lane)
    with pytest.raises(OperationNotOpen) as from_get:
        await client.get_operation(lane, "no-such-run")
    with pytest.raises(OperationNotOpen) as from_command:
        await client.start_turn(lane, "no-such-run")
    assert from_get.value.code == from_command.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_the_retry_policy_bounds_a_client_that_finds_no_service() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.1, timeout=0.6)
    # Without the first call's connection check, which fails at once (test_sdk_fail_fast.py).
    client = LaneClient(f"127.0.0.1:{port}", retry=policy, timeout=1.0, connect_timeout=None)
    async with client as unreachable:
        began = time.monotonic()
        with pytest.raises(LaneError) as refused:
            await unreachable.snapshot("any")
        waited = time.monotonic() - began
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert 0.6 <= waited < 5.0  # retried until the policy's timeout, then gave up
    assert refused.value.gave_up is not None and "(gave up after" in str(refused.value)


async def test_max_attempts_zero_raises_the_first_failure() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = RetryPolicy(max_attempts=0, timeout=30.0)
    client = LaneClient(f"127.0.0.1:{port}", retry=policy, timeout=5.0, connect_timeout=None)
    async with client as unreachable:
        began = time.monotonic()
        with pytest.raises(LaneError) as refused:
            await unreachable.snapshot("any")
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - began < 5.0  # not retried for the 30 s the timeout allows
