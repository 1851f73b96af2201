"""Source-order prefix placement and sequential order (docs/contract.md, Tool calls)."""

from __future__ import annotations

from collections.abc import Callable

from lane.client.reducer import apply
from lane.v1 import events_pb2, snapshot_pb2

from lane.server.domain import tools
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.state import CallStatus, Phase
from lane.server.domain.transition import Transition
from tests.unit.domain.support import (
    NEVER,
    RUN,
    SEQUENTIAL,
    Cause,
    Lane,
    executed,
    kinds,
    lane_with_batch,
    placed_tool_result_ids,
    result,
    row_id,
    row_ids,
    synthetic,
)

CALLS = (("A", "read", '{"path":"a"}'), ("B", "bash", '{"cmd":"b"}'), ("C", "read", '{"n":3}'))


def _statuses(lane: Lane) -> list[CallStatus]:
    return [call.status for call in lane.batch.calls]


def _fold_checking_presence(
    lane: Lane,
    snapshot: snapshot_pb2.LaneSnapshot,
    events: tuple[events_pb2.HarnessEvent, ...],
    active: set[str],
) -> snapshot_pb2.LaneSnapshot:
    """Fold ``events`` one at a time; after each, every started call of the batch is in exactly
    one of runningTools or the transcript's toolResult entries (docs/contract.md, invariant 1)."""
    assistant_entry = lane.batch.assistant_entry_id if _has_batch(lane) else None
    for event in events:
        snapshot = apply(snapshot, event).snapshot
        if event.WhichOneof("kind") == "tool_start":
            active.add(event.tool_start.tool_call_id)
        rows = row_ids(snapshot)
        placed = placed_tool_result_ids(snapshot.transcript, assistant_entry)
        for call_id in ("A", "B", "C"):
            expected = 1 if call_id in active else 0
            seen = rows.count(call_id) + placed.count(call_id)
            assert seen == expected, (
                f"{call_id} shown {seen} times after {event.WhichOneof('kind')}"
            )
    return snapshot


def _has_batch(lane: Lane) -> bool:
    return lane.state.operation is not None and lane.state.operation.batch is not None


def test_parallel_batch_places_a_source_order_prefix_only() -> None:
    lane = lane_with_batch(*CALLS)
    for call_id in ("A", "B", "C"):
        lane.start_tool(call_id)
    lane.stage("B", executed(result("b done")))
    assert lane.place().events == ()  # A is not ready: nothing is placed
    lane.stage("C", executed(result("c done")))
    assert lane.place().events == ()
    assert _statuses(lane) == [
        CallStatus.EFFECT_PENDING,
        CallStatus.OUTCOME_READY,
        CallStatus.OUTCOME_READY,
    ]
    rows = lane.snapshot().operation.running_tools
    assert [row.WhichOneof("state") for row in rows] == ["running", "settled", "settled"]
    assert rows[1].settled.result == result("b done")  # the final result stays visible
    lane.stage("A", executed(result("a done")))
    entry_ids = [call.result_entry_id for call in lane.batch.calls]
    t = lane.place()
    assert kinds(t) == ["message_start", "message_end", "entry_added"] * 3 + ["turn_end"]
    assert [entry.id for entry in t.entries] == entry_ids
    assert [e.message.message.tool_result.tool_call_id for e in t.entries] == ["A", "B", "C"]
    assert [r.tool_call_id for r in t.events[-1].turn_end.tool_results] == ["A", "B", "C"]
    assert lane.state.operation is not None and lane.state.operation.phase == Phase.IDLE


def test_a_placed_prefix_lets_a_later_call_place_without_waiting_for_the_rest() -> None:
    lane = lane_with_batch(*CALLS)
    for call_id in ("A", "B", "C"):
        lane.start_tool(call_id)
    lane.stage("A", executed(result("a")))
    t = lane.place()
    assert [e.message.message.tool_result.tool_call_id for e in t.entries] == ["A"]
    assert "turn_end" not in kinds(t)
    lane.stage("B", executed(result("b")))
    t = lane.place()
    assert [e.message.message.tool_result.tool_call_id for e in t.entries] == ["B"]
    assert "turn_end" not in kinds(t)
    assert _statuses(lane) == [
        CallStatus.COMPLETED,
        CallStatus.COMPLETED,
        CallStatus.EFFECT_PENDING,
    ]
    assert row_ids(lane.snapshot()) == ["C"]


def test_parallel_scenario_keeps_every_call_visible_exactly_once_after_every_event() -> None:
    """The parallel batch of docs/contract.md (Placement): 0,1,2 start; 2 settles; 0 settles
    and is placed while 1 runs; 1 settles; 1 and 2 are placed in source order."""
    lane = lane_with_batch(*CALLS)
    active: set[str] = set()
    snapshot = lane.snapshot()
    steps: list[Callable[[], Transition]] = [
        lambda: lane.start_tool("A"),
        lambda: lane.start_tool("B"),
        lambda: lane.start_tool("C"),
        lambda: lane.update_tool("B", result("b 50%")),
        lambda: lane.stage("C", executed(result("c final"))),
        lambda: lane.place(),
        lambda: lane.stage("A", executed(result("a final"))),
        lambda: lane.place(),
        lambda: lane.stage("B", executed(result("b final"), is_error=True)),
        lambda: lane.place(),
    ]
    placed_per_step: list[list[str]] = []
    for step in steps:
        t = step()
        snapshot = _fold_checking_presence(lane, snapshot, t.events, active)
        assert snapshot == lane.snapshot()
        placed_per_step.append([e.message.message.tool_result.tool_call_id for e in t.entries])
        if _has_batch(lane) and lane.call("C").status == CallStatus.OUTCOME_READY:
            # C, blocked by earlier calls, stays settled with its final result.
            (c_row,) = [r for r in snapshot.operation.running_tools if row_id(r) == "C"]
            assert c_row.WhichOneof("state") == "settled"
            assert c_row.settled.result == result("c final")
    assert placed_per_step == [[], [], [], [], [], [], [], ["A"], [], ["B", "C"]]
    assert active == {"A", "B", "C"}


