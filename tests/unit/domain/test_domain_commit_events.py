"""Commits and their event groups (docs/contract.md: Commits and their events, invariant 3).

Every ``Lane`` commit here is also checked for consecutive revisions, entry seq, parent chain,
an untouched input state and fold == capture (tests/unit/domain/support.py).
"""

from __future__ import annotations

import pytest
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.domain import lanes, results, runs, tools
from lane.server.domain.run_inputs import Synthetic
from lane.server.domain.state import CallStatus, Continuation, Phase
from tests.unit.domain.support import (
    LANE,
    LENGTH,
    NEVER,
    NEXT_RUN,
    RUN,
    SAFE,
    STEER,
    TOOL_USE,
    WRITE,
    Cause,
    Lane,
    assistant,
    executed,
    kinds,
    lane_with_batch,
    of_kind,
    queued_custom,
    queued_message,
    result,
    synthetic,
    text,
    tool_call,
    usage,
    user,
)

BIG_ARGS = '{"path": "a.txt", "offset": 9007199254740993, "limit": 1e2, "deep": {"n": -0}}'
EFFECTIVE_ARGS = '{"path":"a.txt","offset":9007199254740993,"limit":100,"encoding":"utf-8"}'


# --- lane, run and turn commits ---------------------------------------------------------------


def test_create_lane_emits_lane_created_at_revision_one() -> None:
    lane = Lane()
    assert kinds(lane.events) == ["lane_created"]
    assert lane.events[0].revision == 1
    assert lane.events[0].lane_id == LANE
    assert lane.snapshot().revision == 1
    assert not lane.snapshot().HasField("operation")


def test_start_run_places_captured_inbox_then_prompt_then_updates_queue() -> None:
    lane = Lane()
    lane.enqueue(queued_message("q-next", NEXT_RUN, "queued for the next run"))
    lane.enqueue(queued_custom("q-write", "note", '{"n": 18446744073709551617}'))
    lane.enqueue(queued_message("q-steer", STEER, "steer"))
    before = lane.state.revision
    t = lane.start_run(user("prompt"))
    assert kinds(t) == [
        "run_start",
        "message_start", "message_end", "entry_added",  # q-next
        "entry_added",  # q-write (a custom entry: no message lifecycle)
        "message_start", "message_end", "entry_added",  # q-steer (captured by ALL)
        "message_start", "message_end", "entry_added",  # the prompt
        "queue_update",
    ]  # fmt: skip
    assert t.events[0].revision == before + 1
    assert t.events[0].run_start.run_id == RUN
    assert [e.id for e in t.entries][:3] == ["q-next", "q-write", "q-steer"]
    assert t.entries[1].custom.data_json == '{"n": 18446744073709551617}'
    assert list(of_kind(t, "queue_update")[0].queue_update.queues) == []
    assert lane.state.message_count == 3  # the custom entry is not a message
    assert lane.state.operation is not None
    assert lane.state.operation.from_tip_id == ""
    assert lane.state.tip_id == t.entries[-1].id


def test_start_run_without_capture_emits_no_queue_update() -> None:
    lane = Lane()
    t = lane.start_run(user("prompt"))
    assert kinds(t) == ["run_start", "message_start", "message_end", "entry_added"]


def test_start_turn_places_steering_before_turn_start() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    assert kinds(lane.start_turn("turn-1")) == ["turn_start"]
    lane.settle("turn-1", assistant(text("done"), stop_reason=messages_pb2.STOP_REASON_STOP))
    lane.enqueue(queued_message("s-1", STEER, "also this"))
    t = lane.start_turn("turn-2")
    assert kinds(t) == ["message_start", "message_end", "entry_added", "queue_update", "turn_start"]
    assert t.events[-1].turn_start.turn_id == "turn-2"
    assert lane.state.operation is not None
    assert lane.state.operation.phase == Phase.TURN_OPEN


