"""RPCs of a run's life: start, abort, end, turns, assistant settlement, usage."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from service.api import validation as v
from service.api.base import Context, ServicerBase, cancel_requested
from service.api.errors import unary
from service.api.operation_state import copy_lease
from service.domain import runs
from service.domain.ids import new_id
from service.domain.state import LaneState
from service.domain.transition import Transition


class RunRpcs(ServicerBase):
    """RPCs of a run's life: start, abort, end, turns, assistant settlement, usage."""

    @unary
    async def StartRun(self, request: pb.StartRunRequest, context: Context) -> pb.StartRunResponse:
        v.check_message(request, "")
        v.require_id(request.operation_id, "operation_id", optional=True)
        for index, message in enumerate(request.prompt):
            v.require_kind(message, f"prompt[{index}]", "user", "custom")
        operation_id = request.operation_id or new_id()
        lease = v.requested_lease(request.driver_id, request.lease_seconds)

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartRunResponse]:
            t = runs.start_run(
                state, operation_id, request.prompt, request.settings, now, new_id, lease
            )
            answer = pb.StartRunResponse(operation_id=operation_id, revision=t.state.revision)
            copy_lease(t.state, answer.lease)
            return t, answer

        return await self.command("StartRun", request, decide, pb.StartRunResponse)

    @unary
    async def AbortOperation(
        self, request: pb.AbortOperationRequest, context: Context
    ) -> pb.AbortOperationResponse:
        v.require_id(request.operation_id, "operation_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.AbortOperationResponse]:
            t = runs.abort_operation(state, request.operation_id, now)
            return t, pb.AbortOperationResponse(
                revision=t.state.revision, newly_requested=bool(t.events)
            )

        return await self.command("AbortOperation", request, decide, pb.AbortOperationResponse)

    @unary
    async def EndRun(self, request: pb.EndRunRequest, context: Context) -> pb.EndRunResponse:
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
        error = request.error if failed else None

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.EndRunResponse]:
            t = runs.end_run(
                state,
                request.operation_id,
                request.status,
                error,
                now,
                new_id,
                lease_token=request.lease_token,
            )
            assert t.state.last_result is not None
            return t, pb.EndRunResponse(result=t.state.last_result, revision=t.state.revision)

        return await self.command("EndRun", request, decide, pb.EndRunResponse)

    # -- turns ---------------------------------------------------------------------------------

    @unary
    async def StartTurn(
        self, request: pb.StartTurnRequest, context: Context
    ) -> pb.StartTurnResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id", optional=True)
        turn_id = request.turn_id or new_id()

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartTurnResponse]:
            t = runs.start_turn(state, request.operation_id, turn_id, now, request.lease_token)
            return t, pb.StartTurnResponse(turn_id=turn_id, revision=t.state.revision)

        return await self.command("StartTurn", request, decide, pb.StartTurnResponse)

    @unary
    async def SettleAssistantMessage(
        self, request: pb.SettleAssistantMessageRequest, context: Context
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

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.SettleAssistantMessageResponse]:
            t = runs.settle_assistant(
                state,
                request.operation_id,
                request.turn_id,
                message,
                now,
                new_id,
                request.lease_token,
            )
            operation = t.state.operation
            batch = operation.batch if operation else None
            return t, pb.SettleAssistantMessageResponse(
                entry_id=t.state.tip_id,
                revision=t.state.revision,
                tool_calls=[
                    pb.PlannedToolCall(
                        tool_call_id=c.tool_call_id,
                        tool_name=c.tool_name,
                        source_index=c.source_index,
                        result_entry_id=c.result_entry_id,
                    )
                    for c in (batch.calls if batch else ())
                ],
                cancel_requested=cancel_requested(t.state),
            )

        return await self.command(
            "SettleAssistantMessage", request, decide, pb.SettleAssistantMessageResponse
        )

    @unary
    async def RecordUsage(
        self, request: pb.RecordUsageRequest, context: Context
    ) -> pb.RecordUsageResponse:
        v.require(request.HasField("usage"), "MISSING_FIELD", "usage is required", "usage")
        v.require_id(request.entry_id, "entry_id", optional=True)
        usage_id = new_id()

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.RecordUsageResponse]:
            t = runs.record_usage(
                state, usage_id, request.usage, request.entry_id or None, request.adjustment, now
            )
            return t, pb.RecordUsageResponse(usage_id=usage_id, revision=t.state.revision)

        return await self.command("RecordUsage", request, decide, pb.RecordUsageResponse)
