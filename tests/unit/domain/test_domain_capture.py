"""Authoritative capture (docs/contract.md, Tool calls and Invariants)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2

from lane.server.domain.capture import capture
from lane.server.domain.results import UNKNOWN_TOOL_TEXT
from lane.server.domain.state import (
    CallStatus,
    LaneState,
    Operation,
    Phase,
    ToolBatch,
    ToolCall,
)
from tests.unit.domain.support import (
    LANE,
    RUN,
    T0,
    Cause,
    Lane,
    assert_corrupt,
    assistant,
    default_configuration,
    executed,
    lane_with_batch,
    result,
    run_settings,
    synthetic,
    text,
    thinking,
    tool_call,
    usage,
    user,
)

SOURCE_ARGS = {
    "c-0": '{"path":"done.txt"}',
    "c-1": '{"command":"make"}',
    "c-2": '{"path":"b.txt","offset":9007199254740993}',
    "c-3": '{"pattern":"x"}',
    "c-4": '{"anything": [1, 2.5, 18446744073709551616]}',
    "c-5": '{"later":true}',
}
NAMES = {"c-0": "read", "c-1": "bash", "c-2": "read", "c-3": "grep", "c-4": "nope", "c-5": "read"}
EFFECTIVE_ARGS = {
    "c-0": '{"path":"done.txt"}',
    "c-1": '{"command":"make -j4","timeout":600}',
    "c-2": '{"path":"b.txt","offset":9007199254740993}',
    "c-3": '{"pattern":"x","max":18446744073709551615}',
}
CHECKPOINT = result("12%", details_json='{"pct":12}')
PROGRESS = result("47%", details_json='{"pct":47}', usage=usage(1))
REAL_FINAL = result(
    "3 matches", details_json='{"files":["a","b"]}', usage=usage(6), added=["edit"], terminate=True
)


def _mixed_assistant() -> messages_pb2.AssistantMessage:
    return assistant(
        text("Let me look."),  # 0
        tool_call("c-0", NAMES["c-0"], SOURCE_ARGS["c-0"]),  # 1 completed
        tool_call("c-1", NAMES["c-1"], SOURCE_ARGS["c-1"]),  # 2 effect_pending + checkpoint
        tool_call("c-2", NAMES["c-2"], SOURCE_ARGS["c-2"]),  # 3 effect_pending, no progress
        thinking("hmm"),  # 4
        tool_call("c-3", NAMES["c-3"], SOURCE_ARGS["c-3"]),  # 5 outcome_ready real
        tool_call("c-4", NAMES["c-4"], SOURCE_ARGS["c-4"]),  # 6 outcome_ready synthetic
        tool_call("c-5", NAMES["c-5"], SOURCE_ARGS["c-5"]),  # 7 planned
    )


def _expected_rows() -> list[snapshot_pb2.SnapshotTool]:
    running_1 = snapshot_pb2.RunningTool(
        tool_call_id="c-1", tool_name="bash", arguments_json=EFFECTIVE_ARGS["c-1"], result=PROGRESS
    )
    running_2 = snapshot_pb2.RunningTool(
        tool_call_id="c-2", tool_name="read", arguments_json=EFFECTIVE_ARGS["c-2"]
    )
    settled_3 = snapshot_pb2.SettledTool(
        tool_call_id="c-3",
        tool_name="grep",
        arguments_json=EFFECTIVE_ARGS["c-3"],
        result=REAL_FINAL,
        is_error=False,
    )
    settled_4 = snapshot_pb2.SettledTool(
        tool_call_id="c-4",
        tool_name="nope",
        arguments_json=SOURCE_ARGS["c-4"],  # never wrote args: the source block's
        result=messages_pb2.ToolResult(content=[text(UNKNOWN_TOOL_TEXT.format(name="nope"))]),
        is_error=True,
    )
    return [
        snapshot_pb2.SnapshotTool(running=running_1),
        snapshot_pb2.SnapshotTool(running=running_2),
        snapshot_pb2.SnapshotTool(settled=settled_3),
        snapshot_pb2.SnapshotTool(settled=settled_4),
    ]


def _result_message(
    call_id: str, outcome: messages_pb2.ToolResult, *, is_error: bool
) -> messages_pb2.ToolResultMessage:
    message = messages_pb2.ToolResultMessage(
        tool_call_id=call_id,
        tool_name=NAMES[call_id],
        content=outcome.content,
        added_tool_names=outcome.added_tool_names,
        is_error=is_error,
    )
    if outcome.HasField("details_json"):
        message.details_json = outcome.details_json
    if outcome.HasField("usage"):
        message.usage.CopyFrom(outcome.usage)
    message.timestamp.FromDatetime(T0)
    return message


def _mixed_state() -> tuple[LaneState, list[entries_pb2.Entry]]:
    """A mixed batch (one call in each status), written as durable state directly."""
    message = _mixed_assistant()
    unknown = messages_pb2.ToolResult(content=[text(UNKNOWN_TOOL_TEXT.format(name="nope"))])
    calls = (
        ToolCall(
            1,
            "c-0",
            "read",
            "r-0",
            CallStatus.COMPLETED,
            arguments_json=EFFECTIVE_ARGS["c-0"],
            result_message=_result_message("c-0", result("done"), is_error=False),
        ),
        ToolCall(
            2,
            "c-1",
            "bash",
            "r-1",
            CallStatus.EFFECT_PENDING,
            arguments_json=EFFECTIVE_ARGS["c-1"],
            checkpoint=CHECKPOINT,
            progress=PROGRESS,
        ),
        ToolCall(
            3, "c-2", "read", "r-2", CallStatus.EFFECT_PENDING, arguments_json=EFFECTIVE_ARGS["c-2"]
        ),
        ToolCall(
            5,
            "c-3",
            "grep",
            "r-3",
            CallStatus.OUTCOME_READY,
            arguments_json=EFFECTIVE_ARGS["c-3"],
            result_message=_result_message("c-3", REAL_FINAL, is_error=False),
            terminate=True,
        ),
        ToolCall(
            6,
            "c-4",
            "nope",
            "r-4",
            CallStatus.OUTCOME_READY,
            result_message=_result_message("c-4", unknown, is_error=True),
        ),
        ToolCall(7, "c-5", "read", "r-5", CallStatus.PLANNED),
    )
    user_entry = entries_pb2.Entry(
        id="e-user", seq=3, message=entries_pb2.MessageEntry(message=user("look"))
    )
    assistant_entry = entries_pb2.Entry(
        id="e-assistant",
        parent_id="e-user",
        seq=6,
        message=entries_pb2.MessageEntry(message=messages_pb2.AgentMessage(assistant=message)),
    )
    result_entry = entries_pb2.Entry(
        id="r-0",
        parent_id="e-assistant",
        seq=9,
        message=entries_pb2.MessageEntry(
            message=messages_pb2.AgentMessage(tool_result=calls[0].result_message)
        ),
    )
    operation = Operation(
        operation_id=RUN,
        kind=snapshot_pb2.OPERATION_KIND_RUN,
        started_time=T0,
        from_tip_id="",
        settings=run_settings(),
        phase=Phase.TOOLS,
        turn_id="turn-1",
        batch=ToolBatch("turn-1", "e-assistant", message, calls),
    )
    state = LaneState(
        lane_id=LANE,
        revision=20,
        tip_id="r-0",
        configuration=default_configuration(),
        message_count=3,
        usage_totals=usage(50),
        operation=operation,
    )
    return state, [user_entry, assistant_entry, result_entry]


def _call_index(state: LaneState, call_id: str) -> int:
    assert state.operation is not None and state.operation.batch is not None
    return [c.tool_call_id for c in state.operation.batch.calls].index(call_id)


def _with_call(state: LaneState, call_id: str, **changes: object) -> LaneState:
    assert state.operation is not None and state.operation.batch is not None
    batch = state.operation.batch
    calls = list(batch.calls)
    index = _call_index(state, call_id)
    calls[index] = replace(calls[index], **changes)  # type: ignore[arg-type]
    return replace(
        state, operation=replace(state.operation, batch=replace(batch, calls=tuple(calls)))
    )


def test_mixed_batch_projects_four_rows_in_source_order() -> None:
    state, transcript = _mixed_state()
    snapshot = capture(state, transcript)
    rows = list(snapshot.operation.running_tools)
    assert rows == _expected_rows()
    assert not rows[1].running.HasField("result")  # the progress-less running row
    assert rows[0].running.result == PROGRESS  # the latest progress, not the older checkpoint
    assert not rows[3].settled.result.HasField("details_json")
    assert not rows[3].settled.result.HasField("usage")
    assert list(snapshot.transcript) == transcript
    ids = [r.running.tool_call_id or r.settled.tool_call_id for r in rows]
    assert "c-0" not in ids and "c-5" not in ids  # completed: transcript only; planned: absent
    assert (snapshot.lane_id, snapshot.revision, snapshot.tip_id) == (LANE, 20, "r-0")
    assert snapshot.stats.message_count == 3 and snapshot.stats.usage == usage(50)
    op = snapshot.operation
    assert (op.id, op.kind, op.status) == (
        RUN,
        snapshot_pb2.OPERATION_KIND_RUN,
        snapshot_pb2.OPERATION_STATUS_OPEN,
    )


def test_mixed_batch_reached_through_commands_captures_the_same_rows() -> None:
    lane = Lane()
    lane.start_run(user("look"))
    lane.start_turn("turn-1")
    lane.settle("turn-1", _mixed_assistant())
    for call_id in ("c-0", "c-1", "c-2", "c-3"):
        lane.start_tool(call_id, EFFECTIVE_ARGS[call_id])
    lane.stage("c-4", synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL))
    lane.stage("c-0", executed(result("done")))
    lane.place()
    lane.update_tool("c-1", CHECKPOINT, checkpoint=True)
    lane.update_tool("c-1", PROGRESS)
    lane.stage("c-3", executed(REAL_FINAL))
    snapshot = lane.snapshot()
    assert list(snapshot.operation.running_tools) == _expected_rows()
    transcript_results = [
        e.message.message.tool_result.tool_call_id
        for e in snapshot.transcript
        if e.message.message.WhichOneof("message") == "tool_result"
    ]
    assert transcript_results == ["c-0"]


def test_capture_shows_aborting_queues_and_last_result() -> None:
    lane = Lane()
    lane.start_run(user("one"))
    lane.start_turn("turn-1")
    lane.settle("turn-1", assistant(text("done"), stop_reason=messages_pb2.STOP_REASON_STOP))
    ended = lane.end_run(snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    lane.start_run(user("two"), run_id="run-2")
    lane.abort()
    snapshot = lane.snapshot()
    assert snapshot.operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING
    assert snapshot.operation.id == "run-2"
    assert snapshot.last_result.operation_id == RUN
    assert snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    assert snapshot.last_result.ended_time == ended.events[-1].run_end.ended_time


CORRUPTIONS = [
    pytest.param("c-3", {"result_message": None}, id="outcome-ready-without-staged-result"),
    pytest.param("c-4", {"result_message": None}, id="synthetic-without-staged-result"),
    pytest.param(
        "c-3",
        {"result_message": messages_pb2.ToolResultMessage(tool_call_id="c-9", tool_name="grep")},
        id="staged-result-for-another-call-id",
    ),
    pytest.param(
        "c-3",
        {"result_message": messages_pb2.ToolResultMessage(tool_call_id="c-3", tool_name="read")},
        id="staged-result-for-another-tool-name",
    ),
    pytest.param("c-1", {"arguments_json": None}, id="effect-pending-without-arguments"),
    pytest.param("c-2", {"arguments_json": None}, id="progressless-without-arguments"),
    pytest.param("c-3", {"source_index": 4}, id="outcome-ready-at-a-thinking-block"),
    pytest.param("c-1", {"source_index": 0}, id="effect-pending-at-a-text-block"),
    pytest.param("c-4", {"source_index": 99}, id="source-index-beyond-content"),
    pytest.param("c-2", {"source_index": 2}, id="source-block-of-another-call"),
    pytest.param("c-3", {"tool_name": "read"}, id="call-name-differs-from-source-block"),
]


@pytest.mark.parametrize(("call_id", "changes"), CORRUPTIONS)
def test_corrupt_state_faults_capture(call_id: str, changes: dict[str, object]) -> None:
    state, transcript = _mixed_state()
    capture(state, transcript)  # the uncorrupted state captures fine
    assert_corrupt(_with_call(state, call_id, **changes), transcript, call_id)


def test_planned_and_completed_calls_are_not_read_by_capture() -> None:
    """Only presentation-active calls are validated: a completed call's staged message is gone
    after placement in the durable model, a planned call has none yet."""
    state, transcript = _mixed_state()
    state = _with_call(state, "c-0", result_message=None, arguments_json=None)
    assert list(capture(state, transcript).operation.running_tools) == _expected_rows()


def test_staged_then_captured_result_equals_the_tool_end_result() -> None:
    lane = lane_with_batch(("c-0", "grep", "{}"))
    lane.start_tool("c-0")
    end = lane.stage("c-0", executed(REAL_FINAL)).events[0].tool_end
    settled = lane.snapshot().operation.running_tools[0].settled
    assert settled.result == end.result == REAL_FINAL
    assert settled.is_error == end.is_error
