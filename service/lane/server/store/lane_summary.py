"""A lane in one line: what a lane list shows of it (ListLanes, WatchLanes).

The status is derived from the lane's open operation and its fault flag; the first rule that
applies wins: aborting, compacting, suspended, retry waiting, running (an operation is open),
faulted, idle. The store computes the same status in SQL to filter a listing by it
(``store/lane_summaries.py``); the service's tests hold the two to each other.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple, TypeAlias

from google.protobuf import timestamp_pb2
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.domain.state import CallStatus, LaneState, Operation

LaneStatus: TypeAlias = pb.LaneStatus.ValueType
ResultStatus: TypeAlias = snapshot_pb2.OperationResultStatus.ValueType


def operation_status(operation: Operation | None) -> LaneStatus:
    """The status of a lane with ``operation`` open (None: see :func:`lane_status`)."""
    if operation is None:
        return pb.LANE_STATUS_IDLE
    return open_status(
        kind=operation.kind,
        cancel_requested=operation.cancel_requested,
        suspended=operation.deferred is not None,
        retry_waiting=operation.retry is not None,
    )


def open_status(
    *,
    kind: snapshot_pb2.OperationKind.ValueType,
    cancel_requested: bool,
    suspended: bool,
    retry_waiting: bool,
) -> LaneStatus:
    """The status of a lane whose open operation is of ``kind`` and in this state."""
    if cancel_requested:
        return pb.LANE_STATUS_ABORTING
    if kind == snapshot_pb2.OPERATION_KIND_COMPACTION:
        return pb.LANE_STATUS_COMPACTING
    if suspended:
        return pb.LANE_STATUS_SUSPENDED
    if retry_waiting:
        return pb.LANE_STATUS_RETRY_WAITING
    return pb.LANE_STATUS_RUNNING


def lane_status(state: LaneState) -> LaneStatus:
    """Where the lane stands (the module docstring's rules)."""
    if state.operation is not None:
        return operation_status(state.operation)
    return pb.LANE_STATUS_FAULTED if state.faulted else pb.LANE_STATUS_IDLE


def running_tool_calls(operation: Operation | None) -> int:
    """Calls of the open batch that started and have not settled (``effect_pending``)."""
    if operation is None or operation.batch is None:
        return 0
    return sum(call.status == CallStatus.EFFECT_PENDING for call in operation.batch.calls)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    """``moment`` (timezone-aware) as a protobuf Timestamp; integer arithmetic, as
    ``Timestamp.FromDatetime`` does at several times the cost (a summary is made per commit)."""
    micros = (moment - _EPOCH) // _MICROSECOND
    seconds, rest = divmod(micros, 1_000_000)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=rest * 1000)


class OpenOperation(NamedTuple):
    """What a summary shows of the lane's open operation."""

    operation_id: str
    kind: snapshot_pb2.OperationKind.ValueType
    started_time: datetime
    cancel_requested: bool


def summary(
    *,
    lane_id: str,
    revision: int,
    tip_id: str,
    incarnation: int,
    status: LaneStatus,
    faulted: bool,
    usage_totals: messages_pb2.Usage,
    operation: OpenOperation | None,
    running_tool_calls: int,
    last_operation_id: str,
    last_result_status: ResultStatus,
    last_activity: datetime,
) -> pb.LaneSummary:
    """A lane's summary from its parts (a row read by the store, or :func:`summary_of`)."""
    line = pb.LaneSummary(
        lane_id=lane_id,
        revision=revision,
        tip_id=tip_id,
        status=status,
        last_activity_time=timestamp(last_activity),
        last_operation_id=last_operation_id,
        last_result_status=last_result_status,
        usage_totals=usage_totals,
        running_tool_calls=running_tool_calls,
        incarnation=str(incarnation),
        faulted=faulted,
    )
    if operation is not None:
        line.operation_id = operation.operation_id
        line.operation_status = (
            snapshot_pb2.OPERATION_STATUS_ABORTING
            if operation.cancel_requested
            else snapshot_pb2.OPERATION_STATUS_OPEN
        )
        line.operation_kind = operation.kind
        line.operation_started_time.CopyFrom(timestamp(operation.started_time))
    return line


def summary_of(
    state: LaneState, *, last_activity: datetime, last_result_status: ResultStatus
) -> pb.LaneSummary:
    """The summary of the lane in ``state``, whose last commit was at ``last_activity`` and
    whose last ended operation (``state.last_operation_id``) ended ``last_result_status``."""
    operation = state.operation
    return summary(
        lane_id=state.lane_id,
        revision=state.revision,
        tip_id=state.tip_id,
        incarnation=state.incarnation,
        status=lane_status(state),
        faulted=state.faulted,
        usage_totals=state.usage_totals,
        operation=None
        if operation is None
        else OpenOperation(
            operation.operation_id,
            operation.kind,
            operation.started_time,
            operation.cancel_requested,
        ),
        running_tool_calls=running_tool_calls(operation),
        last_operation_id=state.last_operation_id or "",
        last_result_status=last_result_status,
        last_activity=last_activity,
    )


def known_result_status(state: LaneState, previous: pb.LaneSummary | None) -> ResultStatus | None:
    """How the lane's last operation ended, if ``state`` or the lane's ``previous`` summary
    tells (None: it must be read — a state loaded for a command carries no result record)."""
    if state.last_operation_id is None:
        return snapshot_pb2.OPERATION_RESULT_STATUS_UNSPECIFIED
    if state.last_result is not None and state.last_result.operation_id == state.last_operation_id:
        return state.last_result.status
    if (
        previous is not None
        and previous.incarnation == str(state.incarnation)
        and previous.last_operation_id == state.last_operation_id
    ):
        return previous.last_result_status
    return None
