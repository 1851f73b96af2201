"""Authoritative snapshot capture (docs/contract.md, Invariants: fold equals capture).

Projection of the current batch: planned → omitted; effect_pending → running (args required,
latest progress as ``result`` when there is one); outcome_ready → settled (staged result
required and matching its source block; args fall back to the source block for immediate
synthetics); completed → only its transcript entry. Corrupt state raises :class:`Corruption`
rather than producing a wrong snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence

from lane.v1 import entries_pb2, snapshot_pb2

from lane.server.domain.integrity import corrupt, source_block, staged_result
from lane.server.domain.results import result_from_message
from lane.server.domain.state import CallStatus, LaneState, Operation, ToolBatch, ToolCall


def project_tool(
    state: LaneState, batch: ToolBatch, call: ToolCall
) -> snapshot_pb2.SnapshotTool | None:
    """The runningTools row of ``call``, or None when it is not presentation-active."""
    if call.status in (CallStatus.PLANNED, CallStatus.COMPLETED):
        return None
    source_arguments = source_block(state, batch, call).arguments_json
    if call.status == CallStatus.EFFECT_PENDING:
        if call.arguments_json is None:
            raise corrupt(state, call, "is effect_pending without persisted arguments")
        running = snapshot_pb2.RunningTool(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments_json=call.arguments_json,
        )
        if call.progress is not None:
            running.result.CopyFrom(call.progress)
        return snapshot_pb2.SnapshotTool(running=running)
    message = staged_result(state, batch, call)
    settled = snapshot_pb2.SettledTool(
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        arguments_json=(
            call.arguments_json if call.arguments_json is not None else source_arguments
        ),
        result=result_from_message(message, terminate=call.terminate),
        is_error=message.is_error,
    )
    return snapshot_pb2.SnapshotTool(settled=settled)


def _operation(state: LaneState, operation: Operation) -> snapshot_pb2.SnapshotOperation:
    snapshot = snapshot_pb2.SnapshotOperation(
        id=operation.operation_id,
        kind=operation.kind,
        from_tip_id=operation.from_tip_id,
        status=(
            snapshot_pb2.OPERATION_STATUS_ABORTING
            if operation.cancel_requested
            else snapshot_pb2.OPERATION_STATUS_OPEN
        ),
    )
    snapshot.started_time.FromDatetime(operation.started_time)
    if operation.retry is not None:
        snapshot.retry.CopyFrom(operation.retry)
    if operation.deferred is not None:
        snapshot.deferred.CopyFrom(operation.deferred)
    if operation.streaming is not None:
        snapshot.streaming_message.CopyFrom(operation.streaming)
    if operation.batch is not None:
        for call in sorted(operation.batch.calls, key=lambda c: c.source_index):
            row = project_tool(state, operation.batch, call)
            if row is not None:
                snapshot.running_tools.append(row)
    return snapshot


def capture(state: LaneState, transcript: Sequence[entries_pb2.Entry]) -> snapshot_pb2.LaneSnapshot:
    """The lane snapshot at ``state.revision``; ``transcript`` runs from the newest compaction
    (if any) to the tip, oldest first."""
    snapshot = snapshot_pb2.LaneSnapshot(
        lane_id=state.lane_id,
        revision=state.revision,
        transcript=transcript,
        tip_id=state.tip_id,
        configuration=state.configuration,
        queues=state.inbox,
        faulted=state.faulted,
    )
    snapshot.stats.message_count = state.message_count
    snapshot.stats.usage.CopyFrom(state.usage_totals)
    if state.last_result is not None:
        snapshot.last_result.CopyFrom(state.last_result)
    if state.operation is not None:
        snapshot.operation.CopyFrom(_operation(state, state.operation))
    return snapshot
