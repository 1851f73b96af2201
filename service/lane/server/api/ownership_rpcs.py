"""RPCs of run ownership and recovery: leases, takeover, safe replay, inspection."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.commands import ownership
from lane.server.commands.operation_state import operation_state
from lane.server.domain.errors import FailedPrecondition


class OwnershipRpcs(ServicerBase):
    """RPCs of run ownership and recovery: leases, takeover, safe replay, inspection."""

    @unary
    async def AcquireOperation(
        self, request: pb.AcquireOperationRequest, call: Call
    ) -> pb.AcquireOperationResponse:
        v.require_ids(request, "operation_id", "driver_id")
        v.check_lease_seconds(request.lease_seconds)
        return await self.command(call, request, ownership.acquire_operation)

    @unary
    async def RenewLease(self, request: pb.RenewLeaseRequest, call: Call) -> pb.RenewLeaseResponse:
        v.require_ids(request, "operation_id")
        v.check_lease_seconds(request.lease_seconds)
        return await self.command(call, request, ownership.renew_lease)

    @unary
    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, call: Call
    ) -> pb.ReleaseLeaseResponse:
        v.require_ids(request, "operation_id")
        return await self.command(call, request, ownership.release_lease)

    @unary
    async def ReplayToolCall(
        self, request: pb.ReplayToolCallRequest, call: Call
    ) -> pb.ReplayToolCallResponse:
        v.require_ids(request, "operation_id", "tool_call_id")
        return await self.command(call, request, ownership.replay_tool_call)

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
