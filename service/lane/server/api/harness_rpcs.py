"""RPCs of the rest of the harness: streaming responses, retries, deferred runs, compaction,
navigation, faults, handler errors and session metadata."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.commands import harness

Status = snapshot_pb2.OperationResultStatus
MAX_RETRY_DELAY_MS = 24 * 3600 * 1000


class HarnessRpcs(ServicerBase):
    """RPCs of the rest of the harness."""

    @unary
    async def AppendAssistantStream(
        self, request: pb.AppendAssistantStreamRequest, call: Call
    ) -> pb.AppendAssistantStreamResponse:
        v.require_ids(request, "operation_id", "turn_id")
        v.require(bool(request.partials), "MISSING_FIELD", "partials is required", "partials")
        for index, partial in enumerate(request.partials):
            v.require(
                partial.message.stop_reason == messages_pb2.STOP_REASON_PENDING,
                "INVALID_STOP_REASON",
                f"partials[{index}] is a streaming partial: its stop_reason must be PENDING",
                f"partials[{index}].message.stop_reason",
            )
        # A streaming tool call's arguments may be cut mid-way: not JSON yet.
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        return await self.command(call, request, harness.append_assistant_stream)

    @unary
    async def ScheduleRetry(
        self, request: pb.ScheduleRetryRequest, call: Call
    ) -> pb.ScheduleRetryResponse:
        v.require_ids(request, "operation_id", "turn_id")
        v.require(
            request.max_attempts >= 2,
            "INVALID_MAX_ATTEMPTS",
            "max_attempts must be at least 2 for a retry",
            "max_attempts",
        )
        v.require(
            0 <= request.delay_ms <= MAX_RETRY_DELAY_MS,
            "INVALID_DELAY",
            f"delay_ms must be between 0 and {MAX_RETRY_DELAY_MS}",
            "delay_ms",
        )
        failed = request.failed_message if request.HasField("failed_message") else None
        if failed is not None:
            v.require(
                failed.stop_reason == messages_pb2.STOP_REASON_ERROR,
                "INVALID_STOP_REASON",
                "a failed response has stop_reason ERROR",
                "failed_message.stop_reason",
            )
            v.check_tool_calls(failed, "failed_message")
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        return await self.command(call, request, harness.schedule_retry)

    @unary
    async def StartRetry(self, request: pb.StartRetryRequest, call: Call) -> pb.StartRetryResponse:
        v.require_ids(request, "operation_id", "turn_id")
        return await self.command(call, request, harness.start_retry)

    @unary
    async def SuspendRun(self, request: pb.SuspendRunRequest, call: Call) -> pb.SuspendRunResponse:
        v.require_ids(request, "operation_id", "turn_id")
        v.require(
            request.HasField("deferred") and bool(request.deferred.handle_json),
            "MISSING_FIELD",
            "deferred.handle_json is required",
            "deferred.handle_json",
        )
        v.check_message(request, "")
        v.parse_json(request.deferred.handle_json, "deferred.handle_json")
        if request.deferred.poll_json:
            v.parse_json(request.deferred.poll_json, "deferred.poll_json")
        return await self.command(call, request, harness.suspend_run)

    @unary
    async def ResumeRun(self, request: pb.ResumeRunRequest, call: Call) -> pb.ResumeRunResponse:
        v.require_ids(request, "operation_id")
        return await self.command(call, request, harness.resume_run)

    @unary
    async def StartCompaction(
        self, request: pb.StartCompactionRequest, call: Call
    ) -> pb.StartCompactionResponse:
        v.check_message(request, "")
        v.require_id(request.operation_id, "operation_id", optional=True)
        v.check_lease(request.driver_id, request.lease_seconds)
        return await self.command(call, request, harness.start_compaction)

    @unary
    async def EndCompaction(
        self, request: pb.EndCompactionRequest, call: Call
    ) -> pb.EndCompactionResponse:
        v.require_ids(request, "operation_id")
        v.check_message(request, "")
        status = request.status
        v.require(
            status
            in (
                Status.OPERATION_RESULT_STATUS_COMPLETED,
                Status.OPERATION_RESULT_STATUS_DECLINED,
                Status.OPERATION_RESULT_STATUS_ABORTED,
                Status.OPERATION_RESULT_STATUS_FAILED,
            ),
            "INVALID_STATUS",
            "status must be COMPLETED, DECLINED, ABORTED or FAILED",
            "status",
        )
        completed = status == Status.OPERATION_RESULT_STATUS_COMPLETED
        failed = status == Status.OPERATION_RESULT_STATUS_FAILED
        v.require(
            request.HasField("entry") == completed,
            "INVALID_ENTRY",
            "entry is required with status COMPLETED and only then",
            "entry",
        )
        v.require(
            request.HasField("error") == failed,
            "INVALID_ERROR",
            "error is required with status FAILED and only then",
            "error",
        )
        if completed:
            v.check_compaction(request.entry, "entry")
        return await self.command(call, request, harness.end_compaction)

    @unary
    async def CompactRun(self, request: pb.CompactRunRequest, call: Call) -> pb.CompactRunResponse:
        v.require_ids(request, "operation_id")
        v.require(request.HasField("entry"), "MISSING_FIELD", "entry is required", "entry")
        v.check_message(request, "")
        v.check_compaction(request.entry, "entry")
        return await self.command(call, request, harness.compact_run)

    @unary
    async def NavigateLane(
        self, request: pb.NavigateLaneRequest, call: Call
    ) -> pb.NavigateLaneResponse:
        v.require_ids(request, "lane_id", "target_entry_id")
        v.check_message(request, "")
        return await self.command(call, request, harness.navigate_lane)

    @unary
    async def ReportFault(
        self, request: pb.ReportFaultRequest, call: Call
    ) -> pb.ReportFaultResponse:
        v.require(bool(request.code), "MISSING_FIELD", "code is required", "code")
        return await self.command(call, request, harness.report_fault)

    @unary
    async def ReportHandlerError(
        self, request: pb.ReportHandlerErrorRequest, call: Call
    ) -> pb.ReportHandlerErrorResponse:
        v.require(bool(request.error), "MISSING_FIELD", "error is required", "error")
        return await self.command(call, request, harness.report_handler_error)

    @unary
    async def SetLaneValue(
        self, request: pb.SetLaneValueRequest, call: Call
    ) -> pb.SetLaneValueResponse:
        which = request.WhichOneof("value")
        v.require(which is not None, "MISSING_FIELD", "a value is required", "value")
        if which == "entry_label":
            v.require_id(request.entry_label.target_id, "entry_label.target_id")
        return await self.command(call, request, harness.set_lane_value)
