"""RPCs of a run's life: start, abort, end, turns, assistant settlement, usage."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase, command_rpc
from lane.server.commands import runs


def _start_run(request: pb.StartRunRequest) -> None:
    v.check_message(request, "")
    v.require_id(request.operation_id, "operation_id", optional=True)
    for index, message in enumerate(request.prompt):
        v.require_kind(message, f"prompt[{index}]", "user", "custom")
    v.check_lease(request.driver_id, request.lease_seconds)


def _end_run(request: pb.EndRunRequest) -> None:
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
        v.require(bool(request.error.code), "MISSING_FIELD", "error.code is required", "error.code")


def _start_turn(request: pb.StartTurnRequest) -> None:
    v.require_ids(request, "operation_id")
    v.require_id(request.turn_id, "turn_id", optional=True)


def _settle_assistant_message(request: pb.SettleAssistantMessageRequest) -> None:
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


def _record_usage(request: pb.RecordUsageRequest) -> None:
    v.require(request.HasField("usage"), "MISSING_FIELD", "usage is required", "usage")
    v.require_id(request.entry_id, "entry_id", optional=True)


class RunRpcs(ServicerBase):
    """RPCs of a run's life: start, abort, end, turns, assistant settlement, usage."""

    StartRun = command_rpc(runs.start_run, _start_run)
    AbortOperation = command_rpc(runs.abort_operation, v.ids("operation_id"))
    EndRun = command_rpc(runs.end_run, _end_run)
    StartTurn = command_rpc(runs.start_turn, _start_turn)
    SettleAssistantMessage = command_rpc(runs.settle_assistant_message, _settle_assistant_message)
    RecordUsage = command_rpc(runs.record_usage, _record_usage)
