"""Authoritative snapshot capture (seed: "Exact authoritative capture behavior").

Projection of the current batch: planned → omitted; effect_pending → running (args required,
latest progress as ``result`` when there is one); outcome_ready → settled (staged result
required and matching its source block; args fall back to the source block for immediate
synthetics); completed → only its transcript entry. Corrupt state raises :class:`Corruption`
rather than producing a wrong snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence

from lane.v1 import entries_pb2, snapshot_pb2

from service.domain.errors import Corruption
from service.domain.results import result_from_message
from service.domain.state import CallStatus, LaneState, Operation, ToolBatch, ToolCall


def _corrupt(state: LaneState, call: ToolCall, problem: str) -> Corruption:
    return Corruption(
        "LANE_STATE_CORRUPT",
        f"lane {state.lane_id}: tool call {call.tool_call_id} (source index "
        f"{call.source_index}) {problem}",
        laneId=state.lane_id,
        toolCallId=call.tool_call_id,
        sourceIndex=call.source_index,
    )


def _source_block(state: LaneState, batch: ToolBatch, call: ToolCall) -> str:
    """Validate the call's source block; return its arguments."""
    content = batch.assistant.content
    if call.source_index >= len(content) or content[call.source_index].WhichOneof("block") != (
        "tool_call"
    ):
        raise _corrupt(state, call, "has no tool-call block at its source index")
    block = content[call.source_index].tool_call
    if block.id != call.tool_call_id or block.name != call.tool_name:
        raise _corrupt(state, call, f"does not match its source block {block.id}/{block.name}")
    return block.arguments_json


def project_tool(
    state: LaneState, batch: ToolBatch, call: ToolCall
) -> snapshot_pb2.SnapshotTool | None:
    """The runningTools row of ``call``, or None when it is not presentation-active."""
    if call.status in (CallStatus.PLANNED, CallStatus.COMPLETED):
        return None
    source_arguments = _source_block(state, batch, call)
    if call.status == CallStatus.EFFECT_PENDING:
        if call.arguments_json is None:
            raise _corrupt(state, call, "is effect_pending without persisted arguments")
        running = snapshot_pb2.RunningTool(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments_json=call.arguments_json,
        )
        if call.progress is not None:
            running.result.CopyFrom(call.progress)
        return snapshot_pb2.SnapshotTool(running=running)
    message = call.result_message
    if message is None:
        raise _corrupt(state, call, "is outcome_ready without a staged result")
    if message.tool_call_id != call.tool_call_id or message.tool_name != call.tool_name:
        raise _corrupt(
            state, call, f"has a staged result for {message.tool_call_id}/{message.tool_name}"
        )
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
        kind=operation.kind,  # type: ignore[arg-type]
        from_tip_id=operation.from_tip_id,
        status=(
            snapshot_pb2.OPERATION_STATUS_ABORTING
            if operation.cancel_requested
            else snapshot_pb2.OPERATION_STATUS_OPEN
        ),
    )
    snapshot.started_time.FromDatetime(operation.started_time)
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