def test_settle_assistant_without_tools_ends_the_turn() -> None:
    lane = Lane()
    lane.start_run(user("hi"))
    lane.start_turn("turn-1")
    message = assistant(text("hello"), usage=usage(10), stop_reason=messages_pb2.STOP_REASON_STOP)
    t = lane.settle("turn-1", message)
    assert kinds(t) == ["message_end", "entry_added", "usage", "turn_end"]
    assert t.events[0].message_end.entry_id == t.entries[0].id
    assert t.usage_rows[0].entry_id == t.entries[0].id
    assert t.events[-1].turn_end.message == message
    assert list(t.events[-1].turn_end.tool_results) == []
    operation = lane.state.operation
    assert operation is not None
    assert operation.phase == Phase.IDLE
    assert operation.continuation == Continuation.MAY_FINISH
    assert lane.state.usage_totals == usage(10)


def test_settle_assistant_with_tools_opens_a_planned_batch_without_turn_end() -> None:
    lane = Lane()
    lane.start_run(user("hi"))
    lane.start_turn("turn-1")
    message = assistant(
        text("a"), tool_call("c-0", "read", BIG_ARGS), text("b"), tool_call("c-1", "bash", "{}")
    )
    t = lane.settle("turn-1", message)
    assert kinds(t) == ["message_end", "entry_added"]
    batch = lane.batch
    assert batch.assistant_entry_id == t.entries[0].id
    assert [(c.source_index, c.tool_call_id, c.tool_name, c.status) for c in batch.calls] == [
        (1, "c-0", "read", CallStatus.PLANNED),
        (3, "c-1", "bash", CallStatus.PLANNED),
    ]
    assert len({c.result_entry_id for c in batch.calls}) == 2
    assert list(lane.snapshot().operation.running_tools) == []  # planned → not shown


# --- tool commits -----------------------------------------------------------------------------


def test_intent_emits_only_tool_start_with_the_effective_arguments_verbatim() -> None:
    lane = lane_with_batch(("c-0", "read", BIG_ARGS))
    before = lane.state.revision
    t = lane.start_tool("c-0", EFFECTIVE_ARGS)
    assert kinds(t) == ["tool_start"]
    start = t.events[0].tool_start
    assert (start.run_id, start.turn_id, start.tool_call_id, start.tool_name) == (
        RUN,
        "turn-1",
        "c-0",
        "read",
    )
    assert start.arguments_json == EFFECTIVE_ARGS  # byte for byte, big integer intact
    assert t.events[0].revision == before + 1
    call = lane.call("c-0")
    assert call.status == CallStatus.EFFECT_PENDING
    assert call.arguments_json == EFFECTIVE_ARGS
    row = lane.snapshot().operation.running_tools[0]
    assert row.WhichOneof("state") == "running"
    assert row.running.arguments_json == EFFECTIVE_ARGS
    assert not row.running.HasField("result")


def test_intent_keeps_the_replay_policy() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "read", "{}"))
    now = lane.tick()
    lane.commit(lambda s: tools.start_tool_call(s, RUN, "c-0", "{}", SAFE, now))
    lane.start_tool("c-1")
    assert lane.call("c-0").replay == SAFE
    assert lane.call("c-1").replay == NEVER


def test_progress_emits_only_tool_update_and_a_checkpoint_is_kept_separately() -> None:
    lane = lane_with_batch(("c-0", "bash", '{"command":"make"}'))
    lane.start_tool("c-0")
    first = result("compiling", details_json='{"lines": 1}')
    t = lane.update_tool("c-0", first, checkpoint=True)
    assert kinds(t) == ["tool_update"]
    update = t.events[0].tool_update
    assert update.partial_result == first
    assert update.checkpoint is True
    second = result("linking")
    t = lane.update_tool("c-0", second)
    assert kinds(t) == ["tool_update"]
    assert t.events[0].tool_update.checkpoint is False
    call = lane.call("c-0")
    assert call.progress == second  # the latest progress is what a running row shows
    assert call.checkpoint == first  # the latest checkpoint survives a plain update
    assert lane.snapshot().operation.running_tools[0].running.result == second


