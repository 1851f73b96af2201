"""Anthropic models for the driver: the Messages API, streamed, through the official
``anthropic`` SDK (the ``anthropic`` extra: ``pip install './clients/python[anthropic]'``).

::

    model = AnthropicModel("claude-sonnet-4-5")             # ANTHROPIC_API_KEY from the env
    model = AnthropicModel("claude-sonnet-4-5", thinking_budget=4000)
    result = await Driver(stub, "lane-1", tools).run("Fix the test.", model)

The transcript, as the Messages API takes it: user text and images as a ``user`` message;
an assistant message's blocks in order — thinking (only with the signature the API gave it:
thinking from another provider cannot be sent back), redacted thinking (its data), text, tool
calls as ``tool_use`` blocks (arguments parsed; those of a call cut off for length that do
not parse become ``{}``); tool results as ``tool_result`` blocks of a ``user`` message (with
``is_error``); a compaction summary as a ``user`` message saying it is one. Consecutive
messages of one role are merged into one, as the API wants turns to alternate.

The answer: ``content_block_start`` opens a block, ``text_delta``, ``thinking_delta``,
``signature_delta`` and ``input_json_delta`` grow it (tool arguments kept as the streamed
text), ``content_block_stop`` finishes it. ``message_delta`` brings the stop reason:
``end_turn``, ``stop_sequence``, ``pause_turn``, ``refusal`` → STOP; ``tool_use`` →
TOOL_USE; ``max_tokens`` and ``model_context_window_exceeded`` → LENGTH (the lane gives the
calls the TRUNCATED result); the provider's word is kept as ``raw_stop_reason``. Usage from
``message_start`` and the cumulative counts of ``message_delta``: input, output, cache read
and cache creation (``cache_write``).

Errors become :class:`~lane.client.model.ModelError` (:mod:`lane.client.models.errors`): 429,
5xx and 529 (overloaded), an ``overloaded_error`` event inside the stream, and every transport
fault (a connect or read timeout — 10 s and 60 s of silence by default —, a connection dropped
mid-answer, a malformed event) are retried by the driver; other HTTP errors fail the run with
the provider's message. The SDK's own retries are off (``max_retries=0``): the driver
retries through the lane, so a retry is durable and visible.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anthropic
from lane.client.model import ModelRequest
from lane.client.models.builder import MessageBuilder, usage
from lane.client.models.errors import (
    CONNECT_TIMEOUT_SECONDS,
    READ_TIMEOUT_SECONDS,
    Timeouts,
    provider_errors,
    stream_error,
)
from lane.client.models.transcript import context, tool_arguments, tool_specs
from lane.v1 import messages_pb2

__all__ = ["AnthropicModel"]

_STOPS: dict[str, messages_pb2.StopReason.ValueType] = {
    "end_turn": messages_pb2.STOP_REASON_STOP,
    "stop_sequence": messages_pb2.STOP_REASON_STOP,
    "pause_turn": messages_pb2.STOP_REASON_STOP,
    "refusal": messages_pb2.STOP_REASON_STOP,
    "tool_use": messages_pb2.STOP_REASON_TOOL_USE,
    "max_tokens": messages_pb2.STOP_REASON_LENGTH,
    "model_context_window_exceeded": messages_pb2.STOP_REASON_LENGTH,
}


def _user_blocks(message: messages_pb2.AgentMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for b in message.user.content:
        if b.WhichOneof("block") == "text":
            blocks.append({"type": "text", "text": b.text.text})
        elif b.WhichOneof("block") == "image":
            blocks.append(
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": b.image.mime_type,
                        "data": b.image.data,
                    },
                }
            )
    return blocks


def _assistant_blocks(message: messages_pb2.AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for b in message.content:
        kind = b.WhichOneof("block")
        if kind == "thinking" and b.thinking.HasField("thinking_signature"):
            if b.thinking.redacted:
                blocks.append({"type": "redacted_thinking", "data": b.thinking.thinking_signature})
            else:
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": b.thinking.thinking,
                        "signature": b.thinking.thinking_signature,
                    }
                )
        elif kind == "text" and b.text.text:
            blocks.append({"type": "text", "text": b.text.text})
        elif kind == "tool_call":
            blocks.append(
                {
                    "type": "tool_use",
                    "id": b.tool_call.id,
                    "name": b.tool_call.name,
                    "input": tool_arguments(b.tool_call),
                }
            )
    return blocks


def _result_block(result: messages_pb2.ToolResultMessage) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for b in result.content:
        if b.WhichOneof("block") == "text":
            content.append({"type": "text", "text": b.text.text})
        elif b.WhichOneof("block") == "image":
            content.append(
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": b.image.mime_type,
                        "data": b.image.data,
                    },
                }
            )
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.tool_call_id,
        "content": content,
    }
    if result.is_error:
        block["is_error"] = True
    return block


class AnthropicModel:
    """A model answering through the Messages API (see the module doc).

    ``client``: an ``anthropic.AsyncAnthropic`` of your own (then ``base_url`` and
    ``api_key`` are unused; give it ``max_retries=0``). ``system``: the system prompt.
    ``max_tokens``: the answer's limit (the API requires one). ``thinking_budget``: turn
    extended thinking on with that many tokens (None: off). ``connect_timeout``: seconds to
    connect to the provider; ``read_timeout``: seconds of silence in its answer before the
    attempt counts as failed (a retryable fault); both go with every request, a client of your
    own too. ``options``: more request parameters, as the SDK takes them.
    """

    api = "anthropic-messages"

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        system: str | None = None,
        max_tokens: int = 8192,
        thinking_budget: int | None = None,
        provider: str = "anthropic",
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = READ_TIMEOUT_SECONDS,
        **options: Any,
    ) -> None:
        self.model = model
        self.timeouts = Timeouts(connect_timeout, read_timeout)
        self.client = client or anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=self.timeouts.sdk(anthropic.Timeout),
        )
        self.system = system
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self.provider = provider
        self.options = options

    def messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The request's transcript as Messages API messages (one role at a time)."""
        out: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            if not blocks:
                return
            if out and out[-1]["role"] == role:
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})

        for message in context(request):
            kind = message.WhichOneof("message")
            if kind == "user":
                add("user", _user_blocks(message))
            elif kind == "assistant":
                add("assistant", _assistant_blocks(message.assistant))
            elif kind == "tool_result":
                add("user", [_result_block(message.tool_result)])
        return out

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The request body (without ``stream``), as the SDK takes it."""
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": self.messages(request),
            **self.options,
        }
        if self.system:
            params["system"] = self.system
        tools = tool_specs(request)
        if tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in tools
            ]
        if self.thinking_budget is not None:
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        return params

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        """The SDK's errors, and its HTTP library's, as :class:`ModelError` s."""
        return provider_errors(
            api_error=anthropic.APIError,
            connection_error=anthropic.APIConnectionError,
            timeouts=self.timeouts,
        )

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        """Ask the model, streaming its answer to ``request.partial``."""
        build = MessageBuilder(
            request.partial, api=self.api, provider=self.provider, model=self.model
        )
        with self._errors():
            stream: Any = await self.client.messages.create(
                **self.params(request), stream=True, timeout=self.timeouts.sdk(anthropic.Timeout)
            )
        stop: str | None = None
        counts = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
        #: Tool blocks whose arguments streamed as input_json_delta (else: their start input).
        streamed: set[int] = set()
        started: dict[int, Any] = {}
        try:
            with self._errors():
                async for event in stream:
                    kind = event.type
                    if kind == "message_start":
                        build.message.response_id = event.message.id
                        build.message.response_model = event.message.model
                        _count(counts, event.message.usage)
                    elif kind == "content_block_start":
                        block = event.content_block
                        started[event.index] = block
                        if block.type == "text":
                            build.text(event.index, block.text)
                        elif block.type == "thinking":
                            build.thinking(event.index, block.thinking, signature=block.signature)
                        elif block.type == "redacted_thinking":
                            build.redacted_thinking(event.index, block.data)
                        elif block.type == "tool_use":
                            build.tool_call(event.index, call_id=block.id, name=block.name)
                    elif kind == "content_block_delta":
                        delta = event.delta
                        if delta.type == "text_delta":
                            build.text(event.index, delta.text)
                        elif delta.type == "thinking_delta":
                            build.thinking(event.index, delta.thinking)
                        elif delta.type == "signature_delta":
                            build.thinking(event.index, signature=delta.signature)
                        elif delta.type == "input_json_delta":
                            streamed.add(event.index)
                            build.tool_call(event.index, arguments=delta.partial_json)
                    elif kind == "content_block_stop":
                        block = started.get(event.index)
                        if (
                            block is not None
                            and block.type == "tool_use"
                            and event.index not in streamed
                        ):
                            # No input_json_delta came: the arguments are the start's input.
                            build.set_arguments(event.index, json.dumps(block.input or {}))
                        build.finish_block(event.index)
                    elif kind == "message_delta":
                        if event.delta.stop_reason:
                            stop = event.delta.stop_reason
                        _count(counts, event.usage)
        finally:
            await stream.close()
        if stop is None:
            raise stream_error("the stream ended without a stop reason")
        build.message.usage.CopyFrom(
            usage(
                counts["input"],
                counts["output"],
                cache_read=counts["cache_read"],
                cache_write=counts["cache_write"],
            )
        )
        reason = _STOPS.get(stop, messages_pb2.STOP_REASON_STOP)
        return build.settle(reason, stop)


def _count(counts: dict[str, int], reported: Any) -> None:
    """Take the (cumulative) counts ``reported`` has; keep the others."""
    if reported is None:
        return
    for name, field in (
        ("input", "input_tokens"),
        ("output", "output_tokens"),
        ("cache_read", "cache_read_input_tokens"),
        ("cache_write", "cache_creation_input_tokens"),
    ):
        value = getattr(reported, field, None)
        if value is not None:
            counts[name] = value
