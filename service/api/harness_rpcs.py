"""RPCs of the rest of the harness: streaming responses, retries, deferred runs, compaction,
navigation, faults, handler errors and session metadata."""

from __future__ import annotations

from datetime import datetime, timedelta

from lane.v1 import events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from service.api import validation as v
from service.api.base import Context, ServicerBase, cancel_requested
from service.api.errors import unary
from service.api.operation_state import copy_lease
from service.domain import assistant, compaction, lane_values, navigation
from service.domain.errors import NotFound
from service.domain.ids import new_id
from service.domain.state import LaneState
from service.domain.transition import Transition

Status = snapshot_pb2.OperationResultStatus
MAX_RETRY_DELAY_MS = 24 * 3600 * 1000


class HarnessRpcs(ServicerBase):
    """RPCs of the rest of the harness."""

    @unary
    async def AppendAssistantStream(
        self, request: pb.AppendAssistantStreamRequest, context: Context
    ) -> pb.AppendAssistantStreamResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id")
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

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.AppendAssistantStreamResponse]:
            t = assistant.append_stream(
                state,
                request.operation_id,
                request.turn_id,
                request.partials,
                now,
                request.lease_token,
            )
            return t, pb.AppendAssistantStreamResponse(
                revision=t.state.revision, cancel_requested=cancel_requested(t.state)
            )

        return await self.command(
            "AppendAssistantStream", request, decide, pb.AppendAssistantStreamResponse
        )

    @unary
    async def ScheduleRetry(
        self, request: pb.ScheduleRetryRequest, context: Context
    ) -> pb.ScheduleRetryResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id")
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

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ScheduleRetryResponse]:
            t = assistant.schedule_retry(
                state,
                request.operation_id,
                request.turn_id,
                failed,
                request.max_attempts,
                timedelta(milliseconds=request.delay_ms),
                request.error_message,
                now,
                new_id,
                request.lease_token,
            )
            operation = t.state.operation
            assert operation is not None and operation.retry is not None
            return t, pb.ScheduleRetryResponse(
                revision=t.state.revision,
                attempt=operation.retry.attempt,
                next_attempt_time=operation.retry.next_attempt_time,
            )

        return await self.command("ScheduleRetry", request, decide, pb.ScheduleRetryResponse)

    @unary
    async def StartRetry(
        self, request: pb.StartRetryRequest, context: Context
    ) -> pb.StartRetryResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartRetryResponse]:
            t = assistant.start_retry(
                state, request.operation_id, request.turn_id, now, request.lease_token
            )
            assert t.state.operation is not None
            return t, pb.StartRetryResponse(
                revision=t.state.revision, attempt=t.state.operation.attempt
            )

        return await self.command("StartRetry", request, decide, pb.StartRetryResponse)

    @unary
    async def SuspendRun(
        self, request: pb.SuspendRunRequest, context: Context
    ) -> pb.SuspendRunResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id")
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

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.SuspendRunResponse]:
            t = assistant.suspend_run(
                state,
                request.operation_id,
                request.turn_id,
                request.deferred,
                now,
                request.lease_token,
            )
            return t, pb.SuspendRunResponse(revision=t.state.revision)

        return await self.command("SuspendRun", request, decide, pb.SuspendRunResponse)

    @unary
    async def ResumeRun(
        self, request: pb.ResumeRunRequest, context: Context
    ) -> pb.ResumeRunResponse:
        v.require_id(request.operation_id, "operation_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ResumeRunResponse]:
            t = assistant.resume_run(state, request.operation_id, now, request.lease_token)
            return t, pb.ResumeRunResponse(revision=t.state.revision)

        return await self.command("ResumeRun", request, decide, pb.ResumeRunResponse)

    @unary
    async def StartCompaction(
        self, request: pb.StartCompactionRequest, context: Context
    ) -> pb.StartCompactionResponse:
        v.check_message(request, "")
        v.require_id(request.operation_id, "operation_id", optional=True)
        lease = v.requested_lease(request.driver_id, request.lease_seconds)
        operation_id = request.operation_id or new_id()
        reason = request.reason or events_pb2.COMPACTION_REASON_MANUAL

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.StartCompactionResponse]:
            t = compaction.start_compaction(state, operation_id, reason, now, lease)
            answer = pb.StartCompactionResponse(
                operation_id=operation_id, revision=t.state.revision
            )
            copy_lease(t.state, answer.lease)
            return t, answer

        return await self.command("StartCompaction", request, decide, pb.StartCompactionResponse)

    @unary
    async def EndCompaction(
        self, request: pb.EndCompactionRequest, context: Context
    ) -> pb.EndCompactionResponse:
        v.require_id(request.operation_id, "operation_id")
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
        entry = request.entry if completed else None
        error = request.error if failed else None

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.EndCompactionResponse]:
            t = compaction.end_compaction(
                state,
                request.operation_id,
                status,
                entry,
                error,
                now,
                new_id,
                request.lease_token,
            )
            assert t.state.last_result is not None
            return t, pb.EndCompactionResponse(
                result=t.state.last_result, revision=t.state.revision
            )

        return await self.command("EndCompaction", request, decide, pb.EndCompactionResponse)

    @unary
    async def CompactRun(
        self, request: pb.CompactRunRequest, context: Context
    ) -> pb.CompactRunResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require(request.HasField("entry"), "MISSING_FIELD", "entry is required", "entry")
        v.check_message(request, "")
        v.check_compaction(request.entry, "entry")
        reason = request.reason or events_pb2.COMPACTION_REASON_THRESHOLD

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.CompactRunResponse]:
            t = compaction.compact_run(
                state,
                request.operation_id,
                request.entry,
                reason,
                now,
                new_id,
                request.lease_token,
            )
            return t, pb.CompactRunResponse(entry_id=t.state.tip_id, revision=t.state.revision)

        return await self.command("CompactRun", request, decide, pb.CompactRunResponse)

    @unary
    async def NavigateLane(
        self, request: pb.NavigateLaneRequest, context: Context
    ) -> pb.NavigateLaneResponse:
        v.require_id(request.lane_id, "lane_id")
        v.require_id(request.target_entry_id, "target_entry_id")
        v.check_message(request, "")
        # Entries are immutable and never deleted: a check before the command is enough.
        if not await self.store.entry_exists(self.lane(request.lane_id), request.target_entry_id):
            raise NotFound(
                "ENTRY_NOT_FOUND",
                f"lane {request.lane_id} has no entry {request.target_entry_id}",
                laneId=request.lane_id,
                entryId=request.target_entry_id,
            )
        summary = request.summary if request.HasField("summary") else None
        operation_id = new_id()

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.NavigateLaneResponse]:
            t = navigation.navigate(
                state, operation_id, request.target_entry_id, summary, now, new_id
            )
            assert t.state.last_result is not None
            return t, pb.NavigateLaneResponse(
                operation_id=operation_id, result=t.state.last_result, revision=t.state.revision
            )

        return await self.command("NavigateLane", request, decide, pb.NavigateLaneResponse)

    @unary
    async def ReportFault(
        self, request: pb.ReportFaultRequest, context: Context
    ) -> pb.ReportFaultResponse:
        v.require(bool(request.code), "MISSING_FIELD", "code is required", "code")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ReportFaultResponse]:
            t = lane_values.report_fault(state, request.code, request.message, now)
            return t, pb.ReportFaultResponse(revision=t.state.revision)

        return await self.command("ReportFault", request, decide, pb.ReportFaultResponse)

    @unary
    async def ReportHandlerError(
        self, request: pb.ReportHandlerErrorRequest, context: Context
    ) -> pb.ReportHandlerErrorResponse:
        v.require(bool(request.error), "MISSING_FIELD", "error is required", "error")
        event = events_pb2.HandlerErrorEvent(error=request.error)
        if request.HasField("stack"):
            event.stack = request.stack
        source = request.WhichOneof("source")
        if source == "hook":
            event.hook = request.hook
        elif source == "event":
            event.event = request.event

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.ReportHandlerErrorResponse]:
            t = lane_values.report_handler_error(state, event, now)
            return t, pb.ReportHandlerErrorResponse(revision=t.state.revision)

        return await self.command(
            "ReportHandlerError", request, decide, pb.ReportHandlerErrorResponse
        )

    @unary
    async def SetLaneValue(
        self, request: pb.SetLaneValueRequest, context: Context
    ) -> pb.SetLaneValueResponse:
        which = request.WhichOneof("value")
        v.require(which is not None, "MISSING_FIELD", "a value is required", "value")
        value = events_pb2.ValueUpdateEvent()
        if which == "session_name":
            value.session_name.CopyFrom(request.session_name)
        else:
            v.require_id(request.entry_label.target_id, "entry_label.target_id")
            value.entry_label.CopyFrom(request.entry_label)

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.SetLaneValueResponse]:
            t = lane_values.set_value(state, value, now)
            return t, pb.SetLaneValueResponse(revision=t.state.revision)

        return await self.command("SetLaneValue", request, decide, pb.SetLaneValueResponse)
