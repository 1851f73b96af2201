"""The service ending a run no driver holds (docs/recovery.md).

A leased run whose lease lapsed is reconciled once its abort was requested, or once it has been
orphaned for a while without a new driver taking it over: planned calls get the cancelled
synthetic (tool_start + tool_end), effect_pending calls the interruption result from their
checkpoint (tool_end only), outcome_ready calls are placed, then run_end ABORTED — every event
tagged recovery. No tool runs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from lane.v1 import snapshot_pb2

from lane.server.domain.compaction import end_compaction
from lane.server.domain.leases import reconcilable
from lane.server.domain.runs import end_run
from lane.server.domain.state import LaneState
from lane.server.domain.transition import OperationEnded


def reconcile(
    state: LaneState,
    operation_id: str,
    now: datetime,
    orphan_after: timedelta,
    new_id: Callable[[], str],
) -> OperationEnded | None:
    """End ``operation_id`` if it is still reconcilable now; None when it is not (nothing to
    change)."""
    operation = state.operation
    if (
        operation is None
        or operation.operation_id != operation_id
        or not reconcilable(operation, now, orphan_after)
    ):
        return None
    if operation.kind == snapshot_pb2.OPERATION_KIND_COMPACTION:
        return end_compaction(
            state,
            operation_id,
            snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            None,
            None,
            now,
            new_id,
            lease_token=None,
        )
    return end_run(
        state,
        operation_id,
        snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
        None,
        now,
        new_id,
        recovery=True,
        lease_token=None,
    )
