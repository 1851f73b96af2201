"""Abort and the terminal commit (docs/recovery.md; docs/contract.md, "unsafe interruption")."""

from __future__ import annotations

from lane.v1 import messages_pb2, snapshot_pb2
from lane.v1.lane_service_pb2 import REPLAY_POLICY_NEVER as NEVER

from lane.server.domain import results, runs, tools
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.state import CallStatus, Continuation
from tests.unit.domain.support import (
    ABORTED,
    COMPLETED,
    FAILED,
    FOLLOW_UP,
    NEXT_RUN,
    RUN,
    STEER,
    Cause,
    Lane,
    assistant,
    executed,
    kinds,
    lane_with_batch,
    of_kind,
    placed_tool_result_ids,
    queued_custom,
    queued_message,
    result,
    row_ids,
    synthetic,
    text,
    tool_call,
    usage,
    user,
)

# --- the abort commit -------------------------------------------------------------------------


def test_abort_drains_steering_and_follow_up_into_the_event_then_updates_the_queue() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    items = [
        queued_message("s-1", STEER, "steer one"),
        queued_message("f-1", FOLLOW_UP, "follow one"),
        queued_message("n-1", NEXT_RUN, "next run"),
        queued_custom("w-1", "note", "{}"),
        queued_message("s-2", STEER, "steer two"),
    ]
    for item in items:
        lane.enqueue(item)
    t = lane.abort()
    assert kinds(t) == ["operation_abort", "queue_update"]
    abort = t.events[0].operation_abort
    assert abort.operation_id == RUN
    assert list(abort.steer) == [user("steer one"), user("steer two")]
    assert list(abort.follow_up) == [user("follow one")]
    assert [i.entry_id for i in t.events[1].queue_update.queues] == ["n-1", "w-1"]
    assert [i.entry_id for i in lane.state.inbox] == ["n-1", "w-1"]
    assert lane.state.operation is not None and lane.state.operation.cancel_requested
    assert lane.snapshot().operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING


def test_abort_with_nothing_to_drain_emits_only_operation_abort() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.enqueue(queued_message("n-1", NEXT_RUN, "later"))
    t = lane.abort()
    assert kinds(t) == ["operation_abort"]
    assert [i.entry_id for i in lane.state.inbox] == ["n-1"]


def test_a_second_abort_commits_nothing() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.abort()
    lane.enqueue(queued_message("s-9", STEER, "late steer"))
    before = lane.state
    t = lane.abort()
    assert t.events == ()
    assert t.state == before
    assert t.state.revision == before.revision


# --- what cancellation refuses and what it still admits ---------------------------------------


def test_after_abort_no_new_intent_and_no_new_turn() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "read", "{}"))
    lane.abort()
    now = lane.tick()
    lane.refuse(
        lambda s: tools.start_tool_call(s, RUN, "c-0", "{}", NEVER, now),
        "OPERATION_CANCELLED",
        FailedPrecondition,
    )
    lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_CANCELLED))
    lane.stage("c-1", synthetic(Cause.SYNTHETIC_CAUSE_CANCELLED))
    lane.place()
    lane.refuse(
        lambda s: runs.start_turn(s, RUN, "turn-2", now), "OPERATION_CANCELLED", FailedPrecondition
    )


def test_a_real_result_staged_after_abort_is_kept_with_terminate_forced_false() -> None:
    lane = lane_with_batch(("c-0", "bash", '{"cmd":"x"}'))
    lane.start_tool("c-0")
    lane.abort()
    final = result("done anyway", details_json='{"exit": 0}', usage=usage(2), terminate=True)
    t = lane.stage("c-0", executed(final))
    assert kinds(t) == ["tool_end"]
    end = t.events[0].tool_end
    assert end.terminate is False
    assert end.result.terminate is False
    assert end.result.content[0].text.text == "done anyway"
    assert end.result.details_json == '{"exit": 0}'
    call = lane.call("c-0")
    assert call.status == CallStatus.OUTCOME_READY
    assert call.terminate is False
    assert lane.snapshot().operation.running_tools[0].settled.result.terminate is False
    placed = lane.place()
    assert placed.entries[0].message.terminate is False
    operation = lane.state.operation
    assert operation is not None
    assert operation.continuation == Continuation.NEED_ASSISTANT


