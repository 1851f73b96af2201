"""The snapshot reducer: seed scenarios, stale-run guards, every event kind, immutability."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import timestamp_pb2
from lane.client.reducer import EVENT_KINDS, Reduction, apply, fold, is_rebase
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2

LANE = "lane-1"
RUN = "run-1"
TURN = "turn-1"
ARGS = {
    "call-0": '{"path":"a.txt"}',
    "call-1": '{"command":"ls","timeout":30}',
    "call-2": '{"path":"b.txt","offset":9007199254740993}',
}
NAMES = {"call-0": "read", "call-1": "bash", "call-2": "read"}


# --- builders -------------------------------------------------------------------------------


def ts(seconds: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_735_689_600 + seconds)


def text(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def tool_result(value: str, details_json: str | None = None) -> messages_pb2.ToolResult:
    result = messages_pb2.ToolResult(content=[text(value)])
    if details_json is not None:
        result.details_json = details_json
    return result


def user_entry(entry_id: str, parent_id: str, seq: int) -> entries_pb2.Entry:
    message = messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text("hi")]))
    return entries_pb2.Entry(
        id=entry_id, parent_id=parent_id, seq=seq, message=entries_pb2.MessageEntry(message=message)
    )


def tool_result_entry(
    entry_id: str, parent_id: str, call_id: str, output: str, *, is_error: bool = False
) -> entries_pb2.Entry:
    message = messages_pb2.AgentMessage(
        tool_result=messages_pb2.ToolResultMessage(
            tool_call_id=call_id,
            tool_name=NAMES.get(call_id, "x"),
            content=[text(output)],
            is_error=is_error,
        )
    )
    return entries_pb2.Entry(
        id=entry_id, parent_id=parent_id, message=entries_pb2.MessageEntry(message=message)
    )


def assistant(value: str, stop: messages_pb2.StopReason.ValueType) -> messages_pb2.AssistantMessage:
    return messages_pb2.AssistantMessage(content=[text(value)], model="m", stop_reason=stop)


def pending(value: str) -> messages_pb2.AssistantMessage:
    return assistant(value, messages_pb2.STOP_REASON_PENDING)


def running(
    call_id: str, result: messages_pb2.ToolResult | None = None
) -> snapshot_pb2.SnapshotTool:
    row = snapshot_pb2.RunningTool(
        tool_call_id=call_id, tool_name=NAMES[call_id], arguments_json=ARGS[call_id]
    )
    if result is not None:
        row.result.CopyFrom(result)
    return snapshot_pb2.SnapshotTool(running=row)


def settled(
    call_id: str, result: messages_pb2.ToolResult, *, is_error: bool = False
) -> snapshot_pb2.SnapshotTool:
    return snapshot_pb2.SnapshotTool(
        settled=snapshot_pb2.SettledTool(
            tool_call_id=call_id,
            tool_name=NAMES[call_id],
            arguments_json=ARGS[call_id],
            result=result,
            is_error=is_error,
        )
    )


def idle(revision: int = 10) -> snapshot_pb2.LaneSnapshot:
    return snapshot_pb2.LaneSnapshot(
        lane_id=LANE,
        revision=revision,
        transcript=[user_entry("e-u1", "", 2)],
        tip_id="e-u1",
        configuration=snapshot_pb2.LaneConfiguration(
            model=snapshot_pb2.ModelRef(provider="p", model_id="m"),
            thinking_level=snapshot_pb2.THINKING_LEVEL_LOW,
            active_tool_names=["read", "bash"],
        ),
        stats=snapshot_pb2.LaneStats(message_count=1),
    )


def run_operation(
    *rows: snapshot_pb2.SnapshotTool, run_id: str = RUN
) -> snapshot_pb2.SnapshotOperation:
    return snapshot_pb2.SnapshotOperation(
        id=run_id,
        kind=snapshot_pb2.OPERATION_KIND_RUN,
        started_time=ts(20),
        from_tip_id="e-u1",
        status=snapshot_pb2.OPERATION_STATUS_OPEN,
        running_tools=list(rows),
    )


def in_run(*rows: snapshot_pb2.SnapshotTool, revision: int = 14) -> snapshot_pb2.LaneSnapshot:
    snapshot = idle(revision)
    snapshot.operation.CopyFrom(run_operation(*rows))
    return snapshot


class Events:
    """Builds events of LANE with increasing revisions."""

    def __init__(self, revision: int) -> None:
        self.revision = revision

    def __call__(
        self, *, lane: str = LANE, recovery: bool = False, **kind: object
    ) -> events_pb2.HarnessEvent:
        self.revision += 1
        return events_pb2.HarnessEvent(
            lane_id=lane,
            revision=self.revision,
            recovery=recovery,
            **kind,  # type: ignore[arg-type]
        )

    def tool_start(
        self, call_id: str, run_id: str = RUN, *, recovery: bool = False
    ) -> events_pb2.HarnessEvent:
        return self(
            tool_start=events_pb2.ToolStartEvent(
                run_id=run_id,
                turn_id=TURN,
                tool_call_id=call_id,
                tool_name=NAMES[call_id],
                arguments_json=ARGS[call_id],
            ),
            recovery=recovery,
        )

    def tool_update(
        self, call_id: str, result: messages_pb2.ToolResult, run_id: str = RUN
    ) -> events_pb2.HarnessEvent:
        return self(
            tool_update=events_pb2.ToolUpdateEvent(
                run_id=run_id,
                turn_id=TURN,
                tool_call_id=call_id,
                tool_name=NAMES[call_id],
                partial_result=result,
            )
        )

    def tool_end(
        self,
        call_id: str,
        result: messages_pb2.ToolResult,
        *,
        is_error: bool = False,
        run_id: str = RUN,
        recovery: bool = False,
    ) -> events_pb2.HarnessEvent:
        return self(
            tool_end=events_pb2.ToolEndEvent(
                run_id=run_id,
                turn_id=TURN,
                tool_call_id=call_id,
                tool_name=NAMES[call_id],
                result=result,
                is_error=is_error,
            ),
            recovery=recovery,
        )

    def entry_added(self, entry: entries_pb2.Entry) -> events_pb2.HarnessEvent:
        placed = entries_pb2.Entry()
        placed.CopyFrom(entry)
        placed.seq = self.revision + 1
        return self(entry_added=events_pb2.EntryAddedEvent(entry=placed))

    def turn_end(self) -> events_pb2.HarnessEvent:
        return self(turn_end=events_pb2.TurnEndEvent(run_id=RUN, turn_id=TURN))


def wire(message: snapshot_pb2.LaneSnapshot | events_pb2.HarnessEvent) -> bytes:
    return message.SerializeToString(deterministic=True)


def with_revision(snapshot: snapshot_pb2.LaneSnapshot, revision: int) -> snapshot_pb2.LaneSnapshot:
    copy = snapshot_pb2.LaneSnapshot()
    copy.CopyFrom(snapshot)
    copy.revision = revision
    return copy


def step(
    snapshot: snapshot_pb2.LaneSnapshot, event: events_pb2.HarnessEvent
) -> snapshot_pb2.LaneSnapshot:
    """apply() that also checks the universal properties: immutability and the revision."""
    before_snapshot, before_event = wire(snapshot), wire(event)
    reduction = apply(snapshot, event)
    assert wire(snapshot) == before_snapshot, "apply mutated its input snapshot"
    assert wire(event) == before_event, "apply mutated its event"
    assert reduction.snapshot is not snapshot
    if event.lane_id == snapshot.lane_id:
        assert reduction.snapshot.revision == event.revision
    else:
        assert reduction.snapshot.revision == snapshot.revision
    assert reduction.rebase is (event.WhichOneof("kind") == "navigation_end")
    return reduction.snapshot


# --- presentation helpers (tests only) --------------------------------------------------------


def row_states(snapshot: snapshot_pb2.LaneSnapshot) -> list[tuple[str, str]]:
    """(tool_call_id, running|settled) for every row, in order."""
    out: list[tuple[str, str]] = []
    for row in snapshot.operation.running_tools:
        state = row.WhichOneof("state")
        assert state is not None
        out.append((getattr(row, state).tool_call_id, state))
    return out


def placed_call_ids(snapshot: snapshot_pb2.LaneSnapshot) -> list[str]:
    return [
        entry.message.message.tool_result.tool_call_id
        for entry in snapshot.transcript
        if entry.WhichOneof("payload") == "message"
        and entry.message.message.WhichOneof("message") == "tool_result"
    ]


def assert_no_gap_or_overlap(snapshot: snapshot_pb2.LaneSnapshot, active: set[str]) -> None:
    """Invariant 1: each presentation-active call is in exactly one of the two places."""
    in_rows = [call_id for call_id, _ in row_states(snapshot)]
    in_transcript = placed_call_ids(snapshot)
    for call_id in active:
        assert in_rows.count(call_id) + in_transcript.count(call_id) == 1, (
            call_id,
            in_rows,
            in_transcript,
        )


def settled_row(snapshot: snapshot_pb2.LaneSnapshot, call_id: str) -> snapshot_pb2.SettledTool:
    for row in snapshot.operation.running_tools:
        if row.WhichOneof("state") == "settled" and row.settled.tool_call_id == call_id:
            return row.settled
    raise AssertionError(f"{call_id} has no settled row")


# === the contract's scenarios (docs/contract.md) ==================================================


def test_parallel_batch_early_settle_has_no_gap_or_overlap() -> None:
    """The parallel batch of docs/contract.md (Placement): calls 0,1,2 run; 2 settles first; 0
    settles and is placed while 1 runs; 1 settles; 1 and 2 are placed in source order. Checked
    after every event."""
    ev = Events(14)
    snapshot = in_run()
    active: set[str] = set()
    final_c = tool_result("C-final", '{"lines":3}')

    for call_id in ("call-0", "call-1", "call-2"):
        snapshot = step(snapshot, ev.tool_start(call_id))
        active.add(call_id)
        assert_no_gap_or_overlap(snapshot, active)
    assert row_states(snapshot) == [
        ("call-0", "running"),
        ("call-1", "running"),
        ("call-2", "running"),
    ]

    snapshot = step(snapshot, ev.tool_update("call-1", tool_result("1 of 2")))
    assert_no_gap_or_overlap(snapshot, active)

    # Call 2 settles before call 0: it stays, settled, with its final result.
    snapshot = step(snapshot, ev.tool_end("call-2", final_c))
    assert_no_gap_or_overlap(snapshot, active)
    assert row_states(snapshot) == [
        ("call-0", "running"),
        ("call-1", "running"),
        ("call-2", "settled"),
    ]
    assert settled_row(snapshot, "call-2").result == final_c

    # Call 0 settles and is placed while call 1 still runs.
    snapshot = step(snapshot, ev.tool_end("call-0", tool_result("A-final")))
    assert_no_gap_or_overlap(snapshot, active)
    assert row_states(snapshot) == [
        ("call-0", "settled"),
        ("call-1", "running"),
        ("call-2", "settled"),
    ]
    before_placement = row_states(snapshot)
    snapshot = step(snapshot, ev.entry_added(tool_result_entry("e-r0", "e-u1", "call-0", "A")))
    assert_no_gap_or_overlap(snapshot, active)
    # Only call 0's row went away.
    assert row_states(snapshot) == [r for r in before_placement if r[0] != "call-0"]
    assert placed_call_ids(snapshot) == ["call-0"]
    assert settled_row(snapshot, "call-2").result == final_c  # still blocked by call 1

    snapshot = step(snapshot, ev.tool_update("call-1", tool_result("2 of 2")))
    assert_no_gap_or_overlap(snapshot, active)
    assert settled_row(snapshot, "call-2").result == final_c

    snapshot = step(snapshot, ev.tool_end("call-1", tool_result("B-final"), is_error=True))
    assert_no_gap_or_overlap(snapshot, active)
    assert row_states(snapshot) == [("call-1", "settled"), ("call-2", "settled")]
    assert settled_row(snapshot, "call-1").is_error

    # Placement flushes 1 then 2, each entry_added removing only its own row.
    snapshot = step(snapshot, ev.entry_added(tool_result_entry("e-r1", "e-r0", "call-1", "B")))
    assert_no_gap_or_overlap(snapshot, active)
    assert row_states(snapshot) == [("call-2", "settled")]
    assert settled_row(snapshot, "call-2").result == final_c
    snapshot = step(snapshot, ev.entry_added(tool_result_entry("e-r2", "e-r1", "call-2", "C")))
    assert_no_gap_or_overlap(snapshot, active)
    assert row_states(snapshot) == []
    assert placed_call_ids(snapshot) == ["call-0", "call-1", "call-2"]
    assert snapshot.tip_id == "e-r2"
    assert snapshot.stats.message_count == 4

    after_turn = step(snapshot, ev.turn_end())
    assert after_turn == with_revision(snapshot, ev.revision)


def test_turn_end_removes_no_rows() -> None:
    snapshot = in_run(settled("call-0", tool_result("A")), running("call-1"))
    ev = Events(14)
    turn_end = ev(
        turn_end=events_pb2.TurnEndEvent(
            run_id=RUN,
            turn_id=TURN,
            tool_results=[messages_pb2.ToolResultMessage(tool_call_id="call-0", tool_name="read")],
        )
    )
    assert step(snapshot, turn_end) == with_revision(snapshot, 15)


def test_entry_added_removes_only_its_own_row() -> None:
    snapshot = in_run(
        settled("call-0", tool_result("A")),
        running("call-1", tool_result("p")),
        settled("call-2", tool_result("C")),
    )
    after = step(snapshot, Events(14).entry_added(tool_result_entry("e-r2", "e-u1", "call-2", "C")))
    assert row_states(after) == [("call-0", "settled"), ("call-1", "running")]
    assert after.operation.running_tools[:] == snapshot.operation.running_tools[:2]


def test_sequential_batch_holds_one_row_at_a_time() -> None:
    ev = Events(14)
    snapshot = in_run()
    parent = "e-u1"
    calls = ("call-0", "call-1", "call-2")
    for index, call_id in enumerate(calls):
        snapshot = step(snapshot, ev.tool_start(call_id))
        assert row_states(snapshot) == [(call_id, "running")]
        snapshot = step(snapshot, ev.tool_end(call_id, tool_result(f"r{index}")))
        assert row_states(snapshot) == [(call_id, "settled")]
        entry_id = f"e-r{index}"
        snapshot = step(snapshot, ev.entry_added(tool_result_entry(entry_id, parent, call_id, "r")))
        parent = entry_id
        assert row_states(snapshot) == []
        assert_no_gap_or_overlap(snapshot, set(calls[: index + 1]))


def test_synthetic_start_and_end_in_one_group_settle_with_source_arguments() -> None:
    ev = Events(14)
    synthetic = tool_result("Tool nope is unavailable.")
    snapshot = step(in_run(), ev.tool_start("call-2"))
    snapshot = step(snapshot, ev.tool_end("call-2", synthetic, is_error=True))
    row = settled_row(snapshot, "call-2")
    assert row.arguments_json == ARGS["call-2"]
    assert row.result == synthetic
    assert row.is_error
    assert not row.result.HasField("details_json")


def test_unsafe_recovery_tool_end_settles_the_captured_running_row() -> None:
    checkpoint = tool_result("40%", '{"pct":40}')
    captured = in_run(running("call-1", checkpoint), revision=30)
    interrupted = messages_pb2.ToolResult(
        content=[text("40%"), text("[interrupted]")], details_json='{"pct":40}'
    )
    after = step(captured, Events(30).tool_end("call-1", interrupted, is_error=True, recovery=True))
    assert after.operation.running_tools[:] == [settled("call-1", interrupted, is_error=True)]


# === stale / wrong run ids ======================================================================

STALE = "run-stale"


def _stale_events() -> list[events_pb2.HarnessEvent]:
    ev = Events(20)
    return [
        ev.tool_start("call-0", run_id=STALE),
        ev.tool_start("call-2", run_id=STALE),
        ev.tool_update("call-0", tool_result("stale"), run_id=STALE),
        ev.tool_end("call-0", tool_result("stale"), run_id=STALE),
        ev.tool_end("call-1", tool_result("stale"), run_id=STALE),
        ev(
            message_start=events_pb2.MessageStartEvent(
                run_id=STALE, message=messages_pb2.AgentMessage(assistant=pending("x"))
            )
        ),
        ev(message_update=events_pb2.MessageUpdateEvent(run_id=STALE, message=pending("xy"))),
        ev(message_end=events_pb2.MessageEndEvent(run_id=STALE)),
        ev(retry_scheduled=events_pb2.RetryScheduledEvent(run_id=STALE, attempt=3, max_attempts=5)),
        ev(retry_start=events_pb2.RetryStartEvent(run_id=STALE, attempt=2)),
        ev(retry_end=events_pb2.RetryEndEvent(run_id=STALE, attempt=2)),
        ev(
            run_suspend=events_pb2.RunSuspendEvent(
                run_id=STALE, deferred=snapshot_pb2.DeferredState(handle_json="{}")
            )
        ),
        ev(run_resume=events_pb2.RunResumeEvent(run_id=STALE)),
        ev(operation_abort=events_pb2.OperationAbortEvent(operation_id=STALE)),
        ev(
            run_end=events_pb2.RunEndEvent(
                run_id=STALE, status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED, tip_id="e-z"
            )
        ),
        ev(
            compaction_end=events_pb2.CompactionEndEvent(
                run_id=STALE, status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
            )
        ),
    ]


def _busy_run() -> snapshot_pb2.LaneSnapshot:
    snapshot = in_run(running("call-0", tool_result("p")), settled("call-1", tool_result("B")))
    snapshot.revision = 20
    snapshot.operation.streaming_message.CopyFrom(pending("x"))
    snapshot.operation.retry.CopyFrom(snapshot_pb2.RetryState(attempt=2, max_attempts=3))
    snapshot.operation.deferred.CopyFrom(snapshot_pb2.DeferredState(handle_json='{"h":1}'))
    return snapshot


@pytest.mark.parametrize("event", _stale_events(), ids=lambda e: str(e.WhichOneof("kind")))
def test_a_stale_run_id_never_mutates_the_operation(event: events_pb2.HarnessEvent) -> None:
    snapshot = _busy_run()
    assert step(snapshot, event) == with_revision(snapshot, event.revision)


# === tools =====================================================================================


def test_duplicate_tool_start_upserts_in_place_and_drops_the_stale_result() -> None:
    snapshot = in_run(running("call-0", tool_result("old progress")), running("call-1"))
    after = step(snapshot, Events(14).tool_start("call-0", recovery=True))
    assert after.operation.running_tools[:] == [running("call-0"), running("call-1")]
    assert not after.operation.running_tools[0].running.HasField("result")


def test_tool_start_on_a_settled_row_replaces_it_with_a_fresh_running_row() -> None:
    snapshot = in_run(settled("call-0", tool_result("A")))
    after = step(snapshot, Events(14).tool_start("call-0"))
    assert after.operation.running_tools[:] == [running("call-0")]


def test_tool_start_appends_new_rows_in_arrival_order() -> None:
    ev = Events(14)
    snapshot = step(in_run(), ev.tool_start("call-1"))
    snapshot = step(snapshot, ev.tool_start("call-0"))
    assert snapshot.operation.running_tools[:] == [running("call-1"), running("call-0")]


def test_tool_update_replaces_the_whole_progress_result() -> None:
    ev = Events(14)
    snapshot = step(in_run(running("call-1")), ev.tool_update("call-1", tool_result("a", "{}")))
    assert snapshot.operation.running_tools[0] == running("call-1", tool_result("a", "{}"))
    snapshot = step(snapshot, ev.tool_update("call-1", tool_result("ab")))
    assert snapshot.operation.running_tools[0] == running("call-1", tool_result("ab"))
    assert not snapshot.operation.running_tools[0].running.result.HasField("details_json")


def test_tool_update_on_a_settled_row_is_ignored() -> None:
    snapshot = in_run(settled("call-0", tool_result("final")))
    event = Events(14).tool_update("call-0", tool_result("late progress"))
    assert step(snapshot, event) == with_revision(snapshot, 15)


def test_tool_update_for_a_missing_row_is_ignored() -> None:
    snapshot = in_run(running("call-0"))
    event = Events(14).tool_update("call-1", tool_result("p"))
    assert step(snapshot, event) == with_revision(snapshot, 15)


def test_tool_end_settles_the_existing_row_keeping_its_arguments() -> None:
    final = messages_pb2.ToolResult(
        content=[text("done")],
        details_json='{"n":18446744073709551623}',
        usage=messages_pb2.Usage(input=3),
        added_tool_names=["grep"],
        terminate=True,
    )
    snapshot = in_run(running("call-0"), running("call-1", tool_result("partial")))
    end = Events(14).tool_end("call-1", final, is_error=True)
    end.tool_end.tool_name = "bash-renamed"
    after = step(snapshot, end)
    assert after.operation.running_tools[0] == running("call-0")
    assert after.operation.running_tools[1] == snapshot_pb2.SnapshotTool(
        settled=snapshot_pb2.SettledTool(
            tool_call_id="call-1",
            tool_name="bash-renamed",  # the name comes from the event
            arguments_json=ARGS["call-1"],  # the arguments from the row
            result=final,
            is_error=True,
        )
    )


def test_tool_end_cannot_create_a_row() -> None:
    snapshot = in_run(running("call-0"))
    event = Events(14).tool_end("call-2", tool_result("orphan"))
    assert step(snapshot, event) == with_revision(snapshot, 15)


def test_tool_end_without_result_still_gives_the_settled_row_a_result() -> None:
    event = Events(14).tool_end("call-0", tool_result("x"))
    event.tool_end.ClearField("result")
    after = step(in_run(running("call-0")), event)
    assert after.operation.running_tools[0].settled.HasField("result")


def test_tool_events_without_an_operation_are_ignored() -> None:
    ev = Events(10)
    snapshot = idle()
    for event in (
        ev.tool_start("call-0"),
        ev.tool_update("call-0", tool_result("p")),
        ev.tool_end("call-0", tool_result("f")),
    ):
        after = step(snapshot, event)
        assert after == with_revision(snapshot, event.revision)
        snapshot = after


# === one test (at least) per event kind =========================================================


def test_run_start_opens_a_run_at_the_current_tip() -> None:
    event = Events(10)(run_start=events_pb2.RunStartEvent(run_id=RUN, started_time=ts(20)))
    after = step(idle(), event)
    assert after.operation == run_operation()


def test_run_start_replaces_any_open_operation() -> None:
    snapshot = _busy_run()
    event = Events(20)(run_start=events_pb2.RunStartEvent(run_id="run-2", started_time=ts(20)))
    after = step(snapshot, event)
    assert after.operation == run_operation(run_id="run-2")


def test_run_resume_clears_deferred() -> None:
    snapshot = _busy_run()
    after = step(snapshot, Events(20)(run_resume=events_pb2.RunResumeEvent(run_id=RUN)))
    assert not after.operation.HasField("deferred")
    expected = with_revision(snapshot, 21)
    expected.operation.ClearField("deferred")
    assert after == expected


def test_run_suspend_clears_streaming_and_sets_deferred() -> None:
    snapshot = _busy_run()
    deferred = snapshot_pb2.DeferredState(handle_json='{"batch":"b1"}', poll_json='{"ms":500}')
    event = Events(20)(
        run_suspend=events_pb2.RunSuspendEvent(run_id=RUN, reason="deferred", deferred=deferred)
    )
    expected = with_revision(snapshot, 21)
    expected.operation.ClearField("streaming_message")
    expected.operation.deferred.CopyFrom(deferred)
    assert step(snapshot, event) == expected


def test_operation_abort_marks_the_matching_operation_aborting() -> None:
    event = Events(14)(
        operation_abort=events_pb2.OperationAbortEvent(
            operation_id=RUN, steer=[messages_pb2.AgentMessage(user=messages_pb2.UserMessage())]
        )
    )
    snapshot = in_run(running("call-0"))
    expected = with_revision(snapshot, 15)
    expected.operation.status = snapshot_pb2.OPERATION_STATUS_ABORTING
    assert step(snapshot, event) == expected


@pytest.mark.parametrize(
    "status",
    [
        snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
        snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
        snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
    ],
)
def test_run_end_records_the_result_and_clears_the_operation(
    status: snapshot_pb2.OperationResultStatus.ValueType,
) -> None:
    error = snapshot_pb2.OperationError(code="provider_error", message="boom")
    event = Events(14)(
        run_end=events_pb2.RunEndEvent(
            run_id=RUN,
            status=status,
            error=error,
            from_tip_id="e-u1",
            tip_id="e-a9",
            ended_time=ts(90),
        )
    )
    snapshot = in_run(running("call-0"))
    after = step(snapshot, event)
    expected = snapshot_pb2.OperationResult(
        operation_id=RUN,
        kind=snapshot_pb2.OPERATION_KIND_RUN,
        status=status,
        from_tip_id="e-u1",
        tip_id="e-a9",
        started_time=ts(20),
        ended_time=ts(90),
    )
    if status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED:
        expected.error.CopyFrom(error)
    assert after.last_result == expected
    assert not after.HasField("operation")
    assert after.tip_id == "e-a9"


def test_run_end_does_not_close_a_compaction_operation() -> None:
    snapshot = idle()
    snapshot.operation.CopyFrom(
        snapshot_pb2.SnapshotOperation(id="c-1", kind=snapshot_pb2.OPERATION_KIND_COMPACTION)
    )
    event = Events(10)(run_end=events_pb2.RunEndEvent(run_id="c-1", tip_id="e-x"))
    assert step(snapshot, event) == with_revision(snapshot, 11)


def test_fault_sets_faulted_lane_less_without_touching_the_revision() -> None:
    event = events_pb2.HarnessEvent(fault=events_pb2.FaultEvent(code="c", message="m"))
    expected = idle()
    expected.faulted = True
    assert step(idle(), event) == expected


def test_fault_of_the_lane_sets_faulted_and_the_revision() -> None:
    event = Events(10)(fault=events_pb2.FaultEvent(code="c"))
    expected = idle(11)
    expected.faulted = True
    assert step(idle(), event) == expected


@pytest.mark.parametrize(
    "kind",
    [
        {"handler_error": events_pb2.HandlerErrorEvent(error="boom", hook="before_tool")},
        {"turn_start": events_pb2.TurnStartEvent(run_id=RUN, turn_id=TURN)},
        {"turn_end": events_pb2.TurnEndEvent(run_id=RUN, turn_id=TURN)},
        {
            "value_update": events_pb2.ValueUpdateEvent(
                session_name=events_pb2.SessionNameValue(name="n")
            )
        },
        {"lane_created": events_pb2.LaneCreatedEvent(at="e-u1")},
    ],
    ids=lambda kind: next(iter(kind)),
)
def test_no_op_kinds_change_only_the_revision(kind: dict[str, Any]) -> None:
    snapshot = _busy_run()
    event = events_pb2.HarnessEvent(lane_id=LANE, revision=21, **kind)
    assert step(snapshot, event) == with_revision(snapshot, 21)


def test_lane_less_value_update_changes_nothing() -> None:
    event = events_pb2.HarnessEvent(
        value_update=events_pb2.ValueUpdateEvent(
            entry_label=events_pb2.EntryLabelValue(target_id="e-u1", label="x")
        )
    )
    assert step(idle(), event) == idle()


def test_retry_scheduled_sets_retry_and_retry_start_and_end_clear_it() -> None:
    ev = Events(14)
    snapshot = in_run()
    scheduled = ev(
        retry_scheduled=events_pb2.RetryScheduledEvent(
            run_id=RUN,
            step="s",
            attempt=2,
            max_attempts=4,
            delay_ms=1000,
            not_before_time=ts(99),
            error_message="overloaded",
        )
    )
    with_retry = step(snapshot, scheduled)
    assert with_retry.operation.retry == snapshot_pb2.RetryState(
        attempt=2, max_attempts=4, next_attempt_time=ts(99), error_message="overloaded"
    )
    for clear in (
        ev(retry_start=events_pb2.RetryStartEvent(run_id=RUN, attempt=2)),
        ev(retry_end=events_pb2.RetryEndEvent(run_id=RUN, attempt=2, success=True)),
    ):
        cleared = step(with_retry, clear)
        assert not cleared.operation.HasField("retry")
        assert cleared == with_revision(snapshot, clear.revision)


def test_message_start_streams_only_a_pending_assistant_of_the_run() -> None:
    ev = Events(14)
    snapshot = in_run()
    ignored = [
        ev(
            message_start=events_pb2.MessageStartEvent(  # no run id
                message=messages_pb2.AgentMessage(assistant=pending("a"))
            )
        ),
        ev(
            message_start=events_pb2.MessageStartEvent(  # user message
                run_id=RUN, message=messages_pb2.AgentMessage(user=messages_pb2.UserMessage())
            )
        ),
        ev(
            message_start=events_pb2.MessageStartEvent(  # settled assistant
                run_id=RUN,
                message=messages_pb2.AgentMessage(
                    assistant=assistant("a", messages_pb2.STOP_REASON_STOP)
                ),
            )
        ),
    ]
    for event in ignored:
        assert step(snapshot, event) == with_revision(snapshot, event.revision)
    start = ev(
        message_start=events_pb2.MessageStartEvent(
            run_id=RUN, message=messages_pb2.AgentMessage(assistant=pending("a"))
        )
    )
    assert step(snapshot, start).operation.streaming_message == pending("a")


def test_message_update_replaces_the_streaming_message() -> None:
    snapshot = in_run()
    snapshot.operation.streaming_message.CopyFrom(pending("a"))
    event = Events(14)(
        message_update=events_pb2.MessageUpdateEvent(
            run_id=RUN, message=pending("ab"), stream_event_json='{"delta":"b"}'
        )
    )
    assert step(snapshot, event).operation.streaming_message == pending("ab")


def test_message_end_with_the_run_id_clears_streaming_without_it_keeps_it() -> None:
    ev = Events(14)
    snapshot = in_run()
    snapshot.operation.streaming_message.CopyFrom(pending("a"))
    without_run = ev(message_end=events_pb2.MessageEndEvent(entry_id="e-a1"))
    assert step(snapshot, without_run) == with_revision(snapshot, without_run.revision)
    with_run = ev(message_end=events_pb2.MessageEndEvent(run_id=RUN, entry_id="e-a1"))
    assert step(snapshot, with_run) == with_revision(in_run(), with_run.revision)


def test_entry_added_appends_moves_the_tip_and_counts_messages() -> None:
    ev = Events(10)
    message_entry = user_entry("e-u2", "e-u1", 11)
    after = step(idle(), ev(entry_added=events_pb2.EntryAddedEvent(entry=message_entry)))
    assert after.transcript[:] == [user_entry("e-u1", "", 2), message_entry]
    assert (after.tip_id, after.stats.message_count) == ("e-u2", 2)

    custom = entries_pb2.Entry(
        id="e-k", parent_id="e-u2", custom=entries_pb2.CustomEntry(custom_type="t")
    )
    after = step(after, ev(entry_added=events_pb2.EntryAddedEvent(entry=custom)))
    assert (len(after.transcript), after.tip_id, after.stats.message_count) == (3, "e-k", 2)


def test_entry_added_compaction_replaces_the_transcript() -> None:
    compaction = entries_pb2.Entry(
        id="e-c", parent_id="e-u1", compaction=entries_pb2.CompactionEntry(summary="s")
    )
    after = step(idle(), Events(10)(entry_added=events_pb2.EntryAddedEvent(entry=compaction)))
    assert after.transcript[:] == [compaction]
    assert (after.tip_id, after.stats.message_count) == ("e-c", 1)


def test_queue_update_replaces_the_queues() -> None:
    snapshot = idle()
    snapshot.queues.add(entry_id="q-old", kind=snapshot_pb2.QUEUE_KIND_STEER)
    new = snapshot_pb2.QueuedItem(
        entry_id="q-new",
        kind=snapshot_pb2.QUEUE_KIND_WRITE,
        custom=entries_pb2.CustomEntry(custom_type="note", data_json='{"n":1}'),
    )
    after = step(snapshot, Events(10)(queue_update=events_pb2.QueueUpdateEvent(queues=[new])))
    assert after.queues[:] == [new]


def test_usage_sets_totals_of_its_own_lane_only() -> None:
    totals = messages_pb2.Usage(input=10, output=5, total_tokens=15)
    own = Events(10)(usage=events_pb2.UsageEvent(totals=totals))
    after = step(idle(), own)
    assert after.stats == snapshot_pb2.LaneStats(message_count=1, usage=totals)
    assert after.revision == 11

    other_totals = messages_pb2.Usage(input=99)
    other = events_pb2.HarnessEvent(
        lane_id="lane-2", revision=500, usage=events_pb2.UsageEvent(totals=other_totals)
    )
    after_other = step(after, other)
    assert after_other.stats.usage == totals  # another lane's totals are not this lane's
    assert after_other.revision == 11


def test_config_update_changes_only_the_parts_it_carries() -> None:
    ev = Events(10)
    snapshot = step(
        idle(),
        ev(
            config_update=events_pb2.ConfigUpdateEvent(
                thinking_level=events_pb2.ThinkingLevelChange(
                    value=snapshot_pb2.THINKING_LEVEL_HIGH
                ),
                settings=[events_pb2.SettingChange(name="steeringMode", value_json='"all"')],
            )
        ),
    )
    expected = idle(11)
    expected.configuration.thinking_level = snapshot_pb2.THINKING_LEVEL_HIGH
    assert snapshot == expected

    snapshot = step(
        snapshot,
        ev(
            config_update=events_pb2.ConfigUpdateEvent(
                model=events_pb2.ModelChange(
                    value=snapshot_pb2.ModelRef(provider="o", model_id="g")
                ),
                active_tools=events_pb2.ActiveToolsChange(value=["grep"]),
            )
        ),
    )
    assert snapshot.configuration == snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="o", model_id="g"),
        thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH,
        active_tool_names=["grep"],
    )


def test_lane_less_config_update_is_ignored() -> None:
    event = events_pb2.HarnessEvent(
        config_update=events_pb2.ConfigUpdateEvent(
            thinking_level=events_pb2.ThinkingLevelChange(value=snapshot_pb2.THINKING_LEVEL_OFF)
        )
    )
    assert step(idle(), event) == idle()


def test_compaction_start_opens_an_operation_only_when_none_is_open() -> None:
    event = Events(10)(
        compaction_start=events_pb2.CompactionStartEvent(
            run_id="c-1", reason=events_pb2.COMPACTION_REASON_MANUAL, started_time=ts(30)
        )
    )
    after = step(idle(), event)
    assert after.operation == snapshot_pb2.SnapshotOperation(
        id="c-1",
        kind=snapshot_pb2.OPERATION_KIND_COMPACTION,
        started_time=ts(30),
        from_tip_id="e-u1",
        status=snapshot_pb2.OPERATION_STATUS_OPEN,
    )
    busy = in_run(running("call-0"))
    in_run_event = Events(14)(compaction_start=events_pb2.CompactionStartEvent(run_id=RUN))
    assert step(busy, in_run_event) == with_revision(busy, 15)


def test_compaction_end_records_the_result_of_a_compaction_operation() -> None:
    ev = Events(10)
    snapshot = step(
        idle(),
        ev(compaction_start=events_pb2.CompactionStartEvent(run_id="c-1", started_time=ts(30))),
    )
    compaction = entries_pb2.Entry(id="e-c", compaction=entries_pb2.CompactionEntry(summary="s"))
    snapshot = step(snapshot, ev(entry_added=events_pb2.EntryAddedEvent(entry=compaction)))
    error = snapshot_pb2.OperationError(code="x", message="y")
    ended = step(
        snapshot,
        ev(
            compaction_end=events_pb2.CompactionEndEvent(
                run_id="c-1",
                status=snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
                error=error,
                ended_time=ts(40),
            )
        ),
    )
    assert not ended.HasField("operation")
    assert ended.last_result == snapshot_pb2.OperationResult(
        operation_id="c-1",
        kind=snapshot_pb2.OPERATION_KIND_COMPACTION,
        status=snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
        error=error,
        from_tip_id="e-u1",
        tip_id="e-c",
        started_time=ts(30),
        ended_time=ts(40),
    )


def test_in_run_compaction_end_is_ignored() -> None:
    snapshot = in_run(running("call-0"))
    event = Events(14)(
        compaction_end=events_pb2.CompactionEndEvent(
            run_id=RUN, status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
        )
    )
    assert step(snapshot, event) == with_revision(snapshot, 15)


def test_navigation_start_opens_a_navigation_operation() -> None:
    event = Events(14)(
        navigation_start=events_pb2.NavigationStartEvent(
            run_id="nav-1", target_id="e-u1", started_time=ts(50)
        )
    )
    after = step(in_run(), event)
    assert after.operation == snapshot_pb2.SnapshotOperation(
        id="nav-1",
        kind=snapshot_pb2.OPERATION_KIND_NAVIGATION,
        started_time=ts(50),
        from_tip_id="e-u1",
        status=snapshot_pb2.OPERATION_STATUS_OPEN,
    )


def test_navigation_end_signals_rebase_and_changes_only_the_revision() -> None:
    snapshot = idle()
    snapshot.operation.CopyFrom(
        snapshot_pb2.SnapshotOperation(id="nav-1", kind=snapshot_pb2.OPERATION_KIND_NAVIGATION)
    )
    event = Events(10)(
        navigation_end=events_pb2.NavigationEndEvent(
            run_id="nav-1", status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED, tip_id="e-x"
        )
    )
    reduction = apply(snapshot, event)
    assert reduction == Reduction(snapshot=with_revision(snapshot, 11), rebase=True)
    assert is_rebase(event)


# === envelope ===================================================================================


def test_events_of_another_lane_are_ignored_entirely() -> None:
    snapshot = in_run(running("call-0"))
    for kind in (
        {"run_start": events_pb2.RunStartEvent(run_id="r")},
        {"fault": events_pb2.FaultEvent()},
        {"tool_end": events_pb2.ToolEndEvent(run_id=RUN, tool_call_id="call-0")},
        {"entry_added": events_pb2.EntryAddedEvent(entry=user_entry("e-o", "", 1))},
        {"navigation_end": events_pb2.NavigationEndEvent(run_id=RUN)},
    ):
        event = events_pb2.HarnessEvent(lane_id="lane-2", revision=99, **kind)
        reduction = apply(snapshot, event)
        assert reduction == Reduction(snapshot=snapshot, rebase=False)


def test_an_unknown_event_kind_still_advances_the_revision() -> None:
    event = events_pb2.HarnessEvent(lane_id=LANE, revision=11)
    assert step(idle(), event) == idle(11)


def test_the_reducer_handles_exactly_the_28_kinds_of_the_oneof() -> None:
    oneof = events_pb2.HarnessEvent.DESCRIPTOR.oneofs_by_name["kind"]
    assert {field.name for field in oneof.fields} == EVENT_KINDS
    assert len(EVENT_KINDS) == 28


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_every_kind_with_empty_body_is_handled_on_any_lane_state(kind: str) -> None:
    for snapshot in (idle(), _busy_run()):
        event = events_pb2.HarnessEvent(lane_id=LANE, revision=snapshot.revision + 1)
        getattr(event, kind).SetInParent()
        step(snapshot, event)  # checks immutability, revision and the rebase flag


# === immutability and fold ======================================================================


def _one_event_of_every_kind() -> list[events_pb2.HarnessEvent]:
    ev = Events(20)
    events = []
    for kind in sorted(EVENT_KINDS):
        event = ev()
        getattr(event, kind).SetInParent()
        body = getattr(event, kind)
        for field in ("run_id", "operation_id"):
            if field in body.DESCRIPTOR.fields_by_name:
                setattr(body, field, RUN)
        if "tool_call_id" in body.DESCRIPTOR.fields_by_name:
            body.tool_call_id = "call-0"
        events.append(event)
    events[sorted(EVENT_KINDS).index("entry_added")].entry_added.entry.CopyFrom(
        tool_result_entry("e-r0", "e-u1", "call-0", "A")
    )
    events[sorted(EVENT_KINDS).index("message_start")].message_start.message.assistant.CopyFrom(
        pending("a")
    )
    return events


@pytest.mark.parametrize(
    "event", _one_event_of_every_kind(), ids=lambda e: str(e.WhichOneof("kind"))
)
def test_apply_never_mutates_its_inputs_and_shares_nothing_with_them(
    event: events_pb2.HarnessEvent,
) -> None:
    snapshot = _busy_run()
    snapshot_bytes, event_bytes = wire(snapshot), wire(event)
    reduction = apply(snapshot, event)
    assert wire(snapshot) == snapshot_bytes
    assert wire(event) == event_bytes
    # Changing the result must not reach back into the inputs.
    result = reduction.snapshot
    result.lane_id = "changed"
    result.transcript.add(id="new")
    result.operation.running_tools.add().running.tool_call_id = "new"
    result.stats.usage.input = 12345
    assert wire(snapshot) == snapshot_bytes
    assert wire(event) == event_bytes


def test_fold_equals_stepwise_apply_and_reports_rebase() -> None:
    ev = Events(14)
    events = [
        ev.tool_start("call-0"),
        ev.tool_end("call-0", tool_result("A")),
        ev(navigation_end=events_pb2.NavigationEndEvent(run_id="nav")),
        ev.entry_added(tool_result_entry("e-r0", "e-u1", "call-0", "A")),
    ]
    initial = in_run()
    initial_bytes = wire(initial)
    stepwise = initial
    for event in events:
        stepwise = apply(stepwise, event).snapshot
    folded = fold(initial, events)
    assert folded == Reduction(snapshot=stepwise, rebase=True)
    assert wire(initial) == initial_bytes
    assert fold(initial, events[:2]).rebase is False


def test_fold_of_no_events_is_an_equal_copy() -> None:
    initial = in_run(running("call-0"))
    folded = fold(initial, [])
    assert folded == Reduction(snapshot=initial, rebase=False)
    assert folded.snapshot is not initial


def test_fold_accepts_any_iterable() -> None:
    ev = Events(14)
    folded = fold(in_run(), (ev.tool_start("call-1") for _ in range(2)))
    assert folded.snapshot.operation.running_tools[:] == [running("call-1")]
    assert folded.snapshot.revision == 16
