"""Small fixtures of each provider's streaming wire format, written from the providers'
published API references: Chat Completions chunks (``data:`` lines ending with ``[DONE]``),
Responses events (``event:`` and ``data:`` with a ``type``) and Anthropic Messages events
(``event:`` and ``data:`` with a ``type``)."""

from __future__ import annotations

from typing import Any

from tests.models.fake_provider import Event, Reply

# --- OpenAI Chat Completions ---------------------------------------------------------------

CHAT_ID = "chatcmpl-7"
CHAT_MODEL = "gpt-test-1"


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> Event:
    """One ``chat.completion.chunk`` with one choice."""
    return Event(
        {
            "id": CHAT_ID,
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": CHAT_MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def chat_usage(prompt: int, completion: int, cached: int = 0) -> Event:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
    return Event(
        {
            "id": CHAT_ID,
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": CHAT_MODEL,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )


def chat_tool_start(index: int, call_id: str, name: str, arguments: str = "") -> Event:
    return chat_chunk(
        {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ]
        }
    )


def chat_tool_arguments(index: int, piece: str) -> Event:
    return chat_chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


CHAT_DONE = Event("[DONE]")


def chat_text_reply(text: str, prompt: int = 10, completion: int = 3) -> Reply:
    """A whole streamed answer of ``text``."""
    return Reply(
        stream=[
            chat_chunk({"role": "assistant", "content": ""}),
            chat_chunk({"content": text}),
            chat_chunk({}, "stop"),
            chat_usage(prompt, completion),
            CHAT_DONE,
        ]
    )


# --- OpenAI Responses ----------------------------------------------------------------------

RESPONSE_ID = "resp_42"
RESPONSES_MODEL = "gpt-test-2"


def response_object(status: str, output: list[Any], **extra: Any) -> dict[str, Any]:
    """A ``response`` object as the lifecycle events carry it."""
    return {
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": 1767225600,
        "model": RESPONSES_MODEL,
        "status": status,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        **extra,
    }


class ResponsesStream:
    """Responses events with their running ``sequence_number``."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> Event:
        event = Event({"type": kind, "sequence_number": self.sequence, **fields}, event=kind)
        self.sequence += 1
        return event


def responses_usage(inputs: int, outputs: int, cached: int = 0, reasoning: int = 0) -> Any:
    return {
        "input_tokens": inputs,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": outputs,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": inputs + outputs,
    }


def text_part(ev: ResponsesStream, item_id: str, output_index: int, text: str) -> list[Event]:
    """The events of an output_text part of message ``item_id`` streamed in one delta: added,
    the delta, done."""
    where = {"item_id": item_id, "output_index": output_index, "content_index": 0}
    return [
        ev(
            "response.content_part.added",
            **where,
            part={"type": "output_text", "text": "", "annotations": []},
        ),
        ev("response.output_text.delta", **where, delta=text, logprobs=[]),
        ev("response.output_text.done", **where, text=text, logprobs=[]),
    ]


def function_call_item(item_id: str, call_id: str, name: str) -> dict[str, Any]:
    """A ``function_call`` output item as it is added: no arguments yet."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": "",
        "status": "in_progress",
    }


def responses_text_reply(text: str) -> Reply:
    """A whole streamed answer of ``text``."""
    ev = ResponsesStream()
    item = {"type": "message", "id": "msg_9", "role": "assistant", "status": "in_progress"}
    done_item = {
        **item,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return Reply(
        stream=[
            ev("response.created", response=response_object("in_progress", [])),
            ev("response.output_item.added", output_index=0, item={**item, "content": []}),
            *text_part(ev, "msg_9", 0, text),
            ev("response.output_item.done", output_index=0, item=done_item),
            ev(
                "response.completed",
                response=response_object("completed", [done_item], usage=responses_usage(20, 4)),
            ),
        ]
    )


# --- Anthropic Messages --------------------------------------------------------------------

MESSAGE_ID = "msg_01"
ANTHROPIC_MODEL = "claude-test-1"


def anthropic_event(kind: str, **fields: Any) -> Event:
    return Event({"type": kind, **fields}, event=kind)


def message_start(inputs: int, cache_read: int = 0, cache_write: int = 0) -> Event:
    return anthropic_event(
        "message_start",
        message={
            "id": MESSAGE_ID,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": ANTHROPIC_MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": inputs,
                "output_tokens": 1,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_write,
            },
        },
    )


def block_start(index: int, block: dict[str, Any]) -> Event:
    return anthropic_event("content_block_start", index=index, content_block=block)


def block_delta(index: int, delta: dict[str, Any]) -> Event:
    return anthropic_event("content_block_delta", index=index, delta=delta)


def block_stop(index: int) -> Event:
    return anthropic_event("content_block_stop", index=index)


def message_delta(stop_reason: str, output_tokens: int) -> Event:
    return anthropic_event(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage={"output_tokens": output_tokens},
    )


MESSAGE_STOP = anthropic_event("message_stop")
PING = anthropic_event("ping")


def text_opened(text: str, inputs: int = 12) -> list[Event]:
    """A message's start and the first delta of its text block, ``text``."""
    return [
        message_start(inputs),
        block_start(0, {"type": "text", "text": ""}),
        block_delta(0, {"type": "text_delta", "text": text}),
    ]


def anthropic_text_reply(text: str) -> Reply:
    """A whole streamed answer of ``text``."""
    return Reply(
        stream=[
            *text_opened(text, inputs=30),
            block_stop(0),
            message_delta("end_turn", 5),
            MESSAGE_STOP,
        ]
    )
