"""The terminal view's drawing (pure, no terminal): rows, marks, styles, sizing."""

from __future__ import annotations

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
    assert f'  {view.SPINNER[3]} sleep {{"s": 1}} · running 2.5s' in lines
    assert "      │ latest progress" in lines
    assert "  ✗ shell {} · error · waiting for placement" in lines
    assert "      │ boom" in lines


def test_error_results_are_drawn_in_the_error_style() -> None:
    snap = lane_with_batch()
    placed = messages_pb2.AgentMessage(
        tool_result=messages_pb2.ToolResultMessage(
            tool_call_id="a", tool_name="sleep", content=[text("Command aborted")], is_error=True
        )
    )
    snap.transcript.append(entry(placed, "e3"))
    lines = view.render(snap, color=True)
    assert f"{view.ERROR}  ✗ sleep: Command aborted{view.RESET}" in lines
    assert view.ERROR == "\x1b[31m"
    settled = [line for line in lines if "waiting for placement" in line]
    assert settled and settled[0].startswith(view.ERROR)


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
