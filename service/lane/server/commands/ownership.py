"""Commands of run ownership and recovery: leases, takeover, safe replay. (The service's own
command ending the runs no driver holds is the store's ``reconcile_orphans``.)"""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import cancel_requested, command
from lane.server.commands.operation_state import lease_length, lease_of, operation_state
from lane.server.domain import leases, tools
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition


@command(pb.AcquireOperationResponse)
def acquire_operation(
    request: pb.AcquireOperationRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.AcquireOperationResponse]:
    """Lease the run to the driver, answering with the run as the driver takes it over (a
    takeover mid-batch places the batch's ready prefix)."""
    seconds = lease_length(request.lease_seconds)
    t = leases.acquire(state, request.operation_id, request.driver_id, seconds, now, new_id)
    answer = pb.AcquireOperationResponse(
        lease=lease_of(t.operation),
        state=operation_state(t.operation),
        revision=t.state.revision,
    )
    return t, answer


@command(pb.RenewLeaseResponse)
def renew_lease(
    request: pb.RenewLeaseRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.RenewLeaseResponse]:
    """Extend the caller's lease."""
    seconds = lease_length(request.lease_seconds)
    t = leases.renew(state, request.operation_id, request.lease_token, seconds, now)
    answer = pb.RenewLeaseResponse(
        lease=lease_of(t.operation), cancel_requested=cancel_requested(t.state)
    )
    return t, answer


@command(pb.ReleaseLeaseResponse)
def release_lease(
    request: pb.ReleaseLeaseRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.ReleaseLeaseResponse]:
    """Give the lease up; the run stays open."""
    t = leases.release(state, request.operation_id, request.lease_token, now)
    return t, pb.ReleaseLeaseResponse()


@command(pb.ReplayToolCallResponse)
def replay_tool_call(
    request: pb.ReplayToolCallRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.ReplayToolCallResponse]:
    """Run a SAFE call of a run taken over again (with the arguments of its intent)."""
    t = tools.replay_tool_call(
        state, request.operation_id, request.tool_call_id, request.lease_token, now
    )
    answer = pb.ReplayToolCallResponse(revision=t.state.revision, arguments_json=t.arguments_json)
    return t, answer