def test_staging_an_effect_pending_call_emits_only_tool_end() -> None:
    lane = lane_with_batch(("c-0", "read", '{"path":"a"}'), ("c-1", "read", '{"path":"b"}'))
    lane.start_tool("c-0", EFFECTIVE_ARGS)
    lane.update_tool("c-0", result("partial"), checkpoint=True)
    final = result(
        "contents", details_json='{"bytes": 12345678901234567890}', usage=usage(3), added=["edit"]
    )
    t = lane.stage("c-0", executed(final))
    assert kinds(t) == ["tool_end"]  # no tool_start, and placement is a separate commit
    end = t.events[0].tool_end
    assert (end.run_id, end.turn_id, end.tool_call_id, end.tool_name) == (
        RUN,
        "turn-1",
        "c-0",
        "read",
    )
    assert end.result == final
    assert end.is_error is False
    assert end.terminate is False
    call = lane.call("c-0")
    assert call.status == CallStatus.OUTCOME_READY
    assert call.progress is None and call.checkpoint is None
    assert call.arguments_json == EFFECTIVE_ARGS
    assert call.result_message is not None
    assert call.result_message.tool_call_id == "c-0"
    assert call.result_message.details_json == '{"bytes": 12345678901234567890}'
    assert list(call.result_message.added_tool_names) == ["edit"]
    row = lane.snapshot().operation.running_tools[0]
    assert row.WhichOneof("state") == "settled"
    assert row.settled.arguments_json == EFFECTIVE_ARGS
    assert row.settled.result == final


def test_staged_result_without_optional_fields_keeps_them_absent() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"))
    lane.start_tool("c-0")
    bare = messages_pb2.ToolResult(content=[text("ok")])
    end = lane.stage("c-0", executed(bare, is_error=True)).events[0].tool_end
    assert not end.result.HasField("details_json")
    assert not end.result.HasField("usage")
    assert list(end.result.added_tool_names) == []
    assert end.is_error is True
    message = lane.call("c-0").result_message
    assert message is not None
    assert not message.HasField("details_json")
    assert not message.HasField("usage")
    assert message.is_error is True


SYNTHETIC_FROM_PLANNED = [
    pytest.param(
        synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL),
        results.UNKNOWN_TOOL_TEXT.format(name="nope"),
        False,
        id="unknown-tool",
    ),
    pytest.param(
        synthetic(Cause.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, "path: required"),
        "path: required",
        False,
        id="invalid-arguments",
    ),
    pytest.param(
        synthetic(Cause.SYNTHETIC_CAUSE_DENIED, "not in this repo"),
        "not in this repo",
        False,
        id="denied",
    ),
    pytest.param(
        synthetic(Cause.SYNTHETIC_CAUSE_DENIED, "stop here", terminate=True),
        "stop here",
        True,
        id="denied-terminate",
    ),
    pytest.param(
        synthetic(Cause.SYNTHETIC_CAUSE_TRUNCATED),
        results.TRUNCATED_TEXT.format(name="nope"),
        False,
        id="truncated",
    ),
    pytest.param(
        synthetic(Cause.SYNTHETIC_CAUSE_CANCELLED), results.CANCELLED_TEXT, False, id="cancelled"
    ),
    pytest.param(
        # A real outcome cannot be staged for a planned call, but the terminate a synthetic
        # denial asks for is the only terminate a synthetic can carry.
        synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL, terminate=True),
        results.UNKNOWN_TOOL_TEXT.format(name="nope"),
        False,
        id="unknown-tool-terminate-ignored",
    ),
]


