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
        v.check_lease(request.driver_id, request.lease_seconds)
        return await self.command(call, request, runs.start_run)

    @unary
    async def AbortOperation(
        self, request: pb.AbortOperationRequest, call: Call
    ) -> pb.AbortOperationResponse:
        v.require_ids(request, "operation_id")
        return await self.command(call, request, runs.abort_operation)

    @unary
    async def EndRun(self, request: pb.EndRunRequest, call: Call) -> pb.EndRunResponse:
        v.require_ids(request, "operation_id")
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
        return await self.command(call, request, runs.end_run)

    @unary
    async def StartTurn(self, request: pb.StartTurnRequest, call: Call) -> pb.StartTurnResponse:
        v.require_ids(request, "operation_id")
        v.require_id(request.turn_id, "turn_id", optional=True)
        return await self.command(call, request, runs.start_turn)

    @unary
    async def SettleAssistantMessage(
        self, request: pb.SettleAssistantMessageRequest, call: Call
    ) -> pb.SettleAssistantMessageResponse:
        v.require_ids(request, "operation_id", "turn_id")
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
        return await self.command(call, request, runs.settle_assistant_message)

    @unary
    async def RecordUsage(
        self, request: pb.RecordUsageRequest, call: Call
    ) -> pb.RecordUsageResponse:
        v.require(request.HasField("usage"), "MISSING_FIELD", "usage is required", "usage")
        v.require_id(request.entry_id, "entry_id", optional=True)
        return await self.command(call, request, runs.record_usage)
