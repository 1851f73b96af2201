"""Helpers for tests against the service: messages (from ``lane.client.testing``, which
benchmarks share), following the event log, fold == capture (``Probe``), error details."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import psycopg
from lane.client import testing
from lane.client.message_parts import PartJoiner
from lane.client.reducer import fold
from lane.client.testing import LaneScript, RunScript, new_lane_id, result, text, tool_call, user
from lane.v1 import events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub

__all__ = [
    "Probe",
    "Stub",
    "assistant",
    "error_info",
    "error_reason",
    "events_between",
    "hand_edit",
    "kinds",
    "leased_batch",
    "leased_run",
    "new_lane_id",
    "outcome",
    "presentation_check",
    "queue_next_run",
    "result",
    "text",
    "tool_call",
    "user",
]


def assistant(
    *blocks: messages_pb2.ContentBlock,
    stop: int = messages_pb2.STOP_REASON_TOOL_USE,
    usage: messages_pb2.Usage | None = None,
) -> messages_pb2.AssistantMessage:
    """A settled assistant message (``lane.client.testing.assistant``), its stop reason any
    int: the tests' tables send invalid ones too."""
    reason = messages_pb2.StopReason.ValueType(stop)
    return testing.assistant(*blocks, stop=reason, usage=usage)


async def events_between(
    stub: Stub, lane_id: str, after: int, until: int
) -> list[events_pb2.HarnessEvent]:
    """Every event with after < revision <= until, read through WatchLane(after_revision)."""
    found: list[events_pb2.HarnessEvent] = []
    if until <= after:
        return found
    call = stub.WatchLane(lane_service_pb2.WatchLaneRequest(lane_id=lane_id, after_revision=after))
    parts: PartJoiner[lane_service_pb2.WatchLaneResponse] = PartJoiner()
    try:
        async for received in call:
            response = parts.take(received)
            if response is None:
                continue  # a part of a group over one message
            kind = response.WhichOneof("item")
            assert kind in ("event_group", "heartbeat"), f"resume sent {kind}"
            if kind == "event_group":
                found.extend(response.event_group.events)
                if found[-1].revision >= until:
                    break
    finally:
        call.cancel()
    return found


def presentation_check(snapshot: snapshot_pb2.LaneSnapshot, active: Sequence[str]) -> None:
    """Each presentation-active call is in exactly one of running_tools or the transcript."""
    rows = [
        getattr(row, row.WhichOneof("state") or "running").tool_call_id
        for row in snapshot.operation.running_tools
    ]
    placed = [
        e.message.message.tool_result.tool_call_id
        for e in snapshot.transcript
        if e.WhichOneof("payload") == "message"
        and e.message.message.WhichOneof("message") == "tool_result"
    ]
    for call_id in active:
        assert (rows.count(call_id), placed.count(call_id)) in ((1, 0), (0, 1)), (
            f"{call_id}: {rows.count(call_id)} rows, {placed.count(call_id)} entries"
        )


class Probe:
    """Follows one lane: after every command, folding the new events into the previous capture
    must equal a fresh capture."""

    def __init__(self, stub: Stub, lane_id: str) -> None:
        self.stub = stub
        self.lane_id = lane_id
        self.snapshot = snapshot_pb2.LaneSnapshot()
        self.events: list[events_pb2.HarnessEvent] = []

    async def capture(self) -> snapshot_pb2.LaneSnapshot:
        """A fresh GetLaneSnapshot."""
        response = await self.stub.GetLaneSnapshot(
            lane_service_pb2.GetLaneSnapshotRequest(lane_id=self.lane_id)
        )
        snapshot: snapshot_pb2.LaneSnapshot = response.snapshot
        return snapshot

    async def start(self) -> snapshot_pb2.LaneSnapshot:
        """Take the first capture."""
        self.snapshot = await self.capture()
        return self.snapshot

    async def check(self, active: Sequence[str] = ()) -> list[events_pb2.HarnessEvent]:
        """Fold the events since the last check and compare with a fresh capture; return them."""
        fresh = await self.capture()
        new = await events_between(self.stub, self.lane_id, self.snapshot.revision, fresh.revision)
        assert [e.revision for e in new] == list(
            range(self.snapshot.revision + 1, fresh.revision + 1)
        ), "events missing or repeated"
        folded = fold(self.snapshot, new).snapshot
        assert folded == fresh, f"fold != capture at revision {fresh.revision}"
        presentation_check(fresh, active)
        self.snapshot = fresh
        self.events.extend(new)
        return new


def kinds(events: Sequence[events_pb2.HarnessEvent]) -> list[str]:
    """The event kinds, in order."""
    return [e.WhichOneof("kind") or "" for e in events]


def error_info(error: grpc.aio.AioRpcError) -> Any:
    """The google.rpc.ErrorInfo of a failed call."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)
    assert status is not None, f"{error.code()} without rich status: {error.details()}"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo in the status details")


def error_reason(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a failed call."""
    reason: str = error_info(error).reason
    return reason


async def outcome(call: Any) -> tuple[str, str, float | None]:
    """(code name, ErrorInfo reason, RetryInfo delay) a call ended with; ("OK", "", None) when
    it succeeded."""
    from lane.client.errors import lane_error

    try:
        await call
    except grpc.aio.AioRpcError as err:
        error = lane_error(err)
        return error.code.name, error.reason, error.retry_after
    return "OK", "", None


def queue_next_run(lane_id: str, request_id: str) -> lane_service_pb2.EnqueueMessageRequest:
    """An EnqueueMessage of a user message (its text: the request id) for the next run."""
    return lane_service_pb2.EnqueueMessageRequest(
        lane_id=lane_id,
        kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
        message=user(request_id),
        request_id=request_id,
    )


async def leased_run(stub: Any, probe: Probe, *calls: str, seconds: int = 30) -> RunScript:
    """A run on the probe's new lane, leased to driver-1, with one turn asking for ``calls``
    (tool ``t``, arguments ``{"c": <id>}``); the probe has followed it."""
    lane = await LaneScript.create(stub, probe.lane_id)
    snapshot = await probe.start()
    run = await lane.start_run("go", driver_id="driver-1", lease_seconds=seconds)
    # The lane's first fencing token (leases.granted: counted from its incarnation).
    assert run.lease_token == (int(snapshot.incarnation) << 32) + 1
    assert run.started.lease.driver_id == "driver-1"
    await run.turn("tools", tool_calls=[(c, "t", {"c": c}) for c in calls])
    await probe.check()
    return run


async def leased_batch(stub: Any, probe: Probe, *calls: str, seconds: int = 30) -> tuple[str, int]:
    """:func:`leased_run`'s (run id, lease token)."""
    run = await leased_run(stub, probe, *calls, seconds=seconds)
    return run.operation_id, run.lease_token


@contextlib.asynccontextmanager
async def hand_edit(store: Any) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection to the store's database that writes rows as an operator would, not as the
    service: every lane it touches gets a new version, so no process commands it from a stale
    in-memory copy."""
    async with await psycopg.AsyncConnection.connect(
        str(store.pool.conninfo), autocommit=True
    ) as conn:
        yield conn
