"""OpenAI models for the driver: Chat Completions and Responses, streamed, through the
official ``openai`` SDK (the ``openai`` extra: ``pip install './clients/python[openai]'``).

::

    model = OpenAIChatModel("gpt-5-mini")                       # OPENAI_API_KEY from the env
    model = OpenAIChatModel("qwen3", base_url="http://localhost:8000/v1", api_key="none")
    model = OpenAIResponsesModel("gpt-5-mini", reasoning_effort="low")
    result = await Driver(stub, "lane-1", tools).run("Fix the test.", model)

Both stream and report every delta to the driver (``ModelRequest.partial``), so the lane
shows the answer as it grows. :class:`OpenAIChatModel` speaks ``/chat/completions``, which
OpenAI-compatible servers (vLLM, llama.cpp, Ollama, ...) serve too; :class:`OpenAIResponsesModel`
speaks ``/responses``.

The transcript, as each API takes it:

=====================  =======================================  ==============================
lane                   Chat Completions                         Responses
=====================  =======================================  ==============================
user text, images      ``user`` message (text, image parts)     ``user`` message (input parts)
assistant text         ``assistant`` content                    ``assistant`` message
assistant tool call    ``tool_calls`` (arguments as text)       ``function_call`` item
assistant thinking     left out (the API takes none back)       left out (likewise)
tool result            ``tool`` message (its text)              ``function_call_output`` item
compaction summary     a ``user`` message saying it is one      the same
=====================  =======================================  ==============================

and the answer: text deltas grow a text block; reasoning deltas (Chat: the
``reasoning_content`` or ``reasoning`` field compatible servers send; Responses: reasoning
summary and reasoning text) grow a thinking block; tool-call argument deltas grow the call's
arguments, kept as text. The stop reason: ``stop`` → STOP, ``tool_calls`` → TOOL_USE,
``length`` (Chat) or an ``incomplete`` response for ``max_output_tokens`` (Responses) → LENGTH
(the lane then gives its calls the TRUNCATED result), ``content_filter`` → STOP; the
provider's own word is kept as ``raw_stop_reason``. Usage from the last chunk (Chat, asked for
with ``stream_options.include_usage``) or the completed response: ``input`` is the prompt
tokens less the cached ones, which are ``cache_read``.

Errors become :class:`~lane.client.model.ModelError` (:mod:`lane.client.models.errors`):
429, 5xx, a stream's server error and every transport fault (a connect or read timeout — 10 s
and 60 s of silence by default —, a connection dropped mid-answer, a malformed chunk) are
retried by the driver; other HTTP errors fail the run with the provider's message. The
SDK's own retries are off (``max_retries=0``): the driver retries through the lane, so a retry
is durable and visible.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import openai
from lane.client.model import ModelRequest
from lane.client.models.builder import MessageBuilder, usage
from lane.client.models.errors import (
    CONNECT_TIMEOUT_SECONDS,
    READ_TIMEOUT_SECONDS,
    Timeouts,
    provider_errors,
    stream_error,
)
from lane.client.models.transcript import context, text_of, tool_specs
from lane.v1 import messages_pb2

__all__ = ["OpenAIChatModel", "OpenAIResponsesModel"]

_CHAT_STOPS: dict[str, messages_pb2.StopReason.ValueType] = {
    "stop": messages_pb2.STOP_REASON_STOP,
    "length": messages_pb2.STOP_REASON_LENGTH,
    "tool_calls": messages_pb2.STOP_REASON_TOOL_USE,
    "function_call": messages_pb2.STOP_REASON_TOOL_USE,
    "content_filter": messages_pb2.STOP_REASON_STOP,
}


def _client(
    client: openai.AsyncOpenAI | None,
    base_url: str | None,
    api_key: str | None,
    timeouts: Timeouts,
) -> openai.AsyncOpenAI:
    if client is not None:
        return client
    return openai.AsyncOpenAI(
        api_key=api_key, base_url=base_url, max_retries=0, timeout=timeouts.sdk(openai.Timeout)
    )


def _image_url(block: messages_pb2.ContentBlock) -> str:
    return f"data:{block.image.mime_type};base64,{block.image.data}"


def _errors(timeouts: Timeouts) -> contextlib.AbstractContextManager[None]:
    """The SDK's errors, and its HTTP library's, as :class:`ModelError` s."""
    return provider_errors(
        api_error=openai.APIError, connection_error=openai.APIConnectionError, timeouts=timeouts
    )


async def _events(create: Any, timeouts: Timeouts, **params: Any) -> AsyncIterator[Any]:
    """The SDK's stream of ``create(**params, stream=True)`` within ``timeouts``, closed
    however it ends; SDK errors, transport faults and malformed chunks as ModelError."""
    with _errors(timeouts):
        stream = await create(**params, stream=True, timeout=timeouts.sdk(openai.Timeout))
    try:
        with _errors(timeouts):
            async for event in stream:
                yield event
    finally:
        await stream.close()


class _OpenAIModel:
    """What both OpenAI APIs' models are made of: the model name, the SDK client, the system
    text, the answer's token limit, the provider named on their messages, more parameters."""

    def __init__(
        self,
        model: str,
        *,
        client: openai.AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        provider: str = "openai",
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = READ_TIMEOUT_SECONDS,
        **options: Any,
    ) -> None:
        self.model = model
        self.timeouts = Timeouts(connect_timeout, read_timeout)
        self.client = _client(client, base_url, api_key, self.timeouts)
        self.system = system
        self.max_tokens = max_tokens
        self.provider = provider
        self.options = options


