"""End-to-end: ``lane agent`` on a model served by a local Chat Completions server (the wire
format, with the official SDK pointed at it through ``--base-url``), driving real tools through
the real service, while ``lane watch`` runs in a tmux window. The server holds its answer at
gates, so the test reads the screen while the answer is mid-stream."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from lane.client import view
from lane.v1 import snapshot_pb2

from tests.driver.support import snapshot, text_of, tool_results
from tests.integration.lanes import new_lane_id
from tests.models import wire as w
from tests.models.fake_provider import FakeProvider, Gate, Reply
from tests.terminal.conftest import Processes, Tmux, lane_command, lines_matching

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
PATH = "/v1/chat/completions"


def agent_command(provider: FakeProvider, lane: str, target: str, prompt: str) -> list[str]:
    return lane_command(
        "agent",
        "--model",
        "openai:gpt-test",
        "--base-url",
        f"{provider.url}/v1",
        "--lane",
        lane,
        "--target",
        target,
        prompt,
    )


async def test_the_view_draws_the_answer_growing_thinking_dimmed_then_the_settled_calls(
    lane_server, lane_stub, tmux: Tmux, processes: Processes, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("term-agent")
    notes = tmp_path / "notes.txt"
    notes.write_text("hello from the notes\n")
    thought, planned = Gate(), Gate()
    async with FakeProvider() as provider:
        provider.queue(
            PATH,
            Reply(
                stream=[
                    w.chat_chunk({"role": "assistant", "content": ""}),
                    # What OpenAI-compatible servers send for reasoning models.
                    w.chat_chunk({"reasoning_content": "The user wants "}),
                    w.chat_chunk({"reasoning_content": "the notes read"}),
                    thought,
                    w.chat_chunk({"content": "Plan:\n1. read"}),
                    w.chat_chunk({"content": " the notes"}),
                    planned,
                    w.chat_tool_start(0, "call_1", "read_file", '{"path": '),
                    w.chat_tool_arguments(0, f'"{notes}"}}'),
                    w.chat_chunk({}, "tool_calls"),
                    w.chat_usage(400, 25),
                    w.CHAT_DONE,
                ]
            ),
            w.chat_text_reply("The notes say hello."),
        )
        await tmux.start("watch", lane_command("watch", lane, "--target", target))
        await tmux.wait_for("watch", lambda s: "waiting for lane" in s, "the view waiting")
        agent = await processes.start(*agent_command(provider, lane, target, "Read the notes."))

        await thought.reached.wait()
        await tmux.wait_for(
            "watch", lambda s: "thinking: The user wants the notes read" in s, "the thinking"
        )
        raw = await tmux.screen("watch", escapes=True)
        # SGR 2 (dim), which tmux may emit combined with others (ESC[0;2m).
        assert view.DIM == "\x1b[2m"
        dimmed = r"\x1b\[(?:[0-9;]*;)?2m(?:\x1b\[[0-9;]*m)*thinking: The user wants"
        assert re.search(dimmed, raw), f"the thinking is not dimmed:\n{raw!r}"
        thought.open()

        await planned.reached.wait()
        screen = await tmux.wait_for(
            "watch", lambda s: f"1. read the notes{view.CURSOR}" in s, "the text so far"
        )
        assert lines_matching(screen, r"assistant: Plan:")
        assert "read_file" not in screen  # no call yet
        planned.open()

        final = await tmux.wait_for(
            "watch",
            lambda s: "last run" in s and "The notes say hello." in s,
            "the settled answer and the run's end",
        )
        assert await processes.wait(agent, 20) == 0, processes.output(agent)
    assert view.CURSOR not in final  # nothing streams any more
    call = lines_matching(final, r"→ read_file \{\"path\": ")
    placed = lines_matching(final, r"✓ read_file: hello from the notes")
    answer = lines_matching(final, r"assistant: The notes say hello\.")
    assert call and placed and answer and call[0] < placed[0] < answer[0], final
    assert lines_matching(final, r"last run .* completed")
    assert "The notes say hello." in processes.output(agent)
    snap = await snapshot(lane_stub, lane)
    assert [text_of(r) for r in tool_results(snap)] == ["hello from the notes\n"]
    assert snap.last_result.status == COMPLETED


async def test_ctrl_c_aborts_the_agents_run_while_the_answer_streams(
    lane_server, lane_stub, processes: Processes
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("agent-abort")
    held = Gate()
    async with FakeProvider() as provider:
        provider.queue(
            PATH,
            Reply(
                stream=[
                    w.chat_chunk({"role": "assistant", "content": "Thinking about it"}),
                    held,
                    w.chat_chunk({}, "stop"),
                    w.CHAT_DONE,
                ]
            ),
        )
        agent = await processes.start(*agent_command(provider, lane, target, "Take your time."))
        await held.reached.wait()
        agent.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert await processes.wait(agent, 20) == 3, processes.output(agent)  # 3: aborted
    output = processes.output(agent)
    assert "interrupted: aborting the run" in output and "ended aborted" in output
    snap = await snapshot(lane_stub, lane)
    assert snap.last_result.status == ABORTED and not snap.HasField("operation")
