"""The OpenAI Responses adapter, through the official SDK, against a local server speaking the
Responses streaming events; the driver commits to the real service."""

from __future__ import annotations

import asyncio

import pytest
from lane.client.driver import Driver
from lane.client.models.openai import OpenAIResponsesModel
from lane.v1 import messages_pb2, snapshot_pb2

from tests.driver.support import Recorder, by_call, returns, snapshot, text_of, tool
from tests.integration.lanes import new_lane_id
from tests.models import wire as w
from tests.models.fake_provider import FakeProvider, Gate, Reply
from tests.models.support import (
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
PATH = "/v1/responses"


def responses_model(provider: FakeProvider) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(
        "gpt-test",
        base_url=f"{provider.url}/v1",
        api_key="test-key",
        system="Be brief.",
        reasoning_effort="low",
    )


def reasoning_text_and_call(gate: Gate) -> Reply:
    """Reasoning summary, a text part, a function call whose arguments come in pieces."""
    ev = w.ResponsesStream()
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress"}
    call = w.function_call_item("fc_1", "call_r", "read_file")
    done_call = {**call, "arguments": '{"path": "README.md"}', "status": "completed"}
    done_message = {
        **message,
        "status": "completed",
        "content": [{"type": "output_text", "text": "Reading it.", "annotations": []}],
    }
    done_reasoning = {
        **reasoning,
        "summary": [{"type": "summary_text", "text": "Need the README."}],
    }
    output = [done_reasoning, done_message, done_call]
    return Reply(
        stream=[
            ev("response.created", response=w.response_object("in_progress", [])),
            ev("response.in_progress", response=w.response_object("in_progress", [])),
            ev("response.output_item.added", output_index=0, item=reasoning),
            ev(
                "response.reasoning_summary_part.added",
                item_id="rs_1",
                output_index=0,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            ),
            ev(
                "response.reasoning_summary_text.delta",
                item_id="rs_1",
                output_index=0,
                summary_index=0,
                delta="Need the ",
            ),
            ev(
                "response.reasoning_summary_text.delta",
                item_id="rs_1",
                output_index=0,
                summary_index=0,
                delta="README.",
            ),
            ev("response.output_item.done", output_index=0, item=done_reasoning),
            ev("response.output_item.added", output_index=1, item={**message, "content": []}),
            *w.text_part(ev, "msg_1", 1, "Reading it."),
            ev("response.output_item.done", output_index=1, item=done_message),
            ev("response.output_item.added", output_index=2, item=call),
            ev(
                "response.function_call_arguments.delta",
                item_id="fc_1",
                output_index=2,
                delta='{"path": "READ',
            ),
            gate,
            ev(
                "response.function_call_arguments.delta",
                item_id="fc_1",
                output_index=2,
                delta='ME.md"}',
            ),
            ev(
                "response.function_call_arguments.done",
                item_id="fc_1",
                output_index=2,
                arguments='{"path": "README.md"}',
            ),
            ev("response.output_item.done", output_index=2, item=done_call),
            ev(
                "response.completed",
                response=w.response_object(
                    "completed",
                    output,
                    usage=w.responses_usage(300, 40, cached=100, reasoning=12),
                ),
            ),
        ]
    )


async def test_reasoning_text_and_a_function_call_stream_into_the_lane_and_settle(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-resp")
    watcher = await Watcher(lane_stub, lane).start()
    gate = Gate()
    provider.queue(PATH, reasoning_text_and_call(gate), w.responses_text_reply("It is a README."))
    recorder = Recorder()
    tools = [tool("read_file", returns("# lane"), recorder=recorder)]
    run = asyncio.create_task(
        Driver(lane_stub, lane, tools).run("Read it.", responses_model(provider))
    )
    await watcher.streamed_at(
        gate,
        lambda m: (
            len(m.content) == 3
            and m.content[0].thinking.thinking == "Need the README."
            and m.content[2].tool_call.arguments_json == '{"path": "READ'
        ),
        "the thinking, the text and half the arguments",
    )
    gate.open()
    result = await run
    assert result.status == COMPLETED
    await watcher.finish()
    first, second = assistant_messages(watcher.snapshot)
    expected = messages_pb2.AssistantMessage(
        content=[
            thinking_block("Need the README."),
            text_block("Reading it."),
            call_block("call_r", "read_file", '{"path": "README.md"}'),
        ],
        api="openai-responses",
        provider="openai",
        model="gpt-test",
        response_model=w.RESPONSES_MODEL,
        response_id=w.RESPONSE_ID,
        usage=messages_pb2.Usage(input=200, output=40, cache_read=100, total_tokens=340),
        stop_reason=messages_pb2.STOP_REASON_TOOL_USE,
        raw_stop_reason="completed",
    )
    assert without_time(first) == expected
    check_partials(watcher.streams()[0], first)
    assert second.content[0].text.text == "It is a README."
    assert text_of(by_call(watcher.snapshot)["call_r"]) == "# lane"
    assert recorder.executions == {"read_file": 1}

    body = provider.bodies(PATH)[1]
    assert body["stream"] is True and body["store"] is False
    assert body["instructions"] == "Be brief."
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Read it."}]},
        {"role": "assistant", "content": "Reading it."},
        {
            "type": "function_call",
            "call_id": "call_r",
            "name": "read_file",
            "arguments": '{"path": "README.md"}',
        },
        {"type": "function_call_output", "call_id": "call_r", "output": "# lane"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "read_file",
            "description": "",
            "parameters": {"type": "object"},
            "strict": False,
        }
    ]


async def test_an_incomplete_response_for_max_output_tokens_settles_as_length(
    lane_stub, provider: FakeProvider
) -> None:
    lane = new_lane_id("oai-resp-len")
    ev = w.ResponsesStream()
    call = w.function_call_item("fc_2", "call_x", "write_file")
    provider.queue(
        PATH,
        Reply(
            stream=[
                ev("response.created", response=w.response_object("in_progress", [])),
                ev("response.output_item.added", output_index=0, item=call),
                ev(
                    "response.function_call_arguments.delta",
                    item_id="fc_2",
                    output_index=0,
                    delta='{"path": "x", "content": "lo',
                ),
                ev(
                    "response.incomplete",
                    response=w.response_object(
                        "incomplete",
                        [call],
                        incomplete_details={"reason": "max_output_tokens"},
                        usage=w.responses_usage(10, 64),
                    ),
                ),
            ]
        ),
        w.responses_text_reply("Out of room."),
    )
    recorder = Recorder()
    tools = [tool("write_file", returns("written"), recorder=recorder)]
    result = await Driver(lane_stub, lane, tools).run("Write x.", responses_model(provider))
    assert result.status == COMPLETED
    snap = await snapshot(lane_stub, lane)
    cut = assistant_messages(snap)[0]
    assert cut.stop_reason == messages_pb2.STOP_REASON_LENGTH
    assert cut.raw_stop_reason == "max_output_tokens"
    assert cut.content[0].tool_call.arguments_json == '{"path": "x", "content": "lo'
    assert by_call(snap)["call_x"].is_error
    assert recorder.executions == {}
