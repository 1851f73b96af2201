"""RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb

from service.api import validation as v
from service.api.base import Context, ServicerBase, cancel_requested
from service.api.errors import unary
from service.domain import placement, tools
from service.domain.ids import new_id
from service.domain.jsontext import require_json_object
from service.domain.state import LaneState
from service.domain.transition import Transition
from service.store.requests import RequestKey


class ToolRpcs(ServicerBase):
    """RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

    @unary
    async def StartToolCall(
        self, request: pb.StartToolCallRequest, context: Context
    ) -> pb.StartToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        require_json_object(request.arguments_json, "arguments_json")
        replay = request.replay or pb.REPLAY_POLICY_NEVER

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartToolCallResponse]:
            t = tools.start_tool_call(
                state,
                request.operation_id,
                request.tool_call_id,
                request.arguments_json,
                replay,
                now,
                request.lease_token,
            )
            return t, pb.StartToolCallResponse(
                revision=t.state.revision, cancel_requested=cancel_requested(t.state)
            )

        return await self.command("StartToolCall", request, decide, pb.StartToolCallResponse)

    @unary
    async def UpdateToolCall(
        self, request: pb.UpdateToolCallRequest, context: Context
    ) -> pb.UpdateToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.require(
            request.HasField("partial_result"),
            "MISSING_FIELD",
            "partial_result is required",
            "partial_result",
        )
        v.check_message(request, "")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.UpdateToolCallResponse]:
            t = tools.update_tool_call(
                state,
                request.operation_id,
                request.tool_call_id,
                request.partial_result,
                request.checkpoint,
                now,
                request.lease_token,
            )
            return t, pb.UpdateToolCallResponse(
                revision=t.state.revision, cancel_requested=cancel_requested(t.state)
            )

        return await self.command("UpdateToolCall", request, decide, pb.UpdateToolCallResponse)

    @unary
    async def StageToolOutcome(
        self, request: pb.StageToolOutcomeRequest, context: Context
    ) -> pb.StageToolOutcomeResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.check_message(request, "")
        outcome = request.WhichOneof("outcome")
        v.require(
            outcome is not None, "MISSING_FIELD", "executed or synthetic is required", "outcome"
        )
        if outcome == "executed":
            v.require(
                request.executed.HasField("result"),
                "MISSING_FIELD",
                "executed.result is required",
                "executed.result",
            )
        else:
            cause = request.synthetic.cause
            v.require(
                cause != pb.SYNTHETIC_CAUSE_UNSPECIFIED,
                "MISSING_FIELD",
                "synthetic.cause is required",
                "synthetic.cause",
            )
            v.require(
                bool(request.synthetic.message)
                or cause not in (pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, pb.SYNTHETIC_CAUSE_DENIED),
                "MISSING_FIELD",
                "synthetic.message is required for INVALID_ARGUMENTS and DENIED",
                "synthetic.message",
            )
        key = RequestKey.of("StageToolOutcome", request, request.request_id)

        def stage(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.StageToolOutcomeResponse]:
            t = tools.stage_tool_outcome(
                state, request.operation_id, request.tool_call_id, request, now, request.lease_token
            )
            operation = t.state.operation
            assert operation is not None and operation.batch is not None
            call = operation.batch.call(request.tool_call_id)
            assert call is not None and call.result_message is not None
            return t, pb.StageToolOutcomeResponse(
                staged_revision=t.state.revision,
                revision=t.state.revision,
                cancel_requested=cancel_requested(t.state),
                staged=call.result_message,
            )

        lane = self.lane(request.lane_id)
        v.require_id(request.request_id, "request_id", optional=True)
        answer = await self.store.command(lane, stage, pb.StageToolOutcomeResponse, key)

        def place(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.StageToolOutcomeResponse]:
            t = placement.place_ready(state, now, new_id)
            if not t.events:
                return t, answer
            done = pb.StageToolOutcomeResponse()
            done.CopyFrom(answer)
            done.revision = t.state.revision
            done.placed_tool_call_ids.extend(
                e.entry_added.entry.message.message.tool_result.tool_call_id
                for e in t.events
                if e.WhichOneof("kind") == "entry_added"
            )
            done.batch_complete = any(e.WhichOneof("kind") == "turn_end" for e in t.events)
            return t, done

        # Placement is its own commit, after the staging commit (seed: staging < tool_end <
        # placement). A retry of a request whose staging committed still places what is ready.
        return await self.store.command(lane, place, pb.StageToolOutcomeResponse, amends=key)
