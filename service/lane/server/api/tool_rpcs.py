"""RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase, command_rpc
from lane.server.commands import tools
from lane.server.domain.jsontext import require_json_object


def _start_tool_call(request: pb.StartToolCallRequest) -> None:
    v.require_ids(request, "operation_id", "tool_call_id")
    v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
    require_json_object(request.arguments_json, "arguments_json")


def _update_tool_call(request: pb.UpdateToolCallRequest) -> None:
    v.require_ids(request, "operation_id", "tool_call_id")
    v.require(
        request.HasField("partial_result"),
        "MISSING_FIELD",
        "partial_result is required",
        "partial_result",
    )
    v.check_message(request, "")


def _stage_tool_outcome(request: pb.StageToolOutcomeRequest) -> None:
    v.require_ids(request, "operation_id", "tool_call_id")
    v.check_message(request, "")
    which = request.WhichOneof("outcome")
    v.require(which is not None, "MISSING_FIELD", "executed or synthetic is required", "outcome")
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


class ToolRpcs(ServicerBase):
    """RPCs of a tool call's life: intent, progress, staging (and the placement after it)."""

    StartToolCall = command_rpc(tools.start_tool_call, _start_tool_call)
    UpdateToolCall = command_rpc(tools.update_tool_call, _update_tool_call)
    StageToolOutcome = command_rpc(tools.stage_tool_outcome, _stage_tool_outcome)
