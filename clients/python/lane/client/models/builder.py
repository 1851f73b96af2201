"""Building an :class:`~lane.v1.AssistantMessage` from a provider's stream of deltas.

Every adapter feeds its provider's events into a :class:`MessageBuilder`: blocks are opened by
a key of the adapter's choosing (the provider's block index, output item, ...), grown by
deltas, and finished. The builder reports the message after every change to the request's
:class:`~lane.client.model.PartialSink`, with ``block_complete=True`` when a block finished —
explicitly (:meth:`MessageBuilder.finish_block`), or because another block started after it
(Chat Completions says no more). Tool-call arguments stay text, byte for byte as streamed.
"""

from __future__ import annotations

import json
from collections.abc import Hashable

from lane.client.model import ModelError, PartialSink
from lane.v1 import messages_pb2

__all__ = ["MessageBuilder", "usage"]


def usage(
    input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0
) -> messages_pb2.Usage:
    """A Usage whose ``input`` excludes the cached tokens, as the lane counts them."""
    return messages_pb2.Usage(
        input=input_tokens,
        output=output_tokens,
        cache_read=cache_read,
        cache_write=cache_write,
        total_tokens=input_tokens + output_tokens + cache_read + cache_write,
    )


class MessageBuilder:
    """An assistant message growing delta by delta (see the module doc)."""

    def __init__(self, sink: PartialSink, *, api: str, provider: str, model: str) -> None:
        self._sink = sink
        self.message = messages_pb2.AssistantMessage(api=api, provider=provider, model=model)
        self.message.timestamp.GetCurrentTime()
        self._index: dict[Hashable, int] = {}
        self._open: Hashable | None = None
        self._finished: set[Hashable] = set()

    # -- blocks --------------------------------------------------------------------------

    def _block(self, key: Hashable, make: messages_pb2.ContentBlock) -> messages_pb2.ContentBlock:
        index = self._index.get(key)
        if index is None:
            if self._open is not None and self._open not in self._finished:
                self.finish_block(self._open)
            self.message.content.append(make)
            index = self._index[key] = len(self.message.content) - 1
        self._open = key
        return self.message.content[index]

    def has(self, key: Hashable) -> bool:
        """Whether a block was opened under ``key``."""
        return key in self._index

    def text(self, key: Hashable, delta: str) -> None:
        """Append ``delta`` to the text block ``key`` (opened by its first delta)."""
        block = self._block(key, messages_pb2.ContentBlock(text=messages_pb2.TextContent()))
        block.text.text += delta
        self._report()

    def thinking(self, key: Hashable, delta: str = "", *, signature: str | None = None) -> None:
        """Append ``delta`` (and a signature piece) to the thinking block ``key``."""
        block = self._block(key, messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent()))
        block.thinking.thinking += delta
        if signature:
            block.thinking.thinking_signature = block.thinking.thinking_signature + signature
        self._report()

    def redacted_thinking(self, key: Hashable, data: str) -> None:
        """A redacted thinking block: the provider's opaque ``data`` kept as its signature."""
        block = self._block(
            key, messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent(redacted=True))
        )
        block.thinking.thinking_signature = data
        self._report()

    def tool_call(
        self, key: Hashable, *, call_id: str = "", name: str = "", arguments: str = ""
    ) -> None:
        """Open or grow the tool-call block ``key``: set its id and name when given, append
        ``arguments`` (a piece of the JSON text)."""
        block = self._block(
            key, messages_pb2.ContentBlock(tool_call=messages_pb2.ToolCallContent())
        )
        if call_id:
            block.tool_call.id = call_id
        if name:
            block.tool_call.name = block.tool_call.name or name
        block.tool_call.arguments_json += arguments
        self._report()

    def set_arguments(self, key: Hashable, arguments: str) -> None:
        """The tool call ``key``'s complete arguments, as the provider finally states them."""
        if key in self._index:
            self.message.content[self._index[key]].tool_call.arguments_json = arguments

    def finish_block(self, key: Hashable) -> None:
        """The block ``key`` is complete: report the message with ``block_complete``."""
        if key not in self._index or key in self._finished:
            return
        self._finished.add(key)
        self._sink(self.message, block_complete=True)

    def _report(self) -> None:
        self._sink(self.message)

    # -- the end ---------------------------------------------------------------------------

    def has_tool_calls(self) -> bool:
        """Whether the message asks for a tool."""
        return any(b.WhichOneof("block") == "tool_call" for b in self.message.content)

    def settle(
        self,
        stop_reason: messages_pb2.StopReason.ValueType,
        raw_stop_reason: str | None = None,
    ) -> messages_pb2.AssistantMessage:
        """The final message: the stop reason set, tool calls checked (a call without
        arguments gets ``{}``; arguments that are not a JSON object, in a message not cut off
        for length, raise a :class:`ModelError`, since the lane refuses them)."""
        for key in list(self._index):
            self.finish_block(key)
        message = self.message
        message.stop_reason = stop_reason
        if raw_stop_reason is not None:
            message.raw_stop_reason = raw_stop_reason
        for block in message.content:
            if block.WhichOneof("block") != "tool_call":
                continue
            call = block.tool_call
            if not call.arguments_json.strip():
                call.arguments_json = "{}"
            if stop_reason == messages_pb2.STOP_REASON_LENGTH:
                continue
            try:
                parsed = json.loads(call.arguments_json)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ModelError(
                    f"the model called {call.name} with arguments that are not a JSON object: "
                    f"{call.arguments_json[:200]}",
                    code="invalid_tool_arguments",
                )
        return message
