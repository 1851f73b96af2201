"""The terminal view's drawing of an answer still streaming and of a scheduled retry (pure, no
terminal); tests/terminal/test_agent_terminal.py shows the same on a real screen."""

from __future__ import annotations

from lane.client import view
from lane.v1 import messages_pb2, snapshot_pb2


def streaming_lane(*blocks: messages_pb2.ContentBlock) -> snapshot_pb2.LaneSnapshot:
    snap = snapshot_pb2.LaneSnapshot(lane_id="l", revision=5)
    op = snap.operation
    op.id, op.kind = "op-1", snapshot_pb2.OPERATION_KIND_RUN
    op.streaming_message.content.extend(blocks)
    op.streaming_message.stop_reason = messages_pb2.STOP_REASON_PENDING
    return snap


def thinking(text: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent(thinking=text))


def text(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def call(name: str, arguments: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(
        tool_call=messages_pb2.ToolCallContent(id="c", name=name, arguments_json=arguments)
    )


def test_thinking_is_dimmed_and_the_growing_text_ends_in_the_cursor() -> None:
    lines = view.render(streaming_lane(thinking("hmm"), text("Plan:\n1. look")), now=0)
    assert lines[2:5] == [
        f"{view.DIM}thinking: hmm{view.RESET}",
        "assistant: Plan:",
        f"           1. look{view.CURSOR}",
    ]


def test_a_tool_call_being_written_shows_its_arguments_so_far() -> None:
    lines = view.render(
        streaming_lane(text("Reading."), call("read_file", '{"path": "RE')), color=False, now=0
    )
    # The text is no longer last: no cursor; the call's cut JSON is shown as it is.
    assert lines[2:4] == ["assistant: Reading.", '  → read_file {"path": "RE …']


def test_a_long_streaming_block_shows_its_last_lines() -> None:
    body = "\n".join(f"line {n}" for n in range(1, 11))
    lines = view.render(streaming_lane(text(body)), color=False, now=0)
    assert lines[2:6] == [
        "assistant: … (7 earlier lines)",
        "           line 8",
        "           line 9",
        f"           line 10{view.CURSOR}",
    ]


def test_settled_thinking_stays_in_the_transcript_dimmed() -> None:
    snap = snapshot_pb2.LaneSnapshot(lane_id="l", revision=3)
    message = snap.transcript.add().message.message.assistant
    message.content.extend([thinking("why not"), text("Done.")])
    message.stop_reason = messages_pb2.STOP_REASON_STOP
    lines = view.render(snap, now=0)
    assert lines[1:3] == [f"{view.DIM}thinking: why not{view.RESET}", "assistant: Done."]


def test_a_scheduled_retry_is_shown_with_its_attempt() -> None:
    snap = streaming_lane()
    snap.operation.ClearField("streaming_message")
    snap.operation.retry.attempt, snap.operation.retry.max_attempts = 2, 5
    lines = view.render(snap, color=False, now=0)
    assert lines[2] == "  model call failed · attempt 2 of 5 scheduled"


def test_a_scheduled_retry_says_why_and_the_time_left() -> None:
    snap = streaming_lane()
    snap.operation.ClearField("streaming_message")
    retry = snap.operation.retry
    retry.attempt, retry.max_attempts = 3, 5
    retry.error_message = "529 overloaded\n(the body)"
    retry.next_attempt_time.FromSeconds(100)
    lines = view.render(snap, color=False, now=96)
    assert lines[2] == "  model call failed: 529 overloaded · attempt 3 of 5 in 4.0s"
    assert view.render(snap, color=False, now=101)[2].endswith("attempt 3 of 5 due")


def test_queued_messages_are_shown_until_a_run_takes_them() -> None:
    snap = snapshot_pb2.LaneSnapshot(lane_id="l", revision=4)
    for kind, words in (
        (snapshot_pb2.QUEUE_KIND_STEER, "Also list the files."),
        (snapshot_pb2.QUEUE_KIND_NEXT_RUN, "Then tidy up."),
    ):
        item = snap.queues.add(entry_id=f"q-{kind}", kind=kind)
        item.message.user.content.add().text.text = words
    lines = view.render(snap, color=False, now=0)
    assert lines[-3:] == [
        "── queued (2)",
        "  steer: Also list the files.",
        "  next run: Then tidy up.",
    ]
