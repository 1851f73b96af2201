"""The model side of the driver SDK: what a model is asked, and a scripted stand-in for an LLM.

A model is any async callable ``(ModelRequest) -> lane.v1.AssistantMessage``. The driver calls
it once per turn with the lane's durable transcript (so a driver taking a run over asks exactly
what the first one would have) and the tools it can run. Wrap an LLM provider in one (the
adapters of :mod:`lane.client.models` do).

Streaming is optional: a model that receives its answer piece by piece calls
``request.partial(message_so_far)`` whenever it grew (with ``block_complete=True`` when a
text, thinking or tool-call block just finished), then returns the final message as usual. The
driver commits the partials with ``AppendAssistantStream`` (coalesced: see
:class:`~lane.client.driver.Driver`) and settles the returned message. It reads the partial
when it commits, so a model may keep growing the same message object. A model that never calls
it (such as :class:`ScriptedModel`) just settles its answer.

A model raises :class:`ModelError` to say why it failed: ``retryable`` errors (rate limits,
overload, server errors) are retried by the driver through ``ScheduleRetry``/``StartRetry``
after ``retry_after`` seconds (or its backoff); any other exception fails the run with its
message.

For demos and tests, :class:`ScriptedModel` answers from a fixed script::

    model = ScriptedModel([
        ScriptStep("Two things at once.", calls=[ScriptedCall("sleep", {"seconds": 2}),
                                                  ScriptedCall("shell", {"command": "ls"})]),
        ScriptStep("All done."),
    ])

The scripted model is stateless: the step it answers is the number of assistant messages after
the last user message of the transcript, so it picks up where a crashed driver left off. After
the last step it answers ``final_text`` without tool calls, which lets the run complete.

A script can also be JSON (:func:`load_script`)::

    [{"text": "Two things at once.",
      "tools": [{"name": "sleep", "args": {"seconds": 2}},
                {"name": "shell", "args": {"command": "ls"}}]},
     {"text": "All done."}]
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lane.v1 import entries_pb2, messages_pb2

if TYPE_CHECKING:
    from lane.client.tools import Tool

__all__ = [
    "Model",
    "ModelError",
    "ModelRequest",
    "PartialSink",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedModel",
    "assistant_message",
    "load_script",
    "user_message",
]


class PartialSink(Protocol):
    """Where a streaming model reports its answer so far (see the module doc)."""

    def __call__(
        self, message: messages_pb2.AssistantMessage, *, block_complete: bool = False
    ) -> None: ...


def _no_partials(message: messages_pb2.AssistantMessage, *, block_complete: bool = False) -> None:
    """The sink of a request made outside a driver: partials go nowhere."""


class ModelError(Exception):
    """A model call failed; ``retryable`` ones (HTTP 408, 409, 429, 5xx, overload, a broken
    connection) are retried by the driver, after ``retry_after`` seconds when the provider said
    so. ``message`` is the provider's own explanation, kept as the run's error message."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        status: int | None = None,
        code: str = "model_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.code = code


@dataclass(frozen=True)
class ModelRequest:
    """One turn's question to the model."""

    lane_id: str
    operation_id: str
    turn_id: str
    #: The lane's transcript (message entries, oldest first), as durably stored.
    messages: tuple[messages_pb2.AgentMessage, ...]
    #: The tools the driver can run.
    tools: tuple[Tool, ...]
    #: Set once the run's abort has been seen (the driver then stops waiting for the answer).
    abort_signal: asyncio.Event = field(default_factory=asyncio.Event)
    #: Where a streaming model reports its answer so far (see the module doc).
    partial: PartialSink = _no_partials
    #: The transcript's entries (oldest first): ``messages`` plus the compaction and branch
    #: summaries among them, for models that show those to the LLM. Empty when the caller gave
    #: only ``messages``.
    entries: tuple[entries_pb2.Entry, ...] = ()


Model = Callable[[ModelRequest], Awaitable[messages_pb2.AssistantMessage]]