@pytest.mark.parametrize(("outcome", "expected_text", "terminate"), SYNTHETIC_FROM_PLANNED)
def test_staging_a_planned_call_emits_tool_start_with_source_args_then_tool_end(
    outcome: Synthetic, expected_text: str, terminate: bool
) -> None:
    # A truncated outcome is for calls of a message cut off for length.
    stop = LENGTH if outcome.cause == Cause.SYNTHETIC_CAUSE_TRUNCATED else TOOL_USE
    lane = lane_with_batch(("c-0", "nope", BIG_ARGS), stop_reason=stop)
    if outcome.cause == Cause.SYNTHETIC_CAUSE_CANCELLED:
        lane.abort()  # a cancelled outcome follows a durable abort
    t = lane.stage("c-0", outcome)
    assert kinds(t) == ["tool_start", "tool_end"]
    start, end = t.events[0].tool_start, t.events[1].tool_end
    assert start.arguments_json == BIG_ARGS  # the source block, byte for byte
    assert (start.tool_call_id, start.tool_name, start.run_id, start.turn_id) == (
        "c-0",
        "nope",
        RUN,
        "turn-1",
    )
    assert (end.tool_call_id, end.tool_name) == ("c-0", "nope")
    assert end.is_error is True
    assert end.terminate is terminate
    assert end.result == messages_pb2.ToolResult(content=[text(expected_text)], terminate=terminate)
    assert not end.result.HasField("details_json")  # synthetics never invent details
    assert not end.result.HasField("usage")
    call = lane.call("c-0")
    assert call.status == CallStatus.OUTCOME_READY
    assert call.arguments_json is None  # no intent was ever written
    assert call.terminate is terminate
    row = lane.snapshot().operation.running_tools[0]
    assert row.settled.arguments_json == BIG_ARGS
    assert row.settled.is_error is True


def test_cancelled_after_intent_emits_only_tool_end() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"))
    lane.start_tool("c-0")
    lane.abort()
    t = lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_CANCELLED))
    assert kinds(t) == ["tool_end"]
    assert t.events[0].tool_end.result.content[0].text.text == results.CANCELLED_TEXT


def test_interruption_keeps_checkpoint_content_details_usage_and_appends_the_notice() -> None:
    lane = lane_with_batch(("c-0", "bash", '{"command":"deploy"}'))
    lane.start_tool("c-0")
    checkpoint = result(
        "step 1 done",
        details_json='{"step": 1}',
        usage=usage(7),
        added=["ignored-tool"],
        terminate=True,
    )
    lane.update_tool("c-0", checkpoint, checkpoint=True)
    lane.update_tool("c-0", result("step 2 running (live only)"))  # not a checkpoint
    t = lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_INTERRUPTED))
    assert kinds(t) == ["tool_end"]
    end = t.events[0].tool_end
    assert [block.text.text for block in end.result.content] == [
        "step 1 done",
        results.INTERRUPTED_TEXT,
    ]
    assert end.result.details_json == '{"step": 1}'
    assert end.result.usage == usage(7)
    assert list(end.result.added_tool_names) == []  # the checkpoint's added tools are ignored
    assert end.result.terminate is False and end.terminate is False
    assert end.is_error is True


def test_interruption_without_checkpoint_is_only_the_notice() -> None:
    lane = lane_with_batch(("c-0", "bash", "{}"))
    lane.start_tool("c-0")
    lane.update_tool("c-0", result("live only"))  # progress, but no checkpoint
    end = lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_INTERRUPTED)).events[0].tool_end
    assert end.result == messages_pb2.ToolResult(content=[text(results.INTERRUPTED_TEXT)])
    assert not end.result.HasField("usage")


# --- placement --------------------------------------------------------------------------------