def test_a_denial_with_terminate_after_abort_is_forced_false() -> None:
    lane = lane_with_batch(("c-0", "bash", "{}"))
    lane.abort()
    t = lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_DENIED, "no", terminate=True))
    assert t.events[1].tool_end.terminate is False
    assert lane.call("c-0").terminate is False


def test_progress_of_a_running_call_is_still_accepted_after_abort() -> None:
    lane = lane_with_batch(("c-0", "bash", "{}"))
    lane.start_tool("c-0")
    lane.abort()
    assert kinds(lane.update_tool("c-0", result("still going"), checkpoint=True)) == ["tool_update"]


# --- the terminal commit ----------------------------------------------------------------------


def test_end_run_settles_an_unfinished_batch_and_ends_aborted() -> None:
    # Parallel calls leave planned in source order, so a planned call can only follow the
    # started ones.
    lane = lane_with_batch(
        ("c-0", "read", '{"path":"0"}'),  # outcome_ready (placeable at once)
        ("c-1", "bash", '{"cmd":"1"}'),  # effect_pending with a checkpoint
        ("c-2", "read", '{"path":"2"}'),  # outcome_ready behind c-1
        ("c-3", "bash", '{"cmd":"3"}'),  # effect_pending, no checkpoint
        ("c-4", "read", '{"path":"4", "n": 9007199254740993}'),  # planned
    )
    for call_id in ("c-0", "c-1", "c-2", "c-3"):
        lane.start_tool(call_id)
    lane.stage("c-0", executed(result("zero")))
    checkpoint = result("half", details_json='{"pct": 50}', usage=usage(9), added=["x"])
    lane.update_tool("c-1", checkpoint, checkpoint=True)
    lane.update_tool("c-1", result("60% (not durable)"))
    lane.stage("c-2", executed(result("two", terminate=True)))
    lane.update_tool("c-3", result("live only"))
    lane.abort()
    entry_ids = [call.result_entry_id for call in lane.batch.calls]
    tool_args = {call.tool_call_id: call.arguments_json for call in lane.batch.calls}

    t = lane.end_run(COMPLETED)  # asked COMPLETED; an aborted run always ends ABORTED
    assert kinds(t) == [
        "message_start", "message_end", "entry_added",  # c-0 placed
        "tool_end",  # c-1 interrupted (end only)
        "message_start", "message_end", "entry_added", "usage",  # c-1 (checkpoint usage)
        "message_start", "message_end", "entry_added",  # c-2 (already staged)
        "tool_end",  # c-3 interrupted (end only)
        "message_start", "message_end", "entry_added",  # c-3
        "tool_start", "tool_end",  # c-4 cancelled synthetic (start + end)
        "message_start", "message_end", "entry_added",  # c-4 placed
        "turn_end",
        "run_end",
    ]  # fmt: skip
    assert [e.id for e in t.entries] == entry_ids
    starts = of_kind(t, "tool_start")
    assert [s.tool_start.tool_call_id for s in starts] == ["c-4"]
    assert starts[0].tool_start.arguments_json == '{"path":"4", "n": 9007199254740993}'
    assert tool_args["c-4"] is None
    ends = {e.tool_end.tool_call_id: e.tool_end for e in of_kind(t, "tool_end")}
    assert set(ends) == {"c-1", "c-3", "c-4"}
    assert ends["c-4"].result == messages_pb2.ToolResult(content=[text(results.CANCELLED_TEXT)])
    interrupted = ends["c-1"].result
    assert [b.text.text for b in interrupted.content] == ["half", results.INTERRUPTED_TEXT]
    assert interrupted.details_json == '{"pct": 50}'
    assert interrupted.usage == usage(9)
    assert list(interrupted.added_tool_names) == []
    assert ends["c-3"].result == messages_pb2.ToolResult(content=[text(results.INTERRUPTED_TEXT)])
    assert all(end.is_error and not end.terminate for end in ends.values())
    assert t.usage_rows[0].entry_id == entry_ids[1]
    turn_end = of_kind(t, "turn_end")[0].turn_end
    assert [m.tool_call_id for m in turn_end.tool_results] == ["c-0", "c-1", "c-2", "c-3", "c-4"]
    assert [e.message.terminate for e in t.entries] == [False, False, True, False, False]
    run_end = t.events[-1].run_end
    assert run_end.status == ABORTED
    assert not run_end.HasField("error")
    assert run_end.tip_id == entry_ids[-1]
    assert lane.state.operation is None
    assert lane.state.last_result is not None and lane.state.last_result.status == ABORTED
    assert placed_tool_result_ids(lane.transcript) == ["c-0", "c-1", "c-2", "c-3", "c-4"]


