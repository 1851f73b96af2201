"""The terminal view's drawing (pure, no terminal): rows, marks, styles, sizing."""

from __future__ import annotations

import pytest
from lane.client import view
from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2

from tests.integration.lanes import assistant, result, text, tool_call, user


def entry(message: messages_pb2.AgentMessage, entry_id: str) -> entries_pb2.Entry:
    return entries_pb2.Entry(id=entry_id, message=entries_pb2.MessageEntry(message=message))


def lane_with_batch() -> snapshot_pb2.LaneSnapshot:
    snap = snapshot_pb2.LaneSnapshot(lane_id="l", revision=9)
    snap.transcript.append(entry(user("hi"), "e1"))
    snap.transcript.append(
        entry(
            messages_pb2.AgentMessage(
                assistant=assistant(
                    text("working"), tool_call("a", "sleep", {"s": 1}), tool_call("b", "shell", {})
                )
            ),
            "e2",
        )
    )
    op = snap.operation
    op.id = "op-1"
    op.kind = snapshot_pb2.OPERATION_KIND_RUN
    running = op.running_tools.add().running
    running.tool_call_id, running.tool_name, running.arguments_json = "a", "sleep", '{"s": 1}'
    running.result.CopyFrom(result("first\nlatest progress"))
    settled = op.running_tools.add().settled
    settled.tool_call_id, settled.tool_name, settled.arguments_json = "b", "shell", "{}"
    settled.result.CopyFrom(result("boom"))
    settled.is_error = True
    return snap


def test_running_and_settled_rows() -> None:
    clock = view.ToolClock()
    snap = lane_with_batch()
    clock.observe(snap, now=100.0)
    lines = view.render(snap, clock=clock, now=102.5, frame=3, color=False)
    assert lines[0] == "lane l · revision 9 · 0 messages"
    assert "you: hi" in lines and "assistant: working" in lines
    assert '  → sleep {"s": 1}' in lines
    assert f'  {view.SPINNER[3]} sleep · running 2.5s · {{"s": 1}}' in lines
    assert "      │ latest progress" in lines
    assert "  ✗ shell · error · waiting for placement · {}" in lines
    assert "      │ boom" in lines


def test_error_results_are_drawn_in_the_error_style() -> None:
    snap = lane_with_batch()
    placed = messages_pb2.AgentMessage(
        tool_result=messages_pb2.ToolResultMessage(
            tool_call_id="a", tool_name="sleep", content=[text("Command aborted")], is_error=True
        )
    )
    snap.transcript.append(entry(placed, "e3"))
    fine = messages_pb2.AgentMessage(
        tool_result=messages_pb2.ToolResultMessage(
            tool_call_id="c", tool_name="read_file", content=[text("all good")]
        )
    )
    snap.transcript.append(entry(fine, "e4"))
    lines = view.render(snap, color=True)
    # What the terminal is sent: SGR 31 (red) around the error, reset after; not the module's
    # own constants compared with themselves.
    red, reset = "\x1b[31m", "\x1b[0m"
    assert f"{red}  ✗ sleep: Command aborted{reset}" in lines
    settled = [line for line in lines if "waiting for placement" in line]
    assert settled and settled[0].startswith(red)
    # A result that is no error is not drawn red.
    good = [line for line in lines if "all good" in line]
    assert good and not any(red in line for line in good)


def test_the_screen_keeps_the_transcript_tail_within_its_size() -> None:
    snap = lane_with_batch()
    for n in range(50):
        snap.transcript.append(entry(user(f"message {n}"), f"m{n}"))
    lines = view.render(snap, width=30, height=12, status="live", color=False)
    assert len(lines) == 12
    assert all(len(line) <= 30 for line in lines)
    assert lines[-1] == "live"
    assert any("message 49" in line for line in lines)
    assert not any("message 40" in line for line in lines)


def long_lane(messages: int) -> snapshot_pb2.LaneSnapshot:
    """A lane of ``messages`` user messages and no operation: one content row each, then the
    ``── no operation yet`` row."""
    snap = snapshot_pb2.LaneSnapshot(lane_id="l", revision=messages)
    for n in range(messages):
        snap.transcript.append(entry(user(f"message {n}"), f"m{n}"))
    return snap


@pytest.mark.parametrize("messages", [0, 1, 5, 11, 12, 13, 20, 21, 22, 200])
@pytest.mark.parametrize("height", [3, 4, 12, 24])
def test_the_window_shows_the_tail_that_fits_for_every_length(messages: int, height: int) -> None:
    snap = long_lane(messages)
    frame = view.render_frame(snap, width=40, height=height, status="live", color=False)
    room = height - 2  # the header and the status line
    shown = min(room, messages + 1)
    assert len(frame.lines) == 2 + shown  # never a blank gap: exactly what fits is drawn
    assert frame.lines[0].startswith("lane l") and frame.lines[-1] == "live"
    body = frame.lines[1:-1]
    expected = [f"you: message {n}" for n in range(messages)] + ["── no operation yet"]
    assert body == expected[len(expected) - shown :]
    assert (frame.top, frame.room, frame.total) == (len(expected) - shown, room, messages + 1)


def test_a_scrolled_window_stays_put_and_says_where_it_is() -> None:
    snap = long_lane(30)
    frame = view.render_frame(snap, width=80, height=12, status="live", color=False, top=5)
    assert frame.lines[1:-1] == [f"you: message {n}" for n in range(5, 15)]
    assert frame.lines[-1] == "live · rows 6-15 of 31 · End: follow"
    past_the_end = view.render_frame(snap, height=12, status="live", color=False, top=99)
    assert past_the_end.top == past_the_end.bottom == 21
    assert past_the_end.lines[-2] == "── no operation yet"
    assert past_the_end.lines[-1] == "live"


def test_narrow_screens_keep_a_rows_status_before_its_arguments() -> None:
    lines = view.render(lane_with_batch(), width=28, color=False)
    assert "  ✗ shell · error · waiting…" in lines
    assert all(view.cells(line) <= 28 for line in lines)
    assert any(line.startswith(f"  {view.SPINNER[0]} sleep · running") for line in lines)


def test_wide_characters_take_two_cells() -> None:
    assert view.cells("漢字ab") == 6
    assert view.fit_width("漢字漢字", 5) == "漢字…"
    assert view.fit_width("short", 5) == "short"


def test_last_result_and_progress_clock() -> None:
    snap = snapshot_pb2.LaneSnapshot(lane_id="l")
    snap.last_result.operation_id = "op-9"
    snap.last_result.kind = snapshot_pb2.OPERATION_KIND_RUN
    snap.last_result.status = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
    assert "── no open operation · last run op-9 aborted" in view.render(snap, color=False)
    clock = view.ToolClock()
    clock.observe(lane_with_batch(), now=10.0)
    clock.observe(snapshot_pb2.LaneSnapshot(), now=11.0)
    assert clock.started == {}
