"""The Anthropic Messages adapter, through the official SDK, against a local server speaking
the Messages streaming events; the driver commits to the real service."""

from __future__ import annotations

import asyncio

import pytest
from lane.client.driver import Driver
from lane.client.models.anthropic import AnthropicModel
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
    thinking_block,
    without_time,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
PATH = "/v1/messages"


def claude(provider: FakeProvider) -> AnthropicModel:
    return AnthropicModel(
        "claude-test",
        base_url=provider.url,
        api_key="test-key",
        system="Be brief.",
        max_tokens=1024,
        thinking_budget=512,
    )


def thinking_text_and_tool(gate: Gate) -> Reply:
    return Reply(
        stream=[
            w.message_start(40, cache_read=10, cache_write=5),
            w.block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            w.block_delta(0, {"type": "thinking_delta", "thinking": "The user wants "}),
            w.block_delta(0, {"type": "thinking_delta", "thinking": "a listing."}),
            w.block_delta(0, {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}),
            w.block_stop(0),
            w.PING,
            w.block_start(1, {"type": "text", "text": ""}),
            w.block_delta(1, {"type": "text_delta", "text": "Listing "}),
            w.block_delta(1, {"type": "text_delta", "text": "the files."}),
            w.block_stop(1),
            w.block_start(2, {"type": "tool_use", "id": "toolu_01", "name": "shell", "input": {}}),
            w.block_delta(2, {"type": "input_json_delta", "partial_json": ""}),
            w.block_delta(2, {"type": "input_json_delta", "partial_json": '{"comm'}),
            gate,
            w.block_delta(2, {"type": "input_json_delta", "partial_json": 'and": "ls"}'}),
            w.block_stop(2),
            w.message_delta("tool_use", 55),
            w.MESSAGE_STOP,
        ]
    )


async def test_thinking_text_and_a_tool_call_stream_into_the_lane_and_settle(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("claude")
    watcher = await Watcher(lane_stub, lane).start()
    gate = Gate()
    provider.queue(PATH, thinking_text_and_tool(gate), w.anthropic_text_reply("Two files."))
    recorder = Recorder()
    tools = [tool("shell", returns("a.txt\nb.txt"), recorder=recorder)]
    run = asyncio.create_task(
        Driver(lane_stub, lane, tools).run("List the files.", claude(provider))
    )
    await watcher.streamed_at(
        gate,
        lambda m: len(m.content) == 3 and m.content[2].tool_call.arguments_json == '{"comm',
        "the thinking, the text and half the input",
    )
    # Thinking finished before the text started: committed with its signature.
    assert watcher.streaming().content[0].thinking.thinking_signature == "c2lnbmF0dXJl"  # type: ignore[union-attr]
    gate.open()
    result = await run
    assert result.status == COMPLETED
    await watcher.finish()
    first, second = assistant_messages(watcher.snapshot)
    expected = messages_pb2.AssistantMessage(
        content=[
            thinking_block("The user wants a listing.", "c2lnbmF0dXJl"),
            text_block("Listing the files."),
            call_block("toolu_01", "shell", '{"command": "ls"}'),
        ],
        api="anthropic-messages",
        provider="anthropic",
        model="claude-test",
        response_model=w.ANTHROPIC_MODEL,
        response_id=w.MESSAGE_ID,
        usage=messages_pb2.Usage(
            input=40, output=55, cache_read=10, cache_write=5, total_tokens=110
        ),
        stop_reason=messages_pb2.STOP_REASON_TOOL_USE,
        raw_stop_reason="tool_use",
    )
    assert without_time(first) == expected
    check_partials(watcher.streams()[0], first)
    # Every block was committed in its finished form while the answer streamed.
    finished = [[b.WhichOneof("block") for b in p.content] for p in watcher.streams()[0]]
    assert ["thinking"] in finished and ["thinking", "text"] in finished
    assert second.content[0].text.text == "Two files."
    assert text_of(by_call(watcher.snapshot)["toolu_01"]) == "a.txt\nb.txt"

    body = provider.bodies(PATH)[1]
    assert body["stream"] is True and body["max_tokens"] == 1024
    assert body["system"] == "Be brief."
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 512}
    assert body["tools"] == [
        {"name": "shell", "description": "", "input_schema": {"type": "object"}}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "The user wants a listing.",
                    "signature": "c2lnbmF0dXJl",
                },
                {"type": "text", "text": "Listing the files."},
                {"type": "tool_use", "id": "toolu_01", "name": "shell", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "a.txt\nb.txt"}],
                }
            ],
        },
    ]


