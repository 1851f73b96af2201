"""RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.commands import tools
from lane.server.domain.jsontext import require_json_object


class ToolRpcs(ServicerBase):
    """RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

    @unary
    async def StartToolCall(
        self, request: pb.StartToolCallRequest, call: Call
    ) -> pb.StartToolCallResponse:
        v.require_ids(request, "operation_id", "tool_call_id")
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        require_json_object(request.arguments_json, "arguments_json")
        return await self.command(call, request, tools.start_tool_call)

    @unary
    async def UpdateToolCall(
        self, request: pb.UpdateToolCallRequest, call: Call
    ) -> pb.UpdateToolCallResponse:
        v.require_ids(request, "operation_id", "tool_call_id")
        v.require(
            request.HasField("partial_result"),
            "MISSING_FIELD",
            "partial_result is required",
            "partial_result",
        )
        v.check_message(request, "")
        return await self.command(call, request, tools.update_tool_call)

    @unary
    async def StageToolOutcome(
        self, request: pb.StageToolOutcomeRequest, call: Call
    ) -> pb.StageToolOutcomeResponse:
        v.require_ids(request, "operation_id", "tool_call_id")
        v.check_message(request, "")
        which = request.WhichOneof("outcome")
        v.require(
            which is not None, "MISSING_FIELD", "executed or synthetic is required", "outcome"
        )
        if which == "executed":
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
        return await self.command(call, request, tools.stage_tool_outcome)