def test_entry_added_removes_only_its_own_row_and_turn_end_removes_nothing() -> None:
    lane = lane_with_batch(*CALLS)
    for call_id in ("A", "B", "C"):
        lane.start_tool(call_id)
    lane.stage("B", executed(result("b")))
    lane.stage("A", executed(result("a")))
    snapshot = lane.snapshot()
    t = lane.place()
    rows_after: list[list[str]] = []
    for event in t.events:
        snapshot = apply(snapshot, event).snapshot
        rows_after.append(row_ids(snapshot))
    assert rows_after == [
        ["A", "B", "C"],  # message_start
        ["A", "B", "C"],  # message_end
        ["B", "C"],  # entry_added A
        ["B", "C"],
        ["B", "C"],
        ["C"],  # entry_added B
    ]


def test_sequential_batch_refuses_a_later_start_until_the_earlier_call_is_placed() -> None:
    lane = lane_with_batch(*CALLS, mode=SEQUENTIAL)

    def start(call_id: str) -> None:
        now = lane.tick()
        error = lane.refuse(
            lambda s: tools.start_tool_call(s, RUN, call_id, "{}", NEVER, now),
            "SEQUENTIAL_ORDER",
            FailedPrecondition,
        )
        assert error.metadata["blockingToolCallId"] == "A"
        assert error.metadata["toolCallId"] == call_id

    start("B")  # A planned
    start("C")
    lane.start_tool("A")
    start("B")  # A effect_pending
    lane.stage("A", executed(result("a")))
    start("B")  # A outcome_ready but not placed yet
    lane.place()
    t = lane.start_tool("B")
    assert kinds(t) == ["tool_start"]
    assert _statuses(lane) == [
        CallStatus.COMPLETED,
        CallStatus.EFFECT_PENDING,
        CallStatus.PLANNED,
    ]


def test_sequential_batch_with_a_synthetic_first_call() -> None:
    lane = lane_with_batch(*CALLS, mode=SEQUENTIAL)
    lane.stage("A", synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL))
    lane.place()
    lane.start_tool("B")
    lane.stage("B", executed(result("b")))
    lane.place()
    lane.stage("C", synthetic(Cause.SYNTHETIC_CAUSE_DENIED, "no"))
    t = lane.place()
    assert kinds(t)[-1] == "turn_end"
    assert [r.tool_call_id for r in t.events[-1].turn_end.tool_results] == ["A", "B", "C"]


def test_sequential_batch_refuses_staging_a_later_call_while_an_earlier_one_is_open() -> None:
    """Shape rule (docs/contract.md): a sequential batch has at most one non-planned call after
    the completed prefix (the sequential driver settles one call at a time, in source order).
    Staging a later call's synthetic outcome while the first call is still running makes two;
    StartToolCall already refuses the same order with SEQUENTIAL_ORDER."""
    lane = lane_with_batch(*CALLS, mode=SEQUENTIAL)
    lane.start_tool("A")
    now = lane.tick()
    lane.refuse(
        lambda s: tools.stage_tool_outcome(
            s, RUN, "B", synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL), now
        ),
        None,
        FailedPrecondition,
    )


def test_parallel_batch_rows_of_a_fold_and_a_capture_agree_when_a_later_call_starts_first() -> None:
    """Fold equals capture (docs/contract.md, invariant 2) must hold for every accepted command.

    Capture lists rows in source order; a fold appends a row at its tool_start. If the domain
    accepts B's intent while the earlier call A is still planned, A's later tool_start puts A
    after B in the fold but before B in a capture. Either the out-of-order intent is refused
    (the reference harness runs intents in source order, docs/contract.md, Tool calls) or the two
    projections agree; Lane.commit checks the latter after every accepted commit.
    """
    lane = lane_with_batch(*CALLS)
    now = lane.tick()
    lane.accept_or_refuse(lambda s: tools.start_tool_call(s, RUN, "B", "{}", NEVER, now))
    for call_id in ("A", "B"):
        if lane.call(call_id).status == CallStatus.PLANNED:
            lane.start_tool(call_id)
    assert row_ids(lane.snapshot()) == ["A", "B"]


def test_parallel_batch_synthetic_for_a_later_call_then_start_of_an_earlier_one() -> None:
    """The same through the synthetic path: staging C (tool_start + tool_end) while A and B are
    still planned, then A's and B's intents."""
    lane = lane_with_batch(*CALLS)
    now = lane.tick()
    outcome = synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL)
    lane.accept_or_refuse(lambda s: tools.stage_tool_outcome(s, RUN, "C", outcome, now))
    for call_id in ("A", "B"):
        lane.start_tool(call_id)
    if lane.call("C").status == CallStatus.PLANNED:
        lane.stage("C", outcome)
    assert row_ids(lane.snapshot()) == ["A", "B", "C"]
