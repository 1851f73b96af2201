"""``lane watch`` in tmux at several sizes and transcript lengths: the screen holds the
transcript's tail that fits (no blank gap above the status line), follows a resize, scrolls
with PageUp/arrows/Home/End, and follows the tail again at the bottom."""

from __future__ import annotations

import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.integration.lanes import new_lane_id, user
from tests.terminal.conftest import Tmux, lane_command, visible_lines

pytestmark = pytest.mark.asyncio(loop_scope="session")

ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED


async def lane_of(stub, prefix: str, messages: int) -> str:
    """A lane whose transcript is ``messages`` user messages ``message 0`` ... (one run,
    ended): the view's content is one row per message, then the last run's row."""
    lane = new_lane_id(prefix)
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    run = await stub.StartRun(
        pb.StartRunRequest(lane_id=lane, prompt=[user(f"message {n}") for n in range(messages)])
    )
    await stub.EndRun(pb.EndRunRequest(lane_id=lane, operation_id=run.operation_id, status=ABORTED))
    return lane


def check_tail(screen: str, messages: int, height: int) -> None:
    lines = visible_lines(screen)
    assert lines[0].startswith("lane "), screen
    assert "live" in lines[-1] and "rows" not in lines[-1], screen
    body = lines[1:-1]
    content = [f"you: message {n}" for n in range(messages)]
    room = height - 2
    shown = min(room, messages + 1)
    assert len(body) == shown, f"expected {shown} content rows:\n{screen}"
    assert body[-1].startswith("── no open operation · last run"), screen
    assert body[:-1] == content[len(content) - (shown - 1) :], screen


@pytest.mark.parametrize("messages", [3, 15, 60])
async def test_the_tail_fits_side_by_side_in_80x24_and_in_40_columns(
    lane_server, lane_stub, tmux: Tmux, messages: int
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = await lane_of(lane_stub, "term-fit", messages)
    watch = lane_command("watch", lane, "--target", target)
    await tmux.start("split", watch, width=80, height=24)
    await tmux.split("split", watch)
    await tmux.start("narrow", watch, width=40, height=12)
    await tmux.start("tall", watch, width=120, height=40)
    last = f"you: message {messages - 1}"
    for pane, height in (("split:0.0", 24), ("split:0.1", 24), ("narrow", 12), ("tall", 40)):
        screen = await tmux.wait_for(
            pane, lambda s: last in s and "live" in s, f"the lane's tail in {pane}"
        )
        check_tail(screen, messages, height)


async def test_resizing_redraws_the_tail_at_the_new_size(
    lane_server, lane_stub, tmux: Tmux
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = await lane_of(lane_stub, "term-resize", 30)
    await tmux.start("watch", lane_command("watch", lane, "--target", target), width=80, height=40)
    screen = await tmux.wait_for("watch", lambda s: "message 29" in s, "the tail at 80x40")
    check_tail(screen, 30, 40)
    await tmux.resize("watch", 40, 10)
    screen = await tmux.wait_for(
        "watch",
        lambda s: len(visible_lines(s)) == 10 and "message 22" not in s,
        "the tail redrawn at 40x10",
    )
    check_tail(screen, 30, 10)
    await tmux.resize("watch", 100, 30)
    screen = await tmux.wait_for(
        "watch", lambda s: len(visible_lines(s)) == 30, "the tail redrawn at 100x30"
    )
    check_tail(screen, 30, 30)


async def test_scrolling_and_following_again_at_the_bottom(
    lane_server, lane_stub, tmux: Tmux
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = await lane_of(lane_stub, "term-scroll", 40)
    await tmux.start("watch", lane_command("watch", lane, "--target", target), width=60, height=12)
    await tmux.wait_for("watch", lambda s: "message 39" in s, "the tail")
    # 41 content rows, 10 fit: the tail starts at row 32 (message 31).
    await tmux.send_keys("watch", "PageUp")
    screen = await tmux.wait_for("watch", lambda s: "rows 23-32 of 41" in s, "one page up")
    assert visible_lines(screen)[1] == "you: message 22"
    await tmux.send_keys("watch", "Up")
    screen = await tmux.wait_for("watch", lambda s: "rows 22-31 of 41" in s, "one row up")
    assert visible_lines(screen)[1] == "you: message 21"
    await tmux.send_keys("watch", "Home")
    screen = await tmux.wait_for("watch", lambda s: "rows 1-10 of 41" in s, "the top")
    assert visible_lines(screen)[1:11] == [f"you: message {n}" for n in range(10)]
    # A commit while scrolled: the window stays where it is.
    run = await lane_stub.StartRun(pb.StartRunRequest(lane_id=lane, prompt=[user("brand new")]))
    screen = await tmux.wait_for("watch", lambda s: "of 42" in s, "the new rows counted")
    assert visible_lines(screen)[1] == "you: message 0" and "brand new" not in screen
    await tmux.send_keys("watch", "PageDown")
    await tmux.wait_for("watch", lambda s: "rows 10-19 of 42" in s, "one page down")
    await tmux.send_keys("watch", "Down")
    await tmux.wait_for("watch", lambda s: "rows 11-20 of 42" in s, "one row down")
    await tmux.send_keys("watch", "End")
    screen = await tmux.wait_for(
        "watch", lambda s: "you: brand new" in s and "rows" not in s, "following the tail"
    )
    # Following: the next commit shows at once at the bottom.
    await lane_stub.EndRun(
        pb.EndRunRequest(lane_id=lane, operation_id=run.operation_id, status=ABORTED)
    )
    screen = await tmux.wait_for("watch", lambda s: "last run" in s, "the run's end")
    assert visible_lines(screen)[-2].startswith("── no open operation · last run")
    # Paging down to the bottom also follows again.
    await tmux.send_keys("watch", "PageUp")
    await tmux.wait_for("watch", lambda s: "rows" in s, "scrolled up")
    await tmux.send_keys("watch", "PageDown")
    await tmux.wait_for("watch", lambda s: "rows" not in s, "following again")
