"""The faults real providers show, injected by a local server speaking each provider's wire
format, against each adapter driven through the real service: a stream that stalls (the read
timeout fires), a connection dropped mid-stream and a corrupted chunk are retried through the
lane and the run completes; a Retry-After beyond the driver's cap, a 400 and a 401 fail the run
at once with the provider's message. The provider's request count shows there is no retry
storm: one request per attempt, two at most.

Timeouts are settings made small here (a read timeout of half a second); nothing is timed."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from lane.client.driver import Driver
from lane.client.model import Model
from lane.client.models.anthropic import AnthropicModel
from lane.client.models.openai import OpenAIChatModel, OpenAIResponsesModel
from lane.v1 import snapshot_pb2

from tests.integration.lanes import new_lane_id
from tests.models import wire as w
from tests.models.fake_provider import DROP, Event, FakeProvider, Gate, Reply
from tests.models.support import QUICK_RETRY, Watcher, assistant_messages

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
#: Seconds of silence an adapter waits for in these tests.
READ_TIMEOUT = 0.5


@dataclass(frozen=True)
class Adapter:
    """One adapter and its provider's wire format."""

    name: str
    path: str
    make: Callable[[FakeProvider], Model]
    #: The first events of an answer: the stream is open and has said something.
    opened: Callable[[], list[Any]]
    #: A whole answer of the text.
    whole: Callable[[str], Reply]
    #: The JSON body of an error with this message.
    error: Callable[[str], Any]
    #: The SSE event name a corrupted chunk goes under (None: a bare ``data:`` line).
    chunk_event: str | None


def _responses_opened() -> list[Any]:
    ev = w.ResponsesStream()
    item = {"type": "message", "id": "msg_9", "role": "assistant", "status": "in_progress"}
    where = {"item_id": "msg_9", "output_index": 0, "content_index": 0}
    return [
        ev("response.created", response=w.response_object("in_progress", [])),
        ev("response.output_item.added", output_index=0, item={**item, "content": []}),
        ev("response.output_text.delta", **where, delta="Half an ans", logprobs=[]),
    ]


def _openai_error(message: str) -> Any:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


ADAPTERS = [
    Adapter(
        name="openai-chat",
        path="/v1/chat/completions",
        make=lambda p: OpenAIChatModel(
            "gpt-test", base_url=f"{p.url}/v1", api_key="k", read_timeout=READ_TIMEOUT
        ),
        opened=lambda: [
            w.chat_chunk({"role": "assistant", "content": ""}),
            w.chat_chunk({"content": "Half an ans"}),
        ],
        whole=w.chat_text_reply,
        error=_openai_error,
        chunk_event=None,
    ),
    Adapter(
        name="openai-responses",
        path="/v1/responses",
        make=lambda p: OpenAIResponsesModel(
            "gpt-test", base_url=f"{p.url}/v1", api_key="k", read_timeout=READ_TIMEOUT
        ),
        opened=_responses_opened,
        whole=w.responses_text_reply,
        error=_openai_error,
        chunk_event="response.output_text.delta",
    ),
    Adapter(
        name="anthropic",
        path="/v1/messages",
        make=lambda p: AnthropicModel(
            "claude-test", base_url=p.url, api_key="k", read_timeout=READ_TIMEOUT
        ),
        opened=lambda: w.text_opened("Half an ans"),
        whole=w.anthropic_text_reply,
        error=lambda m: {"type": "error", "error": {"type": "invalid_request_error", "message": m}},
        chunk_event="content_block_delta",
    ),
]
BY_NAME = {adapter.name: adapter for adapter in ADAPTERS}


def stalls(adapter: Adapter) -> Reply:
    return Reply(stream=[*adapter.opened(), Gate()])  # never opened: the provider goes silent


def drops(adapter: Adapter) -> Reply:
    return Reply(stream=[*adapter.opened(), DROP])


def corrupts(adapter: Adapter) -> Reply:
    return Reply(stream=[*adapter.opened(), Event('{"type": "content_bl', adapter.chunk_event)])


#: Transient faults: (the first reply, what the scheduled retry says about it).
TRANSIENT: dict[str, tuple[Callable[[Adapter], Reply], str]] = {
    "stall": (stalls, f"the provider sent nothing for {READ_TIMEOUT:g}s (read timeout)"),
    "drop": (drops, "the connection to the provider failed:"),
    "corrupt": (corrupts, "the provider sent a malformed stream chunk"),
}


