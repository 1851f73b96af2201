"""RPCs of run ownership and recovery: leases, takeover, safe replay, inspection."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase, command_rpc
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.commands import ownership
from lane.server.commands.operation_state import operation_state
from lane.server.domain.errors import FailedPrecondition


def _acquire_operation(request: pb.AcquireOperationRequest) -> None:
    v.require_ids(request, "operation_id", "driver_id")
    v.check_lease_seconds(request.lease_seconds)


def _renew_lease(request: pb.RenewLeaseRequest) -> None:
    v.require_ids(request, "operation_id")
    v.check_lease_seconds(request.lease_seconds)


class OwnershipRpcs(ServicerBase):
    """RPCs of run ownership and recovery: leases, takeover, safe replay, inspection."""

    AcquireOperation = command_rpc(ownership.acquire_operation, _acquire_operation)
    RenewLease = command_rpc(ownership.renew_lease, _renew_lease)
    ReleaseLease = command_rpc(ownership.release_lease, v.ids("operation_id"))
    ReplayToolCall = command_rpc(ownership.replay_tool_call, v.ids("operation_id", "tool_call_id"))

    @unary
    async def GetOperation(
        self, request: pb.GetOperationRequest, call: Call
    ) -> pb.GetOperationResponse:
        v.require_ids(request, "lane_id", "operation_id")
        operation = await self.store.open_operation(self.lane(request.lane_id))
        if operation is None or operation.operation_id != request.operation_id:
            # The same code as every command's OPERATION_NOT_OPEN: one code per reason.
            raise FailedPrecondition(
                "OPERATION_NOT_OPEN",
                f"operation {request.operation_id} is not open on lane {request.lane_id}",
                laneId=request.lane_id,
                operationId=request.operation_id,
            )
        return pb.GetOperationResponse(state=operation_state(operation))
