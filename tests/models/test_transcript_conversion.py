"""A transcript with a compaction, a failed response and an application message, as each
adapter writes it into its provider's request (what the adapters send is checked end to end in
the other tests; this one covers the entries a run rarely makes)."""

from __future__ import annotations

from lane.client.model import ModelRequest
from lane.client.models.anthropic import AnthropicModel
from lane.client.models.openai import OpenAIChatModel, OpenAIResponsesModel
from lane.client.models.transcript import SUMMARY_PREFIX
from lane.v1 import entries_pb2, messages_pb2

from tests.models.support import call_block, text_block, thinking_block

SUMMARY = "The user asked for a fix; tests pass."


def message_entry(message: messages_pb2.AgentMessage) -> entries_pb2.Entry:
    entry = entries_pb2.Entry()
    entry.message.message.CopyFrom(message)
    return entry


def user(text: str) -> messages_pb2.AgentMessage:
    return messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text_block(text)]))


def request() -> ModelRequest:
    compaction = entries_pb2.Entry()
    compaction.compaction.summary = SUMMARY
    compaction.compaction.retained_tail.append(user("Keep going."))
    failed = messages_pb2.AgentMessage(
        assistant=messages_pb2.AssistantMessage(stop_reason=messages_pb2.STOP_REASON_ERROR)
    )
    assistant = messages_pb2.AgentMessage(
        assistant=messages_pb2.AssistantMessage(
            content=[
                thinking_block("unsigned, from another provider"),
                text_block("Checking."),
                call_block("c1", "shell", '{"command": "make test"}'),
            ],
            stop_reason=messages_pb2.STOP_REASON_TOOL_USE,
        )
    )
    result = messages_pb2.AgentMessage(
        tool_result=messages_pb2.ToolResultMessage(
            tool_call_id="c1", tool_name="shell", content=[text_block("FAIL")], is_error=True
        )
    )
    custom = messages_pb2.AgentMessage(custom=messages_pb2.CustomMessage(role="note"))
    entries = (
        compaction,
        message_entry(failed),
        message_entry(assistant),
        message_entry(result),
        message_entry(custom),
        message_entry(user("Why?")),
    )
    messages = tuple(e.message.message for e in entries if e.WhichOneof("payload") == "message")
    return ModelRequest("lane", "op", "turn", messages, (), entries=entries)


def test_chat_completions_request() -> None:
    model = OpenAIChatModel("m", api_key="k")
    assert model.messages(request()) == [
        {"role": "user", "content": SUMMARY_PREFIX + SUMMARY},
        {"role": "user", "content": "Keep going."},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "make test"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "FAIL"},
        {"role": "user", "content": "Why?"},
    ]


def test_responses_request() -> None:
    model = OpenAIResponsesModel("m", api_key="k")
    assert model.input(request()) == [
        {"role": "user", "content": [{"type": "input_text", "text": SUMMARY_PREFIX + SUMMARY}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Keep going."}]},
        {"role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "shell",
            "arguments": '{"command": "make test"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "FAIL"},
        {"role": "user", "content": [{"type": "input_text", "text": "Why?"}]},
    ]


def test_messages_request_merges_turns_and_drops_unsigned_thinking() -> None:
    model = AnthropicModel("m", api_key="k")
    assert model.messages(request()) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SUMMARY_PREFIX + SUMMARY},
                {"type": "text", "text": "Keep going."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "c1",
                    "name": "shell",
                    "input": {"command": "make test"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c1",
                    "content": [{"type": "text", "text": "FAIL"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Why?"},
            ],
        },
    ]
