"""Commands of run ownership and recovery: leases, takeover, safe replay. (The service's own
command ending the runs no driver holds is the store's ``reconcile_orphans``.)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import Command, Result, cancel_requested, run
from lane.server.commands.operation_state import lease_of, operation_state
from lane.server.domain import leases, tools
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store


@dataclass(frozen=True)
class AcquireOperation(Command):
    operation_id: str
    driver_id: str
    lease_seconds: int


@dataclass(frozen=True)
class OperationAcquired(Result[pb.AcquireOperationResponse]):
    response = pb.AcquireOperationResponse
    lease: pb.Lease | None
    #: The run as the new driver takes it over.
    state: pb.OperationState
    revision: int


async def acquire_operation(store: Store, command: AcquireOperation) -> OperationAcquired:
    """Lease the run to the driver (a takeover mid-batch places the batch's ready prefix)."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, OperationAcquired]:
        t = leases.acquire(
            state, command.operation_id, command.driver_id, command.lease_seconds, now, new_id
        )
        acquired = OperationAcquired(
            lease=lease_of(t.operation),
            state=operation_state(t.operation),
            revision=t.state.revision,
        )
        return t, acquired

    return await run(store, command.lane, command.request, step, OperationAcquired)


@dataclass(frozen=True)
class RenewLease(Command):
    operation_id: str
    lease_token: int
    lease_seconds: int


@dataclass(frozen=True)
class LeaseRenewed(Result[pb.RenewLeaseResponse]):
    response = pb.RenewLeaseResponse
    lease: pb.Lease | None
    cancel_requested: bool


async def renew_lease(store: Store, command: RenewLease) -> LeaseRenewed:
    """Extend the caller's lease."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, LeaseRenewed]:
        t = leases.renew(
            state, command.operation_id, command.lease_token, command.lease_seconds, now
        )
        renewed = LeaseRenewed(
            lease=lease_of(t.operation), cancel_requested=cancel_requested(t.state)
        )
        return t, renewed

    return await run(store, command.lane, command.request, step, LeaseRenewed)


@dataclass(frozen=True)
class ReleaseLease(Command):
    operation_id: str
    lease_token: int


@dataclass(frozen=True)
class LeaseReleased(Result[pb.ReleaseLeaseResponse]):
    response = pb.ReleaseLeaseResponse


async def release_lease(store: Store, command: ReleaseLease) -> LeaseReleased:
    """Give the lease up; the run stays open."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, LeaseReleased]:
        t = leases.release(state, command.operation_id, command.lease_token, now)
        return t, LeaseReleased()

    return await run(store, command.lane, command.request, step, LeaseReleased)


@dataclass(frozen=True)
class ReplayToolCall(Command):
    operation_id: str
    tool_call_id: str
    lease_token: int


@dataclass(frozen=True)
class ToolCallReplayed(Result[pb.ReplayToolCallResponse]):
    response = pb.ReplayToolCallResponse
    revision: int
    #: The arguments the call runs again with (those of its intent).
    arguments_json: str


async def replay_tool_call(store: Store, command: ReplayToolCall) -> ToolCallReplayed:
    """Run a SAFE call of a run taken over again."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, ToolCallReplayed]:
        t = tools.replay_tool_call(
            state, command.operation_id, command.tool_call_id, command.lease_token, now
        )
        return t, ToolCallReplayed(revision=t.state.revision, arguments_json=t.arguments_json)

    return await run(store, command.lane, command.request, step, ToolCallReplayed)
