"""Invariant checks on a tool batch's durable state, shared by capture and placement.

A violation is corruption, never a reason to guess: it raises :class:`Corruption` naming the
lane and the call, so neither a wrong snapshot nor a wrong transcript entry can result.
"""

from __future__ import annotations

from lane.v1 import messages_pb2

from lane.server.domain.errors import Corruption
from lane.server.domain.state import LaneState, ToolBatch, ToolCall


def corrupt(state: LaneState, call: ToolCall, problem: str) -> Corruption:
    """The error for ``call`` violating an invariant."""
    return Corruption(
        "LANE_STATE_CORRUPT",
        f"lane {state.lane_id}: tool call {call.tool_call_id} (source index "
        f"{call.source_index}) {problem}",
        laneId=state.lane_id,
        toolCallId=call.tool_call_id,
        sourceIndex=call.source_index,
    )


def source_block(
    state: LaneState, batch: ToolBatch, call: ToolCall
) -> messages_pb2.ToolCallContent:
    """The call's tool-call block in the batch's assistant message, which must match it."""
    content = batch.assistant.content
    if call.source_index >= len(content) or content[call.source_index].WhichOneof("block") != (
        "tool_call"
    ):
        raise corrupt(state, call, "has no tool-call block at its source index")
    block = content[call.source_index].tool_call
    if block.id != call.tool_call_id or block.name != call.tool_name:
        raise corrupt(state, call, f"does not match its source block {block.id}/{block.name}")
    return block


def staged_result(
    state: LaneState, batch: ToolBatch, call: ToolCall
) -> messages_pb2.ToolResultMessage:
    """The staged result message of an outcome_ready call, which must match the call."""
    source_block(state, batch, call)
    message = call.result_message
    if message is None:
        raise corrupt(state, call, "is outcome_ready without a staged result")
    if message.tool_call_id != call.tool_call_id or message.tool_name != call.tool_name:
        raise corrupt(
            state, call, f"has a staged result for {message.tool_call_id}/{message.tool_name}"
        )
    return message
