"""Navigation: move the lane's tip to an earlier entry, optionally summarizing the branch left.

Opened and ended in one commit — navigation_start, [entry_added of the branch summary],
navigation_end — whose result record is the lane's last result. Watchers re-snapshot on
navigation_end (the transcript changed under them: a rebase).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from lane.v1 import entries_pb2, events_pb2, snapshot_pb2

from lane.server.domain import guards
from lane.server.domain.event_log import EventLog
from lane.server.domain.state import LaneState
from lane.server.domain.transition import OperationEnded


def navigate(
    state: LaneState,
    operation_id: str,
    target_id: str,
    summary: entries_pb2.BranchSummaryEntry | None,
    now: datetime,
    new_id: Callable[[], str],
) -> OperationEnded:
    """Move the tip to ``target_id`` (an entry of this lane; the caller checked it exists)."""
    guards.require_no_operation(state, now)
    log = EventLog(state.lane_id, state.revision, now)
    start = events_pb2.NavigationStartEvent(run_id=operation_id, target_id=target_id)
    start.started_time.FromDatetime(now)
    log.emit("navigation_start", start)
    tip = target_id
    if summary is not None:
        entry = entries_pb2.Entry(id=new_id(), parent_id=target_id)
        entry.branch_summary.CopyFrom(summary)
        if not entry.branch_summary.HasField("from_id") and state.tip_id:
            entry.branch_summary.from_id = state.tip_id
        tip = log.place_entry(entry).id
    result = snapshot_pb2.OperationResult(
        operation_id=operation_id,
        kind=snapshot_pb2.OPERATION_KIND_NAVIGATION,
        status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
        from_tip_id=state.tip_id,
        tip_id=tip,
    )
    result.started_time.FromDatetime(now)
    result.ended_time.FromDatetime(now)
    log.emit(
        "navigation_end",
        events_pb2.NavigationEndEvent(
            run_id=operation_id,
            status=result.status,
            from_tip_id=result.from_tip_id,
            tip_id=tip,
            ended_time=result.ended_time,
        ),
    )
    return OperationEnded.ending(state, log, result)
