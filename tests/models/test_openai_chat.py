"""The OpenAI Chat Completions adapter, through the official SDK, against a local server
speaking the wire format; the driver commits to the real service. What the lane holds and what
a watcher saw: partials committed while the provider streams, in order; the settled message as
the provider sent it; fold == capture."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from lane.client.driver import Driver
from lane.client.models.openai import OpenAIChatModel
from lane.v1 import messages_pb2, snapshot_pb2

from tests.driver.support import Recorder, by_call, returns, text_of, tool
from tests.integration.lanes import new_lane_id
from tests.models import wire as w
from tests.models.fake_provider import FakeProvider, Gate, Reply
from tests.models.support import (
    QUICK_RETRY,
    Watcher,
    assistant_messages,
    call_block,
    check_partials,
    text_block,
    without_time,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
PATH = "/v1/chat/completions"

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}
SHELL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


def chat_model(provider: FakeProvider) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-test", base_url=f"{provider.url}/v1", api_key="test-key", system="Be brief."
    )


async def test_a_streamed_answer_is_committed_as_it_grows_and_settles_as_the_provider_sent_it(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-chat")
    watcher = await Watcher(lane_stub, lane).start()
    text_done, args_half = Gate(), Gate()
    provider.queue(
        PATH,
        Reply(
            stream=[
                w.chat_chunk({"role": "assistant", "content": ""}),
                w.chat_chunk({"content": "Let me "}),
                w.chat_chunk({"content": "look."}),
                text_done,
                w.chat_tool_start(0, "call_a", "read_file"),
                w.chat_tool_arguments(0, '{"pa'),
                w.chat_tool_arguments(0, 'th": "no'),
                args_half,
                w.chat_tool_arguments(0, 'tes.txt"}'),
                w.chat_tool_start(1, "call_b", "shell", '{"command"'),
                w.chat_tool_arguments(1, ': "echo hi"}'),
                w.chat_chunk({}, "tool_calls"),
                w.chat_usage(120, 30, cached=20),
                w.CHAT_DONE,
            ]
        ),
        w.chat_text_reply("The notes say hi.", prompt=200, completion=6),
    )
    recorder = Recorder()
    tools = [
        tool("read_file", returns("the notes"), recorder=recorder, parameters=READ_SCHEMA),
        tool("shell", returns("hi"), recorder=recorder, parameters=SHELL_SCHEMA),
    ]
    driver = Driver(lane_stub, lane, tools)
    run = asyncio.create_task(driver.run("Read the notes.", chat_model(provider)))

    # The provider waits mid-answer: the lane already holds the text so far.
    await watcher.streamed_at(
        text_done,
        lambda m: [b.text.text for b in m.content] == ["Let me look."],
        "the text streamed so far",
    )
    text_done.open()
    await watcher.streamed_at(
        args_half,
        lambda m: len(m.content) == 2 and m.content[1].tool_call.arguments_json == '{"path": "no',
        "half the tool call's arguments",
    )
    args_half.open()
    result = await run
    assert result.status == COMPLETED and result.turns == 2
    await watcher.finish()

    snap = watcher.snapshot
    first, second = assistant_messages(snap)
    expected = messages_pb2.AssistantMessage(
        content=[
            text_block("Let me look."),
            call_block("call_a", "read_file", '{"path": "notes.txt"}'),
            call_block("call_b", "shell", '{"command": "echo hi"}'),
        ],
        api="openai-chat-completions",
        provider="openai",
        model="gpt-test",
        response_model=w.CHAT_MODEL,
        response_id=w.CHAT_ID,
        usage=messages_pb2.Usage(input=100, output=30, cache_read=20, total_tokens=150),
        stop_reason=messages_pb2.STOP_REASON_TOOL_USE,
        raw_stop_reason="tool_calls",
    )
    assert without_time(first) == expected
    assert [b.text.text for b in second.content] == ["The notes say hi."]
    assert second.stop_reason == messages_pb2.STOP_REASON_STOP
    assert second.usage.input == 200 and second.usage.output == 6
    results = by_call(snap)
    assert text_of(results["call_a"]) == "the notes" and text_of(results["call_b"]) == "hi"
    assert recorder.executions == {"read_file": 1, "shell": 1}

    # Partials: in order, each growing into the next and into the settled message.
    first_turn = watcher.streams()[0]
    check_partials(first_turn, first)
    # A finished block is committed in its finished form: the text alone, complete.
    assert any([b.text.text for b in p.content] == ["Let me look."] for p in first_turn)

    # The second request carries the transcript in the API's shape, and the tools' schemas.
    body = provider.bodies(PATH)[1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Read the notes."},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "echo hi"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "the notes"},
        {"role": "tool", "tool_call_id": "call_b", "content": "hi"},
    ]
    assert [t["function"]["name"] for t in body["tools"]] == ["read_file", "shell"]
    assert body["tools"][0]["function"]["parameters"] == READ_SCHEMA
    assert body["tools"][1] == {
        "type": "function",
        "function": {"name": "shell", "description": "", "parameters": SHELL_SCHEMA},
    }


async def test_a_length_stop_settles_as_length_and_its_calls_get_the_truncated_result(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-trunc")
    watcher = await Watcher(lane_stub, lane).start()
    provider.queue(
        PATH,
        Reply(
            stream=[
                w.chat_chunk({"role": "assistant", "content": "Writing it."}),
                w.chat_tool_start(0, "call_w", "write_file", '{"path": "a.txt", '),
                w.chat_tool_arguments(0, '"content": "abc'),
                w.chat_chunk({}, "length"),
                w.chat_usage(50, 4096),
                w.CHAT_DONE,
            ]
        ),
        w.chat_text_reply("I ran out of room."),
    )
    recorder = Recorder()
    tools = [tool("write_file", returns("written"), recorder=recorder)]
    result = await Driver(lane_stub, lane, tools).run("Write a.txt.", chat_model(provider))
    assert result.status == COMPLETED
    await watcher.finish()
    snap = watcher.snapshot
    cut = assistant_messages(snap)[0]
    assert cut.stop_reason == messages_pb2.STOP_REASON_LENGTH and cut.raw_stop_reason == "length"
    # The arguments stay as streamed, cut mid-way: not JSON.
    assert cut.content[1].tool_call.arguments_json == '{"path": "a.txt", "content": "abc'
    truncated = by_call(snap)["call_w"]
    assert truncated.is_error and "reached its output token limit" in text_of(truncated)
    assert recorder.executions == {}  # never ran
    check_partials(watcher.streams()[0], cut)
    # The model is told: its cut call and the result, as the API takes them.
    messages = provider.bodies(PATH)[1]["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["arguments"] == (
        '{"path": "a.txt", "content": "abc'
    )
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == "call_w"


async def test_a_429_with_retry_after_is_retried_through_the_lane_after_that_delay(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-429")
    watcher = await Watcher(lane_stub, lane).start()
    provider.queue(
        PATH,
        Reply(
            status=429,
            headers={"retry-after": "1"},
            body={
                "error": {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            },
        ),
        w.chat_text_reply("Answered on the second attempt."),
    )
    result = await Driver(lane_stub, lane).run("Hello?", chat_model(provider))
    assert result.status == COMPLETED
    await watcher.finish()
    events = watcher.events()
    kinds = [e.WhichOneof("kind") for e in events]
    assert kinds.index("retry_scheduled") < kinds.index("retry_start") < kinds.index("retry_end")
    scheduled = next(e.retry_scheduled for e in events if e.HasField("retry_scheduled"))
    assert scheduled.delay_ms == 1000  # the provider's retry-after, not the backoff
    assert scheduled.attempt == 2 and scheduled.error_message == "Rate limit reached for requests"
    ended = next(e.retry_end for e in events if e.HasField("retry_end"))
    assert ended.success and ended.attempt == 2
    (answer,) = assistant_messages(watcher.snapshot)
    assert answer.content[0].text.text == "Answered on the second attempt."
    assert len(provider.bodies(PATH)) == 2


async def test_server_errors_past_the_retries_fail_the_run_with_the_provider_message(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-500")
    watcher = await Watcher(lane_stub, lane).start()
    error = Reply(
        status=500, body={"error": {"message": "The server had an error", "type": "server_error"}}
    )
    provider.queue(PATH, error, error, error)
    driver = Driver(lane_stub, lane, model_retry=QUICK_RETRY)
    result = await driver.run("Hello?", chat_model(provider))
    assert result.status == FAILED
    assert result.result.error.code == "model_error"
    assert result.result.error.message == "The server had an error (gave up after 3 attempts)"
    assert len(provider.bodies(PATH)) == 3  # the first attempt and QUICK_RETRY's 2 retries
    await watcher.finish()
    kinds = [e.WhichOneof("kind") for e in watcher.events()]
    assert kinds.count("retry_scheduled") == 2 and kinds.count("retry_start") == 2


async def test_a_refused_request_fails_the_run_at_once_with_the_provider_message(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-400")
    provider.queue(
        PATH,
        Reply(
            status=400,
            body={
                "error": {
                    "message": "The model `gpt-test` does not exist",
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                }
            },
        ),
    )
    result = await Driver(lane_stub, lane).run("Hello?", chat_model(provider))
    assert result.status == FAILED
    assert result.result.error.message == "The model `gpt-test` does not exist"
    assert len(provider.bodies(PATH)) == 1  # not retried
    assert json.dumps(provider.bodies(PATH)[0]["messages"][-1]) == json.dumps(
        {"role": "user", "content": "Hello?"}
    )
