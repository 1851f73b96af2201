"""What every adapter shows a provider: the lane's context as plain messages, and the tools.

:func:`context` turns a :class:`~lane.client.model.ModelRequest` into the messages an LLM sees,
oldest first: a compaction (or branch) summary becomes a user message saying it is a summary,
followed by the messages the compaction kept; application-defined (custom) messages are left
out; an assistant message that failed or was aborted before saying anything is left out (a
provider refuses an empty assistant turn). Each adapter then writes these in its provider's
request format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lane.v1 import messages_pb2

if TYPE_CHECKING:
    from lane.client.model import ModelRequest

__all__ = ["ToolSpec", "context", "summary_message", "text_of", "tool_arguments", "tool_specs"]

#: How a summary is introduced to the model.
SUMMARY_PREFIX = "The conversation so far, summarized:\n\n"


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a provider is told of it."""

    name: str
    description: str
    #: The tool's arguments as a JSON Schema (an object schema).
    parameters: dict[str, Any]


def tool_specs(request: ModelRequest) -> list[ToolSpec]:
    """The request's tools: name, description, JSON Schema."""
    return [ToolSpec(t.name, t.description, dict(t.parameters)) for t in request.tools]


def summary_message(summary: str) -> messages_pb2.AgentMessage:
    """A compaction or branch summary as the user message a model is shown."""
    return messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(
            content=[
                messages_pb2.ContentBlock(
                    text=messages_pb2.TextContent(text=SUMMARY_PREFIX + summary)
                )
            ]
        )
    )


def _shown(message: messages_pb2.AgentMessage) -> bool:
    kind = message.WhichOneof("message")
    if kind in ("user", "tool_result"):
        return True
    if kind == "assistant":
        failed = message.assistant.stop_reason in (
            messages_pb2.STOP_REASON_ERROR,
            messages_pb2.STOP_REASON_ABORTED,
        )
        return not (failed and not message.assistant.content)
    return False


def context(request: ModelRequest) -> list[messages_pb2.AgentMessage]:
    """The messages the model is shown, oldest first (see the module doc)."""
    if not request.entries:
        return [m for m in request.messages if _shown(m)]
    out: list[messages_pb2.AgentMessage] = []
    for entry in request.entries:
        payload = entry.WhichOneof("payload")
        if payload == "message":
            if _shown(entry.message.message):
                out.append(entry.message.message)
        elif payload == "compaction":
            out.append(summary_message(entry.compaction.summary))
            out.extend(m for m in entry.compaction.retained_tail if _shown(m))
        elif payload == "branch_summary":
            out.append(summary_message(entry.branch_summary.summary))
    return out


def text_of(blocks: Any) -> str:
    """The text blocks of ``blocks`` joined by newlines (images and the rest left out)."""
    return "\n".join(b.text.text for b in blocks if b.WhichOneof("block") == "text")


def tool_arguments(call: messages_pb2.ToolCallContent) -> dict[str, Any]:
    """A tool call's arguments as an object, for providers that take them parsed. The
    arguments of a call cut off for length may not parse: those become ``{}`` (the call never
    ran; its TRUNCATED result says so)."""
    try:
        parsed = json.loads(call.arguments_json or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
