"""RPCs of run ownership and recovery: leases, takeover, safe replay, inspection."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb

from service.api import validation as v
from service.api.base import Context, ServicerBase, cancel_requested
from service.api.errors import unary
from service.api.operation_state import lease_of, operation_state
from service.domain import leases, tools
from service.domain.errors import NotFound
from service.domain.ids import new_id
from service.domain.state import LaneState
from service.domain.transition import Transition


class OwnershipRpcs(ServicerBase):
    """RPCs of run ownership and recovery: leases, takeover, safe replay, inspection."""

    @unary
    async def AcquireOperation(
        self, request: pb.AcquireOperationRequest, context: Context
    ) -> pb.AcquireOperationResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.driver_id, "driver_id")
        seconds = v.lease_seconds(request.lease_seconds)

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.AcquireOperationResponse]:
            t = leases.acquire(state, request.operation_id, request.driver_id, seconds, now, new_id)
            answer = pb.AcquireOperationResponse(revision=t.state.revision)
            operation = t.state.operation
            if operation is not None:  # None only when takeover placement ended the batch's run
                answer.state.CopyFrom(operation_state(operation))
                answer.lease.CopyFrom(answer.state.lease)
            return t, answer

        return await self.command("AcquireOperation", request, decide, pb.AcquireOperationResponse)

    @unary
    async def RenewLease(
        self, request: pb.RenewLeaseRequest, context: Context
    ) -> pb.RenewLeaseResponse:
        v.require_id(request.operation_id, "operation_id")
        seconds = v.lease_seconds(request.lease_seconds)

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.RenewLeaseResponse]:
            t = leases.renew(state, request.operation_id, request.lease_token, seconds, now)
            assert t.state.operation is not None
            return t, pb.RenewLeaseResponse(
                lease=lease_of(t.state.operation), cancel_requested=cancel_requested(t.state)
            )

        return await self.command("RenewLease", request, decide, pb.RenewLeaseResponse)

    @unary
    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: Context
    ) -> pb.ReleaseLeaseResponse:
        v.require_id(request.operation_id, "operation_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ReleaseLeaseResponse]:
            return leases.release(state, request.operation_id, request.lease_token, now), (
                pb.ReleaseLeaseResponse()
            )

        return await self.command("ReleaseLease", request, decide, pb.ReleaseLeaseResponse)

    @unary
    async def ReplayToolCall(
        self, request: pb.ReplayToolCallRequest, context: Context
    ) -> pb.ReplayToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ReplayToolCallResponse]:
            t = tools.replay_tool_call(
                state, request.operation_id, request.tool_call_id, request.lease_token, now
            )
            return t, pb.ReplayToolCallResponse(
                revision=t.state.revision, arguments_json=t.events[0].tool_start.arguments_json
            )

        return await self.command("ReplayToolCall", request, decide, pb.ReplayToolCallResponse)

    @unary
    async def GetOperation(
        self, request: pb.GetOperationRequest, context: Context
    ) -> pb.GetOperationResponse:
        v.require_id(request.lane_id, "lane_id")
        v.require_id(request.operation_id, "operation_id")
        operation = await self.store.open_operation(self.lane(request.lane_id))
        if operation is None or operation.operation_id != request.operation_id:
            raise NotFound(
                "OPERATION_NOT_OPEN",
                f"operation {request.operation_id} is not open on lane {request.lane_id}",
                laneId=request.lane_id,
                operationId=request.operation_id,
            )
        return pb.GetOperationResponse(state=operation_state(operation))
