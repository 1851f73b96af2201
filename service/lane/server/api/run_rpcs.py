"""RPCs of a run's life: start, abort, end, turns, assistant settlement, usage."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.commands import runs


class RunRpcs(ServicerBase):
    """RPCs of a run's life: start, abort, end, turns, assistant settlement, usage."""

    @unary
    async def StartRun(self, request: pb.StartRunRequest, call: Call) -> pb.StartRunResponse:
        v.check_message(request, "")
        v.require_id(request.operation_id, "operation_id", optional=True)
        for index, message in enumerate(request.prompt):
            v.require_kind(message, f"prompt[{index}]", "user", "custom")
        lease = v.requested_lease(request.driver_id, request.lease_seconds)
        lane, key = self.addressed(call, request)
        command = runs.StartRun(
            lane,
            key,
            operation_id=request.operation_id or None,
            prompt=request.prompt,
            settings=request.settings,
            lease=lease,
        )
        return (await runs.start_run(self.store, command)).to_proto()

    @unary
    async def AbortOperation(
        self, request: pb.AbortOperationRequest, call: Call
    ) -> pb.AbortOperationResponse:
        v.require_id(request.operation_id, "operation_id")
        lane, key = self.addressed(call, request)
        command = runs.AbortOperation(lane, key, operation_id=request.operation_id)
        return (await runs.abort_operation(self.store, command)).to_proto()

    @unary
    async def EndRun(self, request: pb.EndRunRequest, call: Call) -> pb.EndRunResponse:
        v.require_id(request.operation_id, "operation_id")
        v.check_message(request, "")
        failed = request.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
        v.require(
            request.status
            in (
                snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
                snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
                snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            ),
            "INVALID_STATUS",
            "status must be COMPLETED, FAILED or ABORTED",
            "status",
        )
        v.require(
            request.HasField("error") == failed,
            "INVALID_ERROR",
            "error is required with status FAILED and only then",
            "error",
        )
        if failed:
            v.require(
                bool(request.error.code), "MISSING_FIELD", "error.code is required", "error.code"
            )
        lane, key = self.addressed(call, request)
        command = runs.EndRun(
            lane,
            key,
            operation_id=request.operation_id,
            status=request.status,
            error=request.error if failed else None,
            lease_token=request.lease_token,
        )
        return (await runs.end_run(self.store, command)).to_proto()

    @unary
    async def StartTurn(self, request: pb.StartTurnRequest, call: Call) -> pb.StartTurnResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id", optional=True)
        lane, key = self.addressed(call, request)
        command = runs.StartTurn(
            lane,
            key,
            operation_id=request.operation_id,
            turn_id=request.turn_id or None,
            lease_token=request.lease_token,
        )
        return (await runs.start_turn(self.store, command)).to_proto()

    @unary
    async def SettleAssistantMessage(
        self, request: pb.SettleAssistantMessageRequest, call: Call
    ) -> pb.SettleAssistantMessageResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id")
        v.require(request.HasField("message"), "MISSING_FIELD", "message is required", "message")
        message = request.message
        v.require(
            message.stop_reason
            not in (messages_pb2.STOP_REASON_UNSPECIFIED, messages_pb2.STOP_REASON_PENDING),
            "INVALID_STOP_REASON",
            "a settled assistant message needs a final stop_reason (not PENDING)",
            "message.stop_reason",
        )
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        v.check_tool_calls(message, "message")
        lane, key = self.addressed(call, request)
        command = runs.SettleAssistantMessage(
            lane,
            key,
            operation_id=request.operation_id,
            turn_id=request.turn_id,
            message=message,
            lease_token=request.lease_token,
        )
        return (await runs.settle_assistant_message(self.store, command)).to_proto()

    @unary
    async def RecordUsage(
        self, request: pb.RecordUsageRequest, call: Call
    ) -> pb.RecordUsageResponse:
        v.require(request.HasField("usage"), "MISSING_FIELD", "usage is required", "usage")
        v.require_id(request.entry_id, "entry_id", optional=True)
        lane, key = self.addressed(call, request)
        command = runs.RecordUsage(
            lane,
            key,
            usage=request.usage,
            entry_id=request.entry_id or None,
            adjustment=request.adjustment,
        )
        return (await runs.record_usage(self.store, command)).to_proto()