_STOP_REASONS: dict[str, messages_pb2.StopReason.ValueType] = {
    "stop": messages_pb2.STOP_REASON_STOP,
    "length": messages_pb2.STOP_REASON_LENGTH,
    "tool_use": messages_pb2.STOP_REASON_TOOL_USE,
    "error": messages_pb2.STOP_REASON_ERROR,
    "aborted": messages_pb2.STOP_REASON_ABORTED,
}


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call of a scripted step. ``args`` as text is sent verbatim (may be invalid)."""

    name: str
    args: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ScriptStep:
    """One scripted assistant message: text, tool calls, and optionally its stop reason."""

    text: str = ""
    calls: Sequence[ScriptedCall] = ()
    #: None: TOOL_USE with calls, else STOP.
    stop_reason: messages_pb2.StopReason.ValueType | None = None


def user_message(text: str) -> messages_pb2.AgentMessage:
    """A user message with one text block, time-stamped now."""
    message = messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(
            content=[messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=text))]
        )
    )
    message.user.timestamp.GetCurrentTime()
    return message


def assistant_message(
    text: str = "",
    calls: Sequence[ScriptedCall] = (),
    stop_reason: messages_pb2.StopReason.ValueType | None = None,
    *,
    call_id_prefix: str = "call",
    provider: str = "scripted",
    model: str = "scripted-model",
) -> messages_pb2.AssistantMessage:
    """A settled assistant message (time-stamped now); calls without an id get
    ``{call_id_prefix}_{n}``."""
    content: list[messages_pb2.ContentBlock] = []
    if text:
        content.append(messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=text)))
    for index, call in enumerate(calls, start=1):
        arguments = call.args if isinstance(call.args, str) else json.dumps(dict(call.args))
        content.append(
            messages_pb2.ContentBlock(
                tool_call=messages_pb2.ToolCallContent(
                    id=call.id or f"{call_id_prefix}_{index}",
                    name=call.name,
                    arguments_json=arguments,
                )
            )
        )
    if stop_reason is None:
        stop_reason = messages_pb2.STOP_REASON_TOOL_USE if calls else messages_pb2.STOP_REASON_STOP
    message = messages_pb2.AssistantMessage(
        content=content, api="scripted", provider=provider, model=model, stop_reason=stop_reason
    )
    message.timestamp.GetCurrentTime()
    return message


class ScriptedModel:
    """A model that answers from a script (see the module doc)."""

    def __init__(
        self, steps: Sequence[ScriptStep], *, final_text: str = "Done.", delay: float = 0.0
    ) -> None:
        self.steps = list(steps)
        self.final_text = final_text
        #: Seconds each answer takes (to look like a model thinking).
        self.delay = delay
        #: How many times the model was asked.
        self.calls = 0

    def step_index(self, messages: Sequence[messages_pb2.AgentMessage]) -> int:
        """The script step the transcript ``messages`` is at."""
        index = 0
        for message in messages:
            kind = message.WhichOneof("message")
            if kind == "user":
                index = 0
            elif kind == "assistant":
                index += 1
        return index

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        index = self.step_index(request.messages)
        if index >= len(self.steps):
            return assistant_message(self.final_text)
        step = self.steps[index]
        return assistant_message(
            step.text, step.calls, step.stop_reason, call_id_prefix=f"call_{index + 1}"
        )


def load_script(data: Any) -> list[ScriptStep]:
    """Script steps from parsed JSON (see the module doc); raises ValueError when malformed."""
    if not isinstance(data, list):
        raise ValueError("a script is a JSON list of steps")
    steps: list[ScriptStep] = []
    for number, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise ValueError(f"script step {number} is not an object")
        unknown = set(item) - {"text", "tools", "stop_reason"}
        if unknown:
            raise ValueError(f"script step {number}: unknown keys {sorted(unknown)}")
        text = item.get("text", "")
        if not isinstance(text, str):
            raise ValueError(f"script step {number}: text must be a string")
        calls: list[ScriptedCall] = []
        for call in item.get("tools", []):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ValueError(f"script step {number}: each tool needs a name")
            args = call.get("args", {})
            if not isinstance(args, dict | str):
                raise ValueError(f"script step {number}: args must be an object or JSON text")
            calls.append(ScriptedCall(call["name"], args, call.get("id")))
        stop = item.get("stop_reason")
        if stop is not None and stop not in _STOP_REASONS:
            raise ValueError(
                f"script step {number}: stop_reason must be one of {sorted(_STOP_REASONS)}"
            )
        steps.append(ScriptStep(text, calls, _STOP_REASONS[stop] if stop else None))
    return steps