async def test_max_tokens_settles_as_length_and_the_cut_call_never_runs(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("claude-len")
    watcher = await Watcher(lane_stub, lane).start()
    provider.queue(
        PATH,
        Reply(
            stream=[
                w.message_start(12),
                w.block_start(
                    0, {"type": "tool_use", "id": "toolu_9", "name": "shell", "input": {}}
                ),
                w.block_delta(0, {"type": "input_json_delta", "partial_json": '{"command": "ec'}),
                w.message_delta("max_tokens", 1024),
                w.MESSAGE_STOP,
            ]
        ),
        w.anthropic_text_reply("Too long, sorry."),
    )
    recorder = Recorder()
    tools = [tool("shell", returns("ran"), recorder=recorder)]
    result = await Driver(lane_stub, lane, tools).run("Echo.", claude(provider))
    assert result.status == COMPLETED
    await watcher.finish()
    cut = assistant_messages(watcher.snapshot)[0]
    assert (
        cut.stop_reason == messages_pb2.STOP_REASON_LENGTH and cut.raw_stop_reason == "max_tokens"
    )
    assert cut.content[0].tool_call.arguments_json == '{"command": "ec'
    assert by_call(watcher.snapshot)["toolu_9"].is_error and recorder.executions == {}
    # The cut call goes back to the model with input {} (its arguments do not parse).
    assistant = provider.bodies(PATH)[1]["messages"][1]
    assert assistant["content"] == [
        {"type": "tool_use", "id": "toolu_9", "name": "shell", "input": {}}
    ]


async def test_overload_mid_stream_then_529_are_retried_and_the_failed_partial_is_dropped(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("claude-529")
    watcher = await Watcher(lane_stub, lane).start()
    cut_off = Gate()
    provider.queue(
        PATH,
        Reply(
            stream=[
                *w.text_opened("Half an ans"),
                cut_off,
                w.anthropic_event(
                    "error", error={"type": "overloaded_error", "message": "Overloaded"}
                ),
            ]
        ),
        Reply(
            status=529,
            headers={"retry-after": "0"},
            body={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ),
        w.anthropic_text_reply("A whole answer."),
    )
    driver = Driver(lane_stub, lane, model_retry=QUICK_RETRY)
    run = asyncio.create_task(driver.run("Answer.", claude(provider)))
    await watcher.streamed_at(
        cut_off, lambda m: m.content[0].text.text == "Half an ans", "the first attempt's partial"
    )
    cut_off.open()
    result = await run
    assert result.status == COMPLETED
    await watcher.finish()
    (answer,) = assistant_messages(watcher.snapshot)  # the failed attempt left no entry
    assert answer.content[0].text.text == "A whole answer."
    scheduled = [e.retry_scheduled for e in watcher.events() if e.HasField("retry_scheduled")]
    assert [(s.attempt, s.error_message) for s in scheduled] == [
        (2, "Overloaded"),
        (3, "Overloaded"),
    ]
    assert scheduled[1].delay_ms == 0  # the 529's retry-after
    assert len(provider.bodies(PATH)) == 3


async def test_an_abort_while_the_answer_streams_ends_the_run_aborted(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("claude-abort")
    watcher = await Watcher(lane_stub, lane).start()
    never = Gate()
    provider.queue(
        PATH,
        Reply(
            stream=[
                *w.text_opened("I will go on for"),
                never,
                w.block_delta(0, {"type": "text_delta", "text": " ever."}),
            ]
        ),
    )
    driver = Driver(lane_stub, lane)
    run = asyncio.create_task(driver.run("Talk.", claude(provider)))
    await watcher.streamed_at(
        never, lambda m: m.content[0].text.text == "I will go on for", "the partial"
    )
    assert await driver.abort()
    result = await run
    assert result.status == ABORTED
    await watcher.finish()
    assert assistant_messages(watcher.snapshot) == []
    assert not watcher.snapshot.HasField("operation")
    assert watcher.snapshot.last_result.status == ABORTED