async def drive(lane_stub: Any, provider: FakeProvider, adapter: Adapter, lane: str) -> Any:
    driver = Driver(lane_stub, lane, model_retry=QUICK_RETRY)
    return await driver.run("Answer.", adapter.make(provider))


@pytest.mark.parametrize("fault", list(TRANSIENT))
@pytest.mark.parametrize("name", list(BY_NAME))
async def test_a_transient_fault_mid_stream_is_retried_and_the_run_completes(
    lane_stub: Any, provider: FakeProvider, name: str, fault: str
) -> None:
    adapter = BY_NAME[name]
    first, said = TRANSIENT[fault]
    lane = new_lane_id(f"fault-{fault}")
    watcher = await Watcher(lane_stub, lane).start()
    provider.queue(adapter.path, first(adapter), adapter.whole("A whole answer."))
    result = await drive(lane_stub, provider, adapter, lane)
    assert result.status == COMPLETED, result.result
    await watcher.finish()
    (answer,) = assistant_messages(watcher.snapshot)  # the broken attempt left no entry
    assert answer.content[0].text.text == "A whole answer."
    scheduled = [e.retry_scheduled for e in watcher.events() if e.HasField("retry_scheduled")]
    assert len(scheduled) == 1 and scheduled[0].error_message.startswith(said), scheduled
    assert len(provider.bodies(adapter.path)) == 2  # one retry, no storm


@pytest.mark.parametrize("name", list(BY_NAME))
async def test_a_retry_after_beyond_the_cap_fails_the_run_with_the_providers_message(
    lane_stub: Any, provider: FakeProvider, name: str
) -> None:
    adapter = BY_NAME[name]
    lane = new_lane_id("fault-retry-after")
    provider.queue(
        adapter.path,
        Reply(
            status=429,
            headers={"retry-after": "3600"},
            body=adapter.error("Rate limit reached: try again in 1 hour."),
        ),
        adapter.whole("never asked for"),
    )
    result = await drive(lane_stub, provider, adapter, lane)
    assert result.status == FAILED
    message = result.result.error.message
    assert message.startswith("Rate limit reached: try again in 1 hour.")
    assert "retry after 3600s, longer than the 60s this driver waits" in message
    assert len(provider.bodies(adapter.path)) == 1


@pytest.mark.parametrize("status", [400, 401])
@pytest.mark.parametrize("name", list(BY_NAME))
async def test_a_refused_request_fails_at_once_with_one_request(
    lane_stub: Any, provider: FakeProvider, name: str, status: int
) -> None:
    adapter = BY_NAME[name]
    lane = new_lane_id(f"fault-{status}")
    text = "invalid x-api-key" if status == 401 else "messages: field required"
    provider.queue(
        adapter.path, Reply(status=status, body=adapter.error(text)), adapter.whole("never")
    )
    result = await drive(lane_stub, provider, adapter, lane)
    assert result.status == FAILED
    assert result.result.error.message == text
    assert len(provider.bodies(adapter.path)) == 1


# -- lane agent's flags --------------------------------------------------------------------


async def lane_agent(provider: FakeProvider, target: str, *flags: str) -> tuple[int, str]:
    """``lane agent`` on the local Chat Completions server; its status and output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LANE_", "OPENAI_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lane.client", "agent", "--model", "openai:gpt-test",
        "--base-url", f"{provider.url}/v1", "--lane", new_lane_id("agent-flags"),
        "--target", target, *flags, "Answer.",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=clean,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_lane_agent_takes_the_read_timeout_and_the_retry_after_cap_from_its_flags(
    lane_server: Any, provider: FakeProvider
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    chat = BY_NAME["openai-chat"]
    provider.queue(chat.path, stalls(chat), chat.whole("A whole answer."))
    status, output = await lane_agent(provider, target, "--model-read-timeout", "0.5")
    assert status == 0 and "A whole answer." in output, output
    assert len(provider.bodies(chat.path)) == 2

    # 30 s is within the default cap (60 s), beyond this one.
    provider.queue(
        chat.path,
        Reply(status=429, headers={"retry-after": "30"}, body=chat.error("Slow down.")),
    )
    status, output = await lane_agent(provider, target, "--max-retry-after", "10")
    assert status == 1, output
    assert "Slow down. (the provider asks to retry after 30s, longer than the 10s" in output
    assert len(provider.bodies(chat.path)) == 3
