"""RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.commands import tools
from lane.server.domain.jsontext import require_json_object
from lane.server.domain.run_inputs import Executed, Outcome, Synthetic


class ToolRpcs(ServicerBase):
    """RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

    @unary
    async def StartToolCall(
        self, request: pb.StartToolCallRequest, call: Call
    ) -> pb.StartToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        require_json_object(request.arguments_json, "arguments_json")
        lane, key = self.addressed(call, request)
        command = tools.StartToolCall(
            lane,
            key,
            operation_id=request.operation_id,
            tool_call_id=request.tool_call_id,
            arguments_json=request.arguments_json,
            replay=request.replay or pb.REPLAY_POLICY_NEVER,
            lease_token=request.lease_token,
        )
        return (await tools.start_tool_call(self.store, command)).to_proto()

    @unary
    async def UpdateToolCall(
        self, request: pb.UpdateToolCallRequest, call: Call
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
        lane, key = self.addressed(call, request)
        command = tools.UpdateToolCall(
            lane,
            key,
            operation_id=request.operation_id,
            tool_call_id=request.tool_call_id,
            partial_result=request.partial_result,
            checkpoint=request.checkpoint,
            lease_token=request.lease_token,
        )
        return (await tools.update_tool_call(self.store, command)).to_proto()

    @unary
    async def StageToolOutcome(
        self, request: pb.StageToolOutcomeRequest, call: Call
    ) -> pb.StageToolOutcomeResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.check_message(request, "")
        which = request.WhichOneof("outcome")
        v.require(
            which is not None, "MISSING_FIELD", "executed or synthetic is required", "outcome"
        )
        outcome: Outcome
        if which == "executed":
            v.require(
                request.executed.HasField("result"),
                "MISSING_FIELD",
                "executed.result is required",
                "executed.result",
            )
            executed = request.executed
            outcome = Executed(executed.result, executed.is_error)
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
            synthetic = request.synthetic
            outcome = Synthetic(synthetic.cause, synthetic.message, synthetic.terminate)
        lane, key = self.addressed(call, request)
        command = tools.StageToolOutcome(
            lane,
            key,
            operation_id=request.operation_id,
            tool_call_id=request.tool_call_id,
            outcome=outcome,
            lease_token=request.lease_token,
        )
        return (await tools.stage_tool_outcome(self.store, command)).to_proto()
