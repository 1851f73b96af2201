"""RPCs of the rest of the harness: streaming responses, retries, deferred runs, compaction,
navigation, faults, handler errors and session metadata. Each is its command and the check of
its request (the functions above the class)."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase, command_rpc
from lane.server.commands import harness

Status = snapshot_pb2.OperationResultStatus
MAX_RETRY_DELAY_MS = 24 * 3600 * 1000
#: The statuses a compaction ends with.
COMPACTION_ENDS = (
    Status.OPERATION_RESULT_STATUS_COMPLETED,
    Status.OPERATION_RESULT_STATUS_DECLINED,
    Status.OPERATION_RESULT_STATUS_ABORTED,
    Status.OPERATION_RESULT_STATUS_FAILED,
)


def _append_assistant_stream(request: pb.AppendAssistantStreamRequest) -> None:
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


def _schedule_retry(request: pb.ScheduleRetryRequest) -> None:
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
    if request.HasField("failed_message"):
        failed = request.failed_message
        v.require(
            failed.stop_reason == messages_pb2.STOP_REASON_ERROR,
            "INVALID_STOP_REASON",
            "a failed response has stop_reason ERROR",
            "failed_message.stop_reason",
        )
        v.check_tool_calls(failed, "failed_message")
    v.check_message(request, "", skip_json=frozenset({"arguments_json"}))


def _suspend_run(request: pb.SuspendRunRequest) -> None:
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


def _start_compaction(request: pb.StartCompactionRequest) -> None:
    v.check_message(request, "")
    v.require_id(request.operation_id, "operation_id", optional=True)
    v.check_lease(request.driver_id, request.lease_seconds)


def _end_compaction(request: pb.EndCompactionRequest) -> None:
    v.require_ids(request, "operation_id")
    v.check_message(request, "")
    v.require(
        request.status in COMPACTION_ENDS,
        "INVALID_STATUS",
        "status must be COMPLETED, DECLINED, ABORTED or FAILED",
        "status",
    )
    completed = request.status == Status.OPERATION_RESULT_STATUS_COMPLETED
    v.require(
        request.HasField("entry") == completed,
        "INVALID_ENTRY",
        "entry is required with status COMPLETED and only then",
        "entry",
    )
    v.require(
        request.HasField("error") == (request.status == Status.OPERATION_RESULT_STATUS_FAILED),
        "INVALID_ERROR",
        "error is required with status FAILED and only then",
        "error",
    )
    if completed:
        v.check_compaction(request.entry, "entry")


def _compact_run(request: pb.CompactRunRequest) -> None:
    v.require_ids(request, "operation_id")
    v.require(request.HasField("entry"), "MISSING_FIELD", "entry is required", "entry")
    v.check_message(request, "")
    v.check_compaction(request.entry, "entry")


def _navigate_lane(request: pb.NavigateLaneRequest) -> None:
    v.require_ids(request, "lane_id", "target_entry_id")
    v.check_message(request, "")


def _report_fault(request: pb.ReportFaultRequest) -> None:
    v.require(bool(request.code), "MISSING_FIELD", "code is required", "code")


def _report_handler_error(request: pb.ReportHandlerErrorRequest) -> None:
    v.require(bool(request.error), "MISSING_FIELD", "error is required", "error")


def _set_lane_value(request: pb.SetLaneValueRequest) -> None:
    which = request.WhichOneof("value")
    v.require(which is not None, "MISSING_FIELD", "a value is required", "value")
    if which == "entry_label":
        v.require_id(request.entry_label.target_id, "entry_label.target_id")


class HarnessRpcs(ServicerBase):
    """RPCs of the rest of the harness."""

    AppendAssistantStream = command_rpc(harness.append_assistant_stream, _append_assistant_stream)
    ScheduleRetry = command_rpc(harness.schedule_retry, _schedule_retry)
    StartRetry = command_rpc(harness.start_retry, v.ids("operation_id", "turn_id"))
    SuspendRun = command_rpc(harness.suspend_run, _suspend_run)
    ResumeRun = command_rpc(harness.resume_run, v.ids("operation_id"))
    StartCompaction = command_rpc(harness.start_compaction, _start_compaction)
    EndCompaction = command_rpc(harness.end_compaction, _end_compaction)
    CompactRun = command_rpc(harness.compact_run, _compact_run)
    NavigateLane = command_rpc(harness.navigate_lane, _navigate_lane)
    ReportFault = command_rpc(harness.report_fault, _report_fault)
    ReportHandlerError = command_rpc(harness.report_handler_error, _report_handler_error)
    SetLaneValue = command_rpc(harness.set_lane_value, _set_lane_value)
