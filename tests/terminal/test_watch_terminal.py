"""End-to-end terminal tests: ``lane demo`` drives real tools through the real service while
``lane watch`` runs in a tmux window (120x40); the tests type keys and read the screen."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from grpc import aio
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, snapshot_pb2

from lane.server.app.server import start_server
from tests.driver.support import rows, snapshot, text_of, tool_results, until
from tests.integration.lanes import new_lane_id, user
from tests.terminal.conftest import Processes, Tmux, lane_command, lines_matching

pytestmark = pytest.mark.asyncio(loop_scope="session")

ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
#: The documented style of error results (lane.client.view): SGR 31, red foreground, checked
#: in the escapes tmux recorded from the running view.
ERROR_STYLE = "\x1b[31m"
ABORTED_TEXT = re.compile(r"Command aborted after (\d+\.\d)s")


async def test_escape_aborts_a_running_command_and_draws_the_error_result(
    lane_server, lane_stub, tmux: Tmux, processes: Processes
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("term-abort")
    demo = await processes.start(
        *lane_command("demo", "--lane", lane, "--target", target, "--shell", "sleep 20"),
        "--model-delay",
        "0",
    )

    async def sleeping() -> bool:
        try:
            return rows(await snapshot(lane_stub, lane)) == {"call_1_1": "running"}
        except Exception:
            return False

    await until(sleeping, seconds=20, what="the demo's shell tool to run")
    await tmux.start("watch", lane_command("watch", lane, "--target", target))
    await tmux.wait_for(
        "watch",
        lambda s: re.search(r'shell · running \d+\.\ds · \{"command": "sleep 20"\}', s),
        "the running shell tool on screen",
    )
    await asyncio.sleep(2.0)
    await tmux.send_keys("watch", "Escape")
    screen = await tmux.wait_for(
        "watch",
        lambda s: ABORTED_TEXT.search(s) and "last run" in s,
        "the aborted command and the run's end on screen",
    )
    match = ABORTED_TEXT.search(screen)
    assert match is not None
    assert 1.5 <= float(match.group(1)) < 20.0  # aborted after ~2 s of a 20 s command
    assert lines_matching(screen, r"last run .* aborted")
    raw = await tmux.screen("watch", escapes=True)
    styled = re.escape(ERROR_STYLE) + r"(?:\x1b\[[0-9;]*m)*[^\x1b\n]*Command aborted after"
    assert re.search(styled, raw), f"no error style on the aborted result:\n{raw!r}"
    assert await processes.wait(demo, 15) == 3, processes.output(demo)  # 3: aborted
    snap = await snapshot(lane_stub, lane)
    (placed,) = tool_results(snap)
    assert placed.is_error and ABORTED_TEXT.fullmatch(text_of(placed))
    assert snap.last_result.status == ABORTED and not snap.HasField("operation")


async def test_a_later_call_finishing_first_is_shown_waiting_then_placed_in_order(
    lane_server, lane_stub, tmux: Tmux, processes: Processes, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("term-parallel")
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {
                    "text": "two at once",
                    "tools": [
                        {"name": "sleep", "args": {"seconds": 4}},
                        {"name": "shell", "args": {"command": "echo early bird"}},
                    ],
                },
                {"text": "both placed"},
            ]
        )
    )
    # The view starts first and waits for the lane to exist.
    await tmux.start("watch", lane_command("watch", lane, "--target", target))
    await tmux.wait_for("watch", lambda s: "waiting for lane" in s, "the view waiting")
    demo = await processes.start(
        *lane_command("demo", "--lane", lane, "--target", target, "--script", str(script)),
        "--model-delay",
        "0",
    )
    screen = await tmux.wait_for(
        "watch",
        lambda s: "early bird" in s and "waiting for placement" in s and "· running" in s,
        "the shell result waiting while the sleep runs",
    )
    waiting = lines_matching(screen, r"✓ shell · done · waiting for placement · ")
    running = lines_matching(screen, r"sleep · running \d+\.\ds · \{\"seconds\": 4\}")
    assert waiting and running, screen
    assert "early bird" in screen.splitlines()[waiting[0] + 1]
    assert running[0] < waiting[0]  # rows in source order
    snap = await snapshot(lane_stub, lane)
    assert rows(snap) == {"call_1_1": "running", "call_1_2": "settled"}
    assert tool_results(snap) == []  # not placed while the earlier call runs
    assert await processes.wait(demo, 20) == 0, processes.output(demo)
    final = await tmux.wait_for("watch", lambda s: "last run" in s, "the run's end")
    assert lines_matching(final, r"last run .* completed")
    slept = lines_matching(final, r"✓ sleep: Slept 4s")
    early = lines_matching(final, r"✓ shell: early bird")
    assert slept and early and slept[0] < early[0], final  # the transcript in source order
    snap = await snapshot(lane_stub, lane)
    assert [r.tool_call_id for r in tool_results(snap)] == ["call_1_1", "call_1_2"]
    assert [text_of(r) for r in tool_results(snap)] == ["Slept 4s", "early bird"]
    assert snap.last_result.status == COMPLETED


async def test_the_view_resumes_after_a_service_restart(
    fresh_database_url: str, tmux: Tmux
) -> None:
    server = await start_server(fresh_database_url, listen="127.0.0.1:0")
    port = server.port
    lane = new_lane_id("term-restart")
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
            await one_prompt(stub, lane, "before the restart")
        await tmux.start("watch", lane_command("watch", lane, "--target", f"127.0.0.1:{port}"))
        await tmux.wait_for("watch", lambda s: "you: before the restart" in s, "the first run")
        await server.stop(grace=0.2)
        # The footer says so at once (not after a heartbeat's silence), with the cause.
        screen = await tmux.wait_for(
            "watch",
            lambda s: re.search(r"reconnecting · attempt [2-9]\d* · connection refused", s),
            "reconnecting with its attempt and cause",
        )
        assert "live" not in screen.splitlines()[-1]
        server = await start_server(fresh_database_url, listen=f"127.0.0.1:{port}")
        # Back: the view is live again without waiting out a long backoff.
        await tmux.wait_for(
            "watch", lambda s: "live" in s and "reconnecting" not in s, "live again", seconds=5
        )
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            await one_prompt(stub, lane, "after the restart")
        screen = await tmux.wait_for(
            "watch", lambda s: "you: after the restart" in s, "the run after the restart"
        )
        assert (
            lines_matching(screen, "before the restart")[0]
            < lines_matching(screen, "after the restart")[0]
        )
    finally:
        await server.stop(grace=0.2)


async def one_prompt(stub, lane: str, text: str) -> None:
    """A run with one prompt, ended at once (unleased: no driver needed)."""
    run = await stub.StartRun(pb.StartRunRequest(lane_id=lane, prompt=[user(text)]))
    await stub.EndRun(pb.EndRunRequest(lane_id=lane, operation_id=run.operation_id, status=ABORTED))
