"""Compaction: a summary entry that starts the transcript anew.

A standalone compaction is an operation of its own (compaction_start ... entry_added,
compaction_end); inside an idle run, CompactRun brackets the entry with compaction_start and
compaction_end in one commit (the reducer ignores an in-run bracket).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from lane.v1 import entries_pb2, events_pb2, snapshot_pb2

from lane.server.domain import guards
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.event_log import EventLog
from lane.server.domain.leases import granted
from lane.server.domain.run_inputs import RunSettings
from lane.server.domain.state import Continuation, LaneState, Operation, Phase, evolve
from lane.server.domain.transition import OperationEnded, OperationOpened, Transition

Status = snapshot_pb2.OperationResultStatus


@dataclass(frozen=True, kw_only=True)
class RunCompacted(Transition):
    """CompactRun: the compaction entry's id (the new tip)."""

    entry_id: str


def start_compaction(
    state: LaneState,
    operation_id: str,
    reason: events_pb2.CompactionReason.ValueType,
    now: datetime,
    lease: tuple[str, int] | None = None,
) -> OperationOpened:
    """Open a standalone compaction operation; emits compaction_start."""
    guards.require_no_operation(state, now)
    operation = Operation(
        operation_id=operation_id,
        kind=snapshot_pb2.OPERATION_KIND_COMPACTION,
        started_time=now,
        from_tip_id=state.tip_id,
        settings=RunSettings(),
        reason=reason,
    )
    if lease is not None:
        operation = granted(state, operation, lease[0], lease[1], now)
    log = EventLog(state.lane_id, state.revision, now)
    start = events_pb2.CompactionStartEvent(run_id=operation_id, reason=reason)
    start.started_time.FromDatetime(now)
    log.emit("compaction_start", start)
    next_state = evolve(state, operation=operation, revision=log.revision)
    return OperationOpened.of(next_state, log, operation=operation)


def _place_compaction(
    state: LaneState, log: EventLog, entry: entries_pb2.CompactionEntry, new_id: Callable[[], str]
) -> str:
    placed = entries_pb2.Entry(id=new_id(), parent_id=state.tip_id)
    placed.compaction.CopyFrom(entry)
    log.place_entry(placed)
    return placed.id


def end_compaction(
    state: LaneState,
    operation_id: str,
    status: snapshot_pb2.OperationResultStatus.ValueType,
    entry: entries_pb2.CompactionEntry | None,
    error: snapshot_pb2.OperationError | None,
    now: datetime,
    new_id: Callable[[], str],
    lease_token: int | None = 0,
) -> OperationEnded:
    """Close the compaction: its entry when completed (not once aborting), compaction_end.

    ``lease_token=None`` is the service itself ending an orphaned compaction.
    """
    operation = guards.open_operation(state, operation_id)
    if operation.kind != snapshot_pb2.OPERATION_KIND_COMPACTION:
        raise FailedPrecondition(
            "OPERATION_NOT_A_COMPACTION",
            f"operation {operation_id} is not a compaction",
            operationId=operation_id,
        )
    if lease_token is not None:
        guards.check_token(operation, lease_token)
    if operation.cancel_requested:
        status, entry, error = Status.OPERATION_RESULT_STATUS_ABORTED, None, None
    log = EventLog(state.lane_id, state.revision, now)
    tip = state.tip_id
    end = events_pb2.CompactionEndEvent(run_id=operation_id, reason=operation.reason, status=status)
    if status == Status.OPERATION_RESULT_STATUS_COMPLETED and entry is not None:
        tip = _place_compaction(state, log, entry, new_id)
        end.entry_id = tip
    if status == Status.OPERATION_RESULT_STATUS_FAILED and error is not None:
        end.error.CopyFrom(error)
    end.ended_time.FromDatetime(now)
    log.emit("compaction_end", end)
    result = snapshot_pb2.OperationResult(
        operation_id=operation_id,
        kind=snapshot_pb2.OPERATION_KIND_COMPACTION,
        status=status,
        from_tip_id=operation.from_tip_id,
        tip_id=tip,
        ended_time=end.ended_time,
    )
    if end.HasField("error"):
        result.error.CopyFrom(end.error)
    result.started_time.FromDatetime(operation.started_time)
    return OperationEnded.ending(state, log, result)


def compact_run(
    state: LaneState,
    operation_id: str,
    entry: entries_pb2.CompactionEntry,
    reason: events_pb2.CompactionReason.ValueType,
    now: datetime,
    new_id: Callable[[], str],
    lease_token: int = 0,
) -> RunCompacted:
    """Compact inside an idle run: compaction_start, the entry, compaction_end in one commit."""
    operation = guards.driving(state, operation_id, lease_token)
    guards.require_phase(operation, Phase.IDLE)
    guards.require_not_cancelled(operation)
    log = EventLog(state.lane_id, state.revision, now)
    start = events_pb2.CompactionStartEvent(run_id=operation_id, reason=reason)
    start.started_time.FromDatetime(now)
    log.emit("compaction_start", start)
    tip = _place_compaction(state, log, entry, new_id)
    end = events_pb2.CompactionEndEvent(
        run_id=operation_id,
        reason=reason,
        status=Status.OPERATION_RESULT_STATUS_COMPLETED,
        entry_id=tip,
    )
    end.ended_time.FromDatetime(now)
    log.emit("compaction_end", end)
    # The model needs to answer from the compacted context.
    next_operation = evolve(operation, continuation=Continuation.NEED_ASSISTANT)
    next_state = evolve(state, operation=next_operation, tip_id=tip, revision=log.revision)
    return RunCompacted.of(next_state, log, entry_id=tip)