def test_placement_group_per_call_then_config_update_then_turn_end() -> None:
    lane = lane_with_batch(
        ("c-0", "read", '{"path":"a"}'),
        ("c-1", "nope", '{"x":1}'),
        ("c-2", "grep", '{"pattern":"p"}'),
        usage_of_assistant=usage(100),
    )
    assert lane.state.configuration.active_tool_names == ["read", "bash"]
    assistant_entry = lane.batch.assistant_entry_id
    batch_assistant = lane.batch.assistant
    entry_ids = [c.result_entry_id for c in lane.batch.calls]
    lane.start_tool("c-0")
    lane.stage(
        "c-0", executed(result("A", usage=usage(5), added=["edit", "read"]))
    )  # "read" is already active
    lane.stage("c-1", synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL))
    lane.start_tool("c-2")
    lane.stage("c-2", executed(result("C", added=["edit", "write"]), is_error=True))
    messages = [lane.call(c).result_message for c in ("c-0", "c-1", "c-2")]
    count, totals = lane.state.message_count, lane.state.usage_totals
    before = lane.state.revision
    t = lane.place()
    assert kinds(t) == [
        "message_start", "message_end", "entry_added", "usage",  # c-0 (has usage)
        "message_start", "message_end", "entry_added",  # c-1
        "message_start", "message_end", "entry_added",  # c-2
        "config_update",
        "turn_end",
    ]  # fmt: skip
    assert t.events[0].revision == before + 1
    assert [e.message_end.entry_id for e in of_kind(t, "message_end")] == entry_ids
    assert [e.message_start.message.tool_result for e in of_kind(t, "message_start")] == messages
    assert [e.id for e in t.entries] == entry_ids
    assert t.entries[0].parent_id == assistant_entry
    assert [e.message.message.tool_result for e in t.entries] == messages
    assert [e.seq for e in t.entries] == [e.revision for e in of_kind(t, "entry_added")]
    (row,) = t.usage_rows
    assert row.entry_id == entry_ids[0]
    assert row.usage == usage(5)
    assert row.adjustment is False
    change = of_kind(t, "config_update")[0].config_update
    assert list(change.active_tools.previous) == ["read", "bash"]
    assert list(change.active_tools.value) == ["read", "bash", "edit", "write"]
    assert not change.HasField("model") and not change.HasField("thinking_level")
    turn_end = t.events[-1].turn_end
    assert (turn_end.run_id, turn_end.turn_id) == (RUN, "turn-1")
    assert turn_end.message == batch_assistant
    assert list(turn_end.tool_results) == messages  # all results, source order
    assert lane.state.configuration.active_tool_names == ["read", "bash", "edit", "write"]
    assert lane.state.message_count == count + 3
    assert lane.state.usage_totals != totals
    assert lane.state.tip_id == entry_ids[-1]
    operation = lane.state.operation
    assert operation is not None
    assert (operation.phase, operation.batch, operation.turn_id) == (Phase.IDLE, None, None)
    assert operation.continuation == Continuation.NEED_ASSISTANT
    assert [e.message.terminate for e in t.entries] == [False, False, False]


def test_turn_end_carries_the_batch_assistant_message() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"))
    message = lane.batch.assistant
    lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL))
    t = lane.place()
    assert t.events[-1].turn_end.message == message


def test_placement_without_new_tools_or_usage_has_neither_event() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"))
    lane.start_tool("c-0")
    lane.stage("c-0", executed(result("A", added=["bash"])))  # already active
    t = lane.place()
    assert kinds(t) == ["message_start", "message_end", "entry_added", "turn_end"]


def test_batch_where_every_call_terminates_may_finish_and_entries_carry_terminate() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "bash", "{}"))
    lane.start_tool("c-0")
    lane.stage("c-0", executed(result("A", terminate=True)))
    end = lane.stage("c-1", synthetic(Cause.SYNTHETIC_CAUSE_DENIED, "no", terminate=True))
    assert end.events[-1].tool_end.terminate is True
    t = lane.place()
    assert [e.message.terminate for e in t.entries] == [True, True]
    operation = lane.state.operation
    assert operation is not None
    assert operation.continuation == Continuation.MAY_FINISH


def test_one_non_terminating_call_means_the_run_needs_the_assistant_again() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "bash", "{}"))
    lane.start_tool("c-0")
    lane.stage("c-0", executed(result("A", terminate=True)))
    lane.stage("c-1", synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL))
    t = lane.place()
    assert [e.message.terminate for e in t.entries] == [True, False]
    operation = lane.state.operation
    assert operation is not None
    assert operation.continuation == Continuation.NEED_ASSISTANT


def test_place_ready_with_nothing_ready_commits_nothing() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"))
    before = lane.state
    t = lane.place()
    assert t.events == () and t.entries == () and t.usage_rows == ()
    assert t.state == before


# --- lane-level commits -----------------------------------------------------------------------


def test_enqueue_emits_queue_update_with_the_whole_queue() -> None:
    lane = Lane()
    first = queued_message("q-1", STEER, "a")
    second = queued_custom("q-2", "note", "[1, 2.0, 12345678901234567890]")
    lane.enqueue(first)
    t = lane.enqueue(second)
    assert kinds(t) == ["queue_update"]
    assert list(t.events[0].queue_update.queues) == [first, second]
    assert second.kind == WRITE