class OpenAIChatModel(_OpenAIModel):
    """A model answering through Chat Completions (see the module doc).

    ``client``: an ``openai.AsyncOpenAI`` of your own (then ``base_url`` and ``api_key`` are
    unused; give it ``max_retries=0``). ``system``: the system message. ``max_tokens``: the
    answer's limit (``max_completion_tokens``; None: the server's default).
    ``connect_timeout``: seconds to connect to the provider; ``read_timeout``: seconds of
    silence in its answer before the attempt counts as failed (a retryable fault); both go with
    every request, a client of your own too. ``options``: more request parameters, as the SDK
    takes them (``temperature=0.2``, ...).
    """

    api = "openai-chat-completions"

    def messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The request's transcript as Chat Completions messages."""
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        for message in context(request):
            kind = message.WhichOneof("message")
            if kind == "user":
                blocks = message.user.content
                if any(b.WhichOneof("block") == "image" for b in blocks):
                    parts: list[dict[str, Any]] = []
                    for b in blocks:
                        if b.WhichOneof("block") == "text":
                            parts.append({"type": "text", "text": b.text.text})
                        elif b.WhichOneof("block") == "image":
                            parts.append({"type": "image_url", "image_url": {"url": _image_url(b)}})
                    out.append({"role": "user", "content": parts})
                else:
                    out.append({"role": "user", "content": text_of(blocks)})
            elif kind == "assistant":
                entry: dict[str, Any] = {"role": "assistant", "content": None}
                text = text_of(message.assistant.content)
                if text:
                    entry["content"] = text
                calls = [
                    {
                        "id": b.tool_call.id,
                        "type": "function",
                        "function": {
                            "name": b.tool_call.name,
                            "arguments": b.tool_call.arguments_json,
                        },
                    }
                    for b in message.assistant.content
                    if b.WhichOneof("block") == "tool_call"
                ]
                if calls:
                    entry["tool_calls"] = calls
                elif entry["content"] is None:
                    entry["content"] = ""
                out.append(entry)
            elif kind == "tool_result":
                result = message.tool_result
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": result.tool_call_id,
                        "content": text_of(result.content)
                        or ("(error)" if result.is_error else ""),
                    }
                )
        return out

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The request body (without ``stream``), as the SDK takes it."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages(request),
            "stream_options": {"include_usage": True},
            **self.options,
        }
        tools = tool_specs(request)
        if tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        if self.max_tokens is not None:
            params["max_completion_tokens"] = self.max_tokens
        return params

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        """Ask the model, streaming its answer to ``request.partial``."""
        build = MessageBuilder(
            request.partial, api=self.api, provider=self.provider, model=self.model
        )
        finish: str | None = None
        async for chunk in _events(
            self.client.chat.completions.create, self.timeouts, **self.params(request)
        ):
            if chunk.id and not build.message.HasField("response_id"):
                build.message.response_id = chunk.id
            if chunk.model and not build.message.HasField("response_model"):
                build.message.response_model = chunk.model
            if chunk.usage is not None:
                cached = 0
                details = chunk.usage.prompt_tokens_details
                if details is not None and details.cached_tokens:
                    cached = details.cached_tokens
                build.message.usage.CopyFrom(
                    usage(
                        chunk.usage.prompt_tokens - cached,
                        chunk.usage.completion_tokens,
                        cache_read=cached,
                    )
                )
            for choice in chunk.choices:
                if choice.index != 0:
                    continue
                delta = choice.delta
                reasoning = getattr(delta, "reasoning_content", None) or getattr(
                    delta, "reasoning", None
                )
                if isinstance(reasoning, str) and reasoning:
                    build.thinking("thinking", reasoning)
                if delta.content:
                    build.text("text", delta.content)
                for call in delta.tool_calls or ():
                    function = call.function
                    build.tool_call(
                        ("tool", call.index),
                        call_id=call.id or "",
                        name=(function.name if function is not None else None) or "",
                        arguments=(function.arguments if function is not None else None) or "",
                    )
                if choice.finish_reason:
                    finish = choice.finish_reason
        if finish is None:
            raise stream_error("the stream ended without a finish reason")
        stop = _CHAT_STOPS.get(finish, messages_pb2.STOP_REASON_STOP)
        if stop == messages_pb2.STOP_REASON_STOP and build.has_tool_calls():
            stop = messages_pb2.STOP_REASON_TOOL_USE
        return build.settle(stop, finish)


