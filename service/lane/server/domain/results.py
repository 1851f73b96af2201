"""Tool results: the canonical result ↔ message conversions and the synthetic outcomes.

``tool_end`` and snapshot capture both derive a call's final ``ToolResult`` from its staged
``ToolResultMessage`` with :func:`result_from_message`, so a folded settled row and a captured
one are equal by construction (docs/contract.md, Commits and their events: fold equals capture).
"""

from __future__ import annotations

from datetime import datetime

from lane.v1 import messages_pb2

from lane.server.domain.errors import InvalidArgument
from lane.server.domain.event_log import stamp
from lane.server.domain.run_inputs import Cause, Synthetic

TRUNCATED_TEXT = (
    "Tool call {name} was not executed: the response reached its output token limit, so its "
    "arguments may be cut short. Issue the call again if it is still needed."
)
UNKNOWN_TOOL_TEXT = "Tool {name} is not available."
CANCELLED_TEXT = "Tool execution was cancelled before it completed."
INTERRUPTED_TEXT = (
    "[interrupted] The tool call was interrupted. Any output above is its latest durable "
    "snapshot; newer output may be missing, and whether its external effect happened is unknown."
)


def _text(text: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=text))


def _copy_details_and_usage(
    source: messages_pb2.ToolResult | messages_pb2.ToolResultMessage,
    target: messages_pb2.ToolResult | messages_pb2.ToolResultMessage,
) -> None:
    """Carry a result's optional details and usage over, leaving them unset where unset."""
    if source.HasField("details_json"):
        target.details_json = source.details_json
    if source.HasField("usage"):
        target.usage.CopyFrom(source.usage)


def message_from_result(
    tool_call_id: str,
    tool_name: str,
    result: messages_pb2.ToolResult,
    *,
    is_error: bool,
    now: datetime,
) -> messages_pb2.ToolResultMessage:
    """The transcript message for a final result (terminate is orchestration state, not kept)."""
    message = messages_pb2.ToolResultMessage(
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        content=result.content,
        added_tool_names=result.added_tool_names,
        is_error=is_error,
    )
    _copy_details_and_usage(result, message)
    message.timestamp.CopyFrom(stamp(now))
    return message


def result_from_message(
    message: messages_pb2.ToolResultMessage, *, terminate: bool
) -> messages_pb2.ToolResult:
    """The canonical final result of a staged message and the call's durable terminate flag."""
    result = messages_pb2.ToolResult(
        content=message.content, added_tool_names=message.added_tool_names, terminate=terminate
    )
    _copy_details_and_usage(message, result)
    return result


def synthetic_result(
    outcome: Synthetic,
    tool_name: str,
    checkpoint: messages_pb2.ToolResult | None,
) -> messages_pb2.ToolResult:
    """The result the service writes for a call that did not (finish) running.

    Synthetic results never invent details; an interruption keeps the checkpoint's content,
    details and usage and appends the interruption notice.
    """
    cause = outcome.cause
    if cause == Cause.TRUNCATED:
        return messages_pb2.ToolResult(content=[_text(TRUNCATED_TEXT.format(name=tool_name))])
    if cause == Cause.UNKNOWN_TOOL:
        return messages_pb2.ToolResult(content=[_text(UNKNOWN_TOOL_TEXT.format(name=tool_name))])
    if cause in (
        Cause.INVALID_ARGUMENTS,
        Cause.DENIED,
    ):
        return messages_pb2.ToolResult(content=[_text(outcome.message)])
    if cause == Cause.CANCELLED:
        return messages_pb2.ToolResult(content=[_text(CANCELLED_TEXT)])
    if cause == Cause.INTERRUPTED:
        result = messages_pb2.ToolResult()
        if checkpoint is not None:
            result.content.extend(checkpoint.content)
            _copy_details_and_usage(checkpoint, result)
        result.content.append(_text(INTERRUPTED_TEXT))
        return result
    raise InvalidArgument(
        "INVALID_SYNTHETIC_CAUSE", "synthetic.cause must be set", field="synthetic.cause"
    )