def test_record_usage_emits_usage_with_new_totals() -> None:
    lane = Lane()
    now = lane.tick()
    t = lane.commit(lambda s: runs.record_usage(s, "u-1", usage(4), None, True, now))
    assert kinds(t) == ["usage"]
    body = t.events[0].usage
    assert body.totals == usage(4)
    assert body.row.id == "u-1" and body.row.adjustment is True
    assert not body.row.HasField("entry_id")
    t = lane.commit(lambda s: runs.record_usage(s, "u-2", usage(1), "e-9", False, now))
    assert t.events[0].usage.totals == usage(5)
    assert t.events[0].usage.row.entry_id == "e-9"


def test_update_config_emits_one_event_naming_only_what_changed() -> None:
    lane = Lane()
    now = lane.tick()
    t = lane.commit(
        lambda s: lanes.update_config(
            s,
            now,
            model=snapshot_pb2.ModelRef(provider="acme", model_id="m-2"),
            thinking_level=snapshot_pb2.THINKING_LEVEL_LOW,  # unchanged
            active_tool_names=["read"],
        )
    )
    assert kinds(t) == ["config_update"]
    change = t.events[0].config_update
    assert change.model.value.model_id == "m-2" and change.model.previous.model_id == "m-1"
    assert not change.HasField("thinking_level")
    assert list(change.active_tools.value) == ["read"]
    assert list(change.active_tools.previous) == ["read", "bash"]
    unchanged = lane.commit(lambda s: lanes.update_config(s, now, active_tool_names=["read"]))
    assert unchanged.events == ()
    assert unchanged.state.revision == t.state.revision


def test_update_config_can_clear_the_active_tools_and_the_thinking_level() -> None:
    lane = Lane()
    now = lane.tick()
    t = lane.commit(
        lambda s: lanes.update_config(
            s,
            now,
            thinking_level=snapshot_pb2.THINKING_LEVEL_UNSPECIFIED,
            active_tool_names=[],
        )
    )
    assert kinds(t) == ["config_update"]
    assert list(lane.state.configuration.active_tool_names) == []
    assert lane.state.configuration.thinking_level == snapshot_pb2.THINKING_LEVEL_UNSPECIFIED


def test_end_run_completed_records_the_result() -> None:
    lane = Lane()
    lane.start_run(user("hi"))
    lane.start_turn("turn-1")
    lane.settle("turn-1", assistant(text("bye"), stop_reason=messages_pb2.STOP_REASON_STOP))
    tip = lane.state.tip_id
    t = lane.end_run(snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    assert kinds(t) == ["run_end"]
    end = t.events[0].run_end
    assert end.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    assert (end.run_id, end.from_tip_id, end.tip_id) == (RUN, "", tip)
    assert not end.HasField("error")
    assert lane.state.operation is None
    last = lane.state.last_result
    assert last is not None and last.operation_id == RUN
    assert last.started_time.ToDatetime().second == 1  # the run started at tick 1


def test_end_run_failed_records_the_error() -> None:
    lane = Lane()
    lane.start_run(user("hi"))
    error = snapshot_pb2.OperationError(code="MODEL", message="overloaded", details_json="[1]")
    t = lane.end_run(snapshot_pb2.OPERATION_RESULT_STATUS_FAILED, error)
    assert t.events[0].run_end.error == error
    assert lane.state.last_result is not None
    assert lane.state.last_result.error == error


def test_revisions_continue_across_commits() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "read", "{}"))
    lane.start_tool("c-0")
    lane.start_tool("c-1")
    lane.stage("c-1", executed(result("B")))
    lane.stage("c-0", executed(result("A")))
    lane.place()
    lane.end_run(snapshot_pb2.OPERATION_RESULT_STATUS_FAILED)
    assert [e.revision for e in lane.events] == list(range(1, len(lane.events) + 1))
    assert all(e.lane_id == LANE for e in lane.events)
    assert [e.seq for e in lane.transcript] == [
        e.revision for e in lane.events if e.WhichOneof("kind") == "entry_added"
    ]