class OpenAIResponsesModel(_OpenAIModel):
    """A model answering through the Responses API (see the module doc).

    ``client``, ``base_url``, ``api_key``, ``system`` (the ``instructions``), ``options``: as
    for :class:`OpenAIChatModel`. ``max_tokens``: ``max_output_tokens``. ``reasoning_effort``
    (``"low"``, ...): asks a reasoning model for that effort and for a reasoning summary, which
    streams as thinking. Nothing is stored at OpenAI (``store=False``): the lane is the record.
    """

    api = "openai-responses"

    def __init__(
        self,
        model: str,
        *,
        reasoning_effort: str | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(model, **settings)
        self.reasoning_effort = reasoning_effort

    def input(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The request's transcript as Responses input items."""
        out: list[dict[str, Any]] = []
        for message in context(request):
            kind = message.WhichOneof("message")
            if kind == "user":
                parts: list[dict[str, Any]] = []
                for b in message.user.content:
                    if b.WhichOneof("block") == "text":
                        parts.append({"type": "input_text", "text": b.text.text})
                    elif b.WhichOneof("block") == "image":
                        parts.append({"type": "input_image", "image_url": _image_url(b)})
                out.append({"role": "user", "content": parts})
            elif kind == "assistant":
                for b in message.assistant.content:
                    block = b.WhichOneof("block")
                    if block == "text" and b.text.text:
                        out.append({"role": "assistant", "content": b.text.text})
                    elif block == "tool_call":
                        out.append(
                            {
                                "type": "function_call",
                                "call_id": b.tool_call.id,
                                "name": b.tool_call.name,
                                "arguments": b.tool_call.arguments_json,
                            }
                        )
            elif kind == "tool_result":
                result = message.tool_result
                out.append(
                    {
                        "type": "function_call_output",
                        "call_id": result.tool_call_id,
                        "output": text_of(result.content) or ("(error)" if result.is_error else ""),
                    }
                )
        return out

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The request body (without ``stream``), as the SDK takes it."""
        params: dict[str, Any] = {
            "model": self.model,
            "input": self.input(request),
            "store": False,
            **self.options,
        }
        if self.system:
            params["instructions"] = self.system
        tools = tool_specs(request)
        if tools:
            params["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in tools
            ]
        if self.max_tokens is not None:
            params["max_output_tokens"] = self.max_tokens
        if self.reasoning_effort is not None:
            params["reasoning"] = {"effort": self.reasoning_effort, "summary": "auto"}
        return params

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        """Ask the model, streaming its answer to ``request.partial``."""
        build = MessageBuilder(
            request.partial, api=self.api, provider=self.provider, model=self.model
        )
        final: Any = None
        async for event in _events(
            self.client.responses.create, self.timeouts, **self.params(request)
        ):
            kind = event.type
            if kind == "response.created":
                build.message.response_id = event.response.id
                build.message.response_model = event.response.model
            elif kind == "response.output_item.added":
                item = event.item
                if item.type == "function_call":
                    build.tool_call(
                        ("item", event.output_index),
                        call_id=item.call_id,
                        name=item.name,
                        arguments=item.arguments or "",
                    )
            elif kind == "response.output_text.delta":
                build.text(("text", event.output_index, event.content_index), event.delta)
            elif kind == "response.reasoning_summary_text.delta":
                build.thinking(("summary", event.output_index, event.summary_index), event.delta)
            elif kind == "response.reasoning_text.delta":
                build.thinking(("reasoning", event.output_index, event.content_index), event.delta)
            elif kind == "response.function_call_arguments.delta":
                build.tool_call(("item", event.output_index), arguments=event.delta)
            elif kind == "response.function_call_arguments.done":
                build.set_arguments(("item", event.output_index), event.arguments)
            elif kind == "response.output_text.done":
                build.finish_block(("text", event.output_index, event.content_index))
            elif kind == "response.output_item.done":
                if event.item.type == "function_call":
                    build.set_arguments(("item", event.output_index), event.item.arguments)
                    build.finish_block(("item", event.output_index))
            elif kind in ("response.completed", "response.incomplete"):
                final = event.response
            elif kind == "response.failed":
                error = event.response.error
                if error is None:
                    raise stream_error("the response failed", "failed")
                raise stream_error(error.message, error.code)
            elif kind == "error":
                raise stream_error(event.message, event.code or "error")
        if final is None:
            raise stream_error("the stream ended without a final response")
        if final.usage is not None:
            cached = 0
            details = final.usage.input_tokens_details
            if details is not None and details.cached_tokens:
                cached = details.cached_tokens
            build.message.usage.CopyFrom(
                usage(
                    final.usage.input_tokens - cached, final.usage.output_tokens, cache_read=cached
                )
            )
        if final.status == "incomplete":
            reason = final.incomplete_details.reason if final.incomplete_details else None
            if reason == "max_output_tokens":
                return build.settle(messages_pb2.STOP_REASON_LENGTH, reason)
            return build.settle(messages_pb2.STOP_REASON_STOP, reason or "incomplete")
        if build.has_tool_calls():
            return build.settle(messages_pb2.STOP_REASON_TOOL_USE, final.status)
        return build.settle(messages_pb2.STOP_REASON_STOP, final.status)