def test_end_run_of_an_aborted_run_drops_a_failure_error() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.abort()
    error = snapshot_pb2.OperationError(code="X", message="y")
    t = lane.end_run(FAILED, error)
    assert t.events[-1].run_end.status == ABORTED
    assert not t.events[-1].run_end.HasField("error")
    assert lane.state.last_result is not None
    assert not lane.state.last_result.HasField("error")


def test_end_run_failed_without_abort_also_settles_the_batch() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "bash", "{}"))
    lane.start_tool("c-0")
    error = snapshot_pb2.OperationError(code="DRIVER", message="gone")
    t = lane.end_run(FAILED, error)
    assert kinds(t) == [
        "tool_end", "message_start", "message_end", "entry_added",
        "tool_start", "tool_end", "message_start", "message_end", "entry_added",
        "turn_end",
        "run_end",
    ]  # fmt: skip
    assert t.events[-1].run_end.status == FAILED
    assert t.events[-1].run_end.error == error
    assert row_ids(lane.snapshot()) == []


def test_end_run_completed_with_an_open_batch_and_no_abort_is_refused() -> None:
    lane = lane_with_batch(("c-0", "read", "{}"))
    lane.start_tool("c-0")
    now = lane.tick()
    lane.refuse(
        lambda s: runs.end_run(s, RUN, COMPLETED, None, now, lane.ids),
        "WRONG_RUN_PHASE",
        FailedPrecondition,
    )
    lane.stage("c-0", executed(result("a")))
    lane.refuse(  # staged but not placed: still an open batch
        lambda s: runs.end_run(s, RUN, COMPLETED, None, now, lane.ids),
        "WRONG_RUN_PHASE",
        FailedPrecondition,
    )


def test_end_run_completed_with_an_open_turn_is_refused() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.start_turn("turn-1")
    now = lane.tick()
    lane.refuse(
        lambda s: runs.end_run(s, RUN, COMPLETED, None, now, lane.ids),
        "WRONG_RUN_PHASE",
        FailedPrecondition,
    )


def test_an_assistant_settled_after_abort_gets_cancelled_results_at_end_run() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.start_turn("turn-1")
    lane.abort()
    lane.settle("turn-1", assistant(text("x"), tool_call("c-0", "read", '{"a": 1}')))
    t = lane.end_run(COMPLETED)
    assert kinds(t) == [
        "tool_start", "tool_end", "message_start", "message_end", "entry_added",
        "turn_end", "run_end",
    ]  # fmt: skip
    assert t.events[0].tool_start.arguments_json == '{"a": 1}'
    assert t.events[-1].run_end.status == ABORTED


def test_end_run_with_recovery_marks_every_event_of_the_reconciliation() -> None:
    """A reconciliation after a crash marks its whole event group as recovery (the envelope's
    recovery flag), including the usage event of a placed interruption result."""
    lane = lane_with_batch(("c-0", "read", "{}"), ("c-1", "read", "{}"))
    lane.start_tool("c-0")
    lane.update_tool("c-0", result("half", usage=usage(3)), checkpoint=True)
    lane.abort()
    now = lane.tick()
    t = lane.commit(lambda s: runs.end_run(s, RUN, ABORTED, None, now, lane.ids, recovery=True))
    assert "usage" in kinds(t)
    assert [(e.WhichOneof("kind"), e.recovery) for e in t.events] == [
        (kind, True) for kind in kinds(t)
    ]
