"""The core invariants over random command sequences (docs/contract.md, invariants 1, 2 and 5).

A random driver issues commands against the pure domain: runs, turns, assistant messages with
0-4 tool calls (JSON arguments with integers beyond 2^53), intents, progress with and without
checkpoint, real and synthetic outcomes, placement, aborts, run ends, queue items, config and
usage. Commands the state machine refuses are part of the space: a refusal must be a documented
class and reason and must leave the state untouched. After every accepted command:

* ``fold(capture(before), transition.events) == capture(after)`` with the client reducer, the
  transcript being maintained from ``transition.entries`` (appended as a chain);
* after every single event of the fold, every presentation-active call of the current batch is
  in exactly one of ``operation.running_tools`` or the transcript's toolResult entries, and a
  call that never started is in neither;
* the commit's structure (support.check_commit) and a few per-command event shapes.

Two drivers: one starts tool calls in any order (what the protocol lets a driver send), one
lets calls leave ``planned`` in source order only (what the reference harness does).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as Stage
from hypothesis import event as note_event
from hypothesis import strategies as st
from lane.client.reducer import apply, fold
from lane.v1 import entries_pb2, events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from lane.server.domain import lanes, placement, runs, tools
from lane.server.domain.errors import FailedPrecondition, InvalidArgument, LaneError, NotFound
from lane.server.domain.run_inputs import Executed, Outcome, RunSettings, Synthetic
from lane.server.domain.state import CallStatus, LaneState, Phase
from lane.server.domain.transition import Transition
from tests.unit.domain.support import (
    ABORTED,
    COMPLETED,
    DOCUMENTED_REFUSALS,
    FAILED,
    FOLLOW_UP,
    NEXT_RUN,
    STEER,
    Ids,
    Lane,
    assert_same_snapshot,
    assistant,
    check_commit,
    kinds,
    placed_tool_result_ids,
    queued_custom,
    queued_message,
    row_ids,
    text,
    tool_call,
    usage,
    user,
)

TOOL_NAMES = ("read", "bash", "grep", "nope")

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.sampled_from([2**53 + 1, -(2**63) - 1, 2**64, 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
JSON_OBJECTS = st.builds(
    lambda value, compact: json.dumps(value, separators=(",", ":") if compact else None),
    st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4),
    st.booleans(),
)


@st.composite
def tool_results(draw: st.DrawFn) -> messages_pb2.ToolResult:
    built = messages_pb2.ToolResult(
        content=[text(value) for value in draw(st.lists(st.text(max_size=8), max_size=2))],
        added_tool_names=draw(
            st.lists(st.sampled_from(("read", "bash", "edit", "write")), max_size=2, unique=True)
        ),
        terminate=draw(st.booleans()),
    )
    if draw(st.booleans()):
        built.details_json = draw(JSON_OBJECTS)
    if draw(st.booleans()):
        built.usage.CopyFrom(usage(draw(st.integers(0, 1000))))
    return built


SyntheticCause = lane_service_pb2.SyntheticCause
# The outcomes that fit a call's status; any other one is drawn now and then.
FITTING_CAUSES: dict[CallStatus | None, list[lane_service_pb2.SyntheticCause.ValueType]] = {
    CallStatus.PLANNED: [
        SyntheticCause.SYNTHETIC_CAUSE_UNKNOWN_TOOL,
        SyntheticCause.SYNTHETIC_CAUSE_INVALID_ARGUMENTS,
        SyntheticCause.SYNTHETIC_CAUSE_DENIED,
        SyntheticCause.SYNTHETIC_CAUSE_TRUNCATED,
        SyntheticCause.SYNTHETIC_CAUSE_CANCELLED,
    ],
    CallStatus.EFFECT_PENDING: [
        SyntheticCause.SYNTHETIC_CAUSE_CANCELLED,
        SyntheticCause.SYNTHETIC_CAUSE_INTERRUPTED,
    ],
}


@st.composite
def outcomes(draw: st.DrawFn, status: CallStatus | None) -> Outcome:
    fitting = FITTING_CAUSES.get(status)
    anything = fitting is None or draw(st.integers(0, 15)) == 7
    executed = draw(st.booleans()) if anything else status == CallStatus.EFFECT_PENDING
    if executed and (anything or draw(st.integers(0, 3)) != 2):
        return Executed(result=draw(tool_results()), is_error=draw(st.booleans()))
    causes = list(SyntheticCause.values()) if anything or fitting is None else fitting
    return Synthetic(
        cause=draw(st.sampled_from(causes)),
        message=draw(st.text(max_size=10)),
        terminate=draw(st.booleans()),
    )


@st.composite
def assistant_messages(draw: st.DrawFn) -> messages_pb2.AssistantMessage:
    blocks: list[messages_pb2.ContentBlock] = []
    for index in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            blocks.append(text(draw(st.text(max_size=6))))
        name = draw(st.sampled_from(TOOL_NAMES))
        blocks.append(tool_call(f"call-{index}", name, draw(JSON_OBJECTS)))
    if draw(st.booleans()):
        blocks.append(text("done"))
    stop = draw(
        st.sampled_from(
            [
                messages_pb2.STOP_REASON_TOOL_USE,
                messages_pb2.STOP_REASON_STOP,
                messages_pb2.STOP_REASON_LENGTH,
            ]
        )
    )
    message_usage = usage(draw(st.integers(1, 500))) if draw(st.booleans()) else None
    return assistant(*blocks, usage=message_usage, stop_reason=stop)


Command = Callable[[LaneState], Transition]
ALL_KINDS = (
    "start_run",
    "start_turn",
    "settle",
    "start_tool",
    "update_tool",
    "stage",
    "place",
    "abort",
    "end_run",
    "enqueue",
    "update_config",
    "record_usage",
)
# What the state machine refuses with (never Corruption, Aborted, ...).
REFUSAL_CLASSES = (FailedPrecondition, NotFound, InvalidArgument)
NEVER_REFUSED = {"place", "enqueue", "update_config", "record_usage"}
# What a driver in each phase mostly does next (repetition = weight); one command in sixteen is
# drawn from ALL_KINDS instead, whatever the phase.
LIKELY: dict[Phase | None, list[str]] = {
    None: ["start_run"] * 6 + ["enqueue", "update_config", "record_usage"],
    Phase.IDLE: ["start_turn"] * 8 + ["end_run", "abort", "enqueue", "update_config"],
    Phase.TURN_OPEN: ["settle"] * 8 + ["abort", "end_run", "enqueue"],
    Phase.TOOLS: ["start_tool"] * 6
    + ["update_tool"] * 4
    + ["stage"] * 6
    + ["place"] * 4
    + ["abort", "end_run", "enqueue", "record_usage", "update_config"],
}
# Once the run is aborting: finish the batch and end the run.
LIKELY_CANCELLED: dict[Phase, list[str]] = {
    Phase.IDLE: ["end_run"] * 4 + ["start_turn", "abort", "enqueue"],
    Phase.TURN_OPEN: ["settle"] * 3 + ["end_run"] * 3 + ["abort"],
    Phase.TOOLS: ["stage"] * 4
    + ["place"] * 3
    + ["update_tool"] * 2
    + ["end_run"] * 2
    + ["start_tool"],
}


class Driver:
    """Draws commands that mostly fit the lane's state, applies them, checks the invariants."""

    def __init__(self, data: st.DataObject, *, source_order: bool) -> None:
        self.data = data
        self.source_order = source_order
        self.lane = Lane()
        self.run_ids = Ids("run")
        self.turn_ids = Ids("turn")
        self.queue_ids = Ids("q")
        self.usage_ids = Ids("u")
        self.snapshot = self.lane.snapshot()
        # The batch whose calls the presence check follows, and its started calls.
        self.batch_entry: str | None = None
        self.batch_call_ids: list[str] = []
        self.active: set[str] = set()

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    # --- choosing a command -------------------------------------------------------------------

    def likely(self) -> list[str]:
        operation = self.lane.state.operation
        if operation is None:
            return LIKELY[None]
        likely = (LIKELY_CANCELLED if operation.cancel_requested else LIKELY)[operation.phase]
        if operation.batch is None:
            return likely
        # In a tools phase, leave out the tool commands no call's status admits (they stay
        # reachable through the one-in-sixteen draw from ALL_KINDS).
        statuses = {call.status for call in operation.batch.calls}
        useless = set()
        if CallStatus.PLANNED not in statuses:
            useless.add("start_tool")
        if CallStatus.EFFECT_PENDING not in statuses:
            useless.add("update_tool")
        if not statuses & {CallStatus.PLANNED, CallStatus.EFFECT_PENDING}:
            useless.add("stage")
        return [kind for kind in likely if kind not in useless]

    def rare(self) -> bool:
        """True about once in sixteen draws (a middle value: Hypothesis favours the bounds)."""
        return bool(self.draw(st.integers(0, 15)) == 7)

    def operation_id(self) -> str:
        operation = self.lane.state.operation
        if operation is None or self.rare():
            return "run-stale"
        return operation.operation_id

    def call_id(self, *wanted: CallStatus, leaving_planned: bool) -> str:
        """Mostly a call of the batch in one of the ``wanted`` statuses; sometimes any call or
        an unknown id. The source-order driver lets only the first planned call leave planned."""
        operation = self.lane.state.operation
        calls = [] if operation is None or operation.batch is None else list(operation.batch.calls)
        if self.source_order and leaving_planned:
            first = next((c for c in calls if c.status == CallStatus.PLANNED), None)
            calls = [c for c in calls if c.status != CallStatus.PLANNED or c is first]
        if not calls or self.rare():
            return "call-missing"
        fitting = [c for c in calls if c.status in wanted]
        pool = fitting if fitting and not self.rare() else calls
        return str(self.draw(st.sampled_from([c.tool_call_id for c in pool])))

    def status_of(self, call_id: str) -> CallStatus | None:
        operation = self.lane.state.operation
        call = (
            None if operation is None or operation.batch is None else operation.batch.call(call_id)
        )
        return None if call is None else call.status

    def next_command(self) -> tuple[str, Command]:
        if self.rare():
            kind = self.draw(st.sampled_from(ALL_KINDS))
        else:
            kind = self.draw(st.sampled_from(self.likely()))
        now = self.lane.tick()
        ids = self.lane.ids
        if kind == "start_run":
            size = self.draw(st.sampled_from([1, 1, 1, 2, 0]))
            prompt = [user(self.draw(st.text(max_size=5))) for _ in range(size)]
            run_settings = RunSettings(
                tool_execution=self.draw(st.sampled_from([0, 1, 2])),
                steering_mode=self.draw(st.sampled_from([0, 1, 2])),
                follow_up_mode=self.draw(st.sampled_from([0, 1, 2])),
            )
            run_id = self.run_ids()
            return kind, lambda s: runs.start_run(s, run_id, prompt, run_settings, now, ids)
        op = self.operation_id()
        if kind == "start_turn":
            turn = self.turn_ids()
            return kind, lambda s: runs.start_turn(s, op, turn, now)
        if kind == "settle":
            open_turn = self.lane.state.operation and self.lane.state.operation.turn_id
            turn = "turn-wrong" if self.rare() else (open_turn or "turn-none")
            message = self.draw(assistant_messages())
            return kind, lambda s: runs.settle_assistant(s, op, turn, message, now, ids)
        if kind == "start_tool":
            call = self.call_id(CallStatus.PLANNED, leaving_planned=True)
            args = self.draw(JSON_OBJECTS)
            replay = self.draw(st.sampled_from([1, 2]))
            return kind, lambda s: tools.start_tool_call(s, op, call, args, replay, now)
        if kind == "update_tool":
            call = self.call_id(CallStatus.EFFECT_PENDING, leaving_planned=False)
            progress = self.draw(tool_results())
            checkpoint = self.draw(st.booleans())
            return kind, lambda s: tools.update_tool_call(s, op, call, progress, checkpoint, now)
        if kind == "stage":
            call = self.call_id(CallStatus.PLANNED, CallStatus.EFFECT_PENDING, leaving_planned=True)
            outcome = self.draw(outcomes(self.status_of(call)))
            return kind, lambda s: tools.stage_tool_outcome(s, op, call, outcome, now)
        if kind == "place":
            return kind, lambda s: placement.place_ready(s, now, ids)
        if kind == "abort":
            return kind, lambda s: runs.abort_operation(s, op, now)
        if kind == "end_run":
            status = self.draw(st.sampled_from([COMPLETED, FAILED, ABORTED]))
            error = snapshot_pb2.OperationError(code="E", message="m") if status == FAILED else None
            return kind, lambda s: runs.end_run(s, op, status, error, now, ids)
        if kind == "enqueue":
            entry_id = self.queue_ids()
            queue = self.draw(st.sampled_from([STEER, FOLLOW_UP, NEXT_RUN, None]))
            item = (
                queued_custom(entry_id, "note", self.draw(JSON_OBJECTS))
                if queue is None
                else queued_message(entry_id, queue, self.draw(st.text(max_size=5)))
            )
            return kind, lambda s: lanes.enqueue(s, item, now)
        if kind == "update_config":
            model = self.draw(
                st.none()
                | st.sampled_from(
                    [
                        snapshot_pb2.ModelRef(provider="acme", model_id="m-1"),
                        snapshot_pb2.ModelRef(provider="acme", model_id="m-2"),
                    ]
                )
            )
            level = self.draw(st.none() | st.sampled_from([0, 1, 3, 5]))
            names = self.draw(
                st.none() | st.lists(st.sampled_from(TOOL_NAMES), unique=True, max_size=3)
            )
            return kind, lambda s: lanes.update_config(
                s, now, model=model, thinking_level=level, active_tool_names=names
            )
        assert kind == "record_usage"
        usage_id = self.usage_ids()
        amount = usage(self.draw(st.integers(0, 100)))
        for_entry = self.lane.state.tip_id if self.draw(st.booleans()) else None
        adjustment = self.draw(st.booleans())
        return kind, lambda s: runs.record_usage(s, usage_id, amount, for_entry, adjustment, now)

    # --- applying and checking ----------------------------------------------------------------

    def step(self) -> None:
        kind, command = self.next_command()
        before = self.lane.state
        untouched = copy.deepcopy(before)
        try:
            t = command(before)
        except LaneError as error:
            # A documented class; a known reason with its own class.
            assert type(error) in REFUSAL_CLASSES, f"{kind}: {type(error).__name__}: {error}"
            documented = DOCUMENTED_REFUSALS.get(error.reason, type(error))
            assert documented is type(error), f"{kind}: {type(error).__name__}({error.reason})"
            assert kind not in NEVER_REFUSED, f"{kind} refused: {error.message}"
            assert before == untouched, f"refused {kind} mutated the state"
            note_event(f"refused {error.reason}")
            return
        assert before == untouched, f"{kind} mutated the state it was given"
        note_event(f"accepted {kind}")
        check_commit(before, t)
        self.check_shape(kind, before, t)
        self.lane.transcript.extend(t.entries)
        self.lane.events.extend(t.events)
        self.lane.state = t.state
        self.follow_batch(t.state)
        expected = self.lane.snapshot()
        assert_same_snapshot(fold(self.snapshot, t.events).snapshot, expected, f"after {kind}")
        self.fold_checking_presence(t.events)
        assert self.snapshot == expected

    def follow_batch(self, state: LaneState) -> None:
        operation = state.operation
        if operation is not None and operation.batch is not None:
            batch = operation.batch
            if batch.assistant_entry_id != self.batch_entry:
                self.batch_entry = batch.assistant_entry_id
                self.batch_call_ids = [call.tool_call_id for call in batch.calls]
                self.active = set()

    def fold_checking_presence(self, events: tuple[events_pb2.HarnessEvent, ...]) -> None:
        for event in events:
            self.snapshot = apply(self.snapshot, event).snapshot
            if event.WhichOneof("kind") == "tool_start":
                assert event.tool_start.tool_call_id in self.batch_call_ids
                self.active.add(event.tool_start.tool_call_id)
            rows = row_ids(self.snapshot)
            placed = self.placed_of_batch(self.snapshot.transcript)
            assert set(rows) <= self.active, f"rows {rows} beyond started {self.active}"
            for call_id in self.batch_call_ids:
                seen = rows.count(call_id) + placed.count(call_id)
                expected = 1 if call_id in self.active else 0
                assert seen == expected, (
                    f"{call_id} shown {seen} times (rows {rows}, placed {placed}) after "
                    f"{event.WhichOneof('kind')} at revision {event.revision}"
                )

    def placed_of_batch(self, transcript: Any) -> list[str]:
        if self.batch_entry is None:
            return []
        entries: list[entries_pb2.Entry] = list(transcript)
        if not any(entry.id == self.batch_entry for entry in entries):
            return []  # the batch's assistant entry is not folded in yet
        return placed_tool_result_ids(entries, self.batch_entry)

    def check_shape(self, kind: str, before: LaneState, t: Transition) -> None:
        """Per-command event shapes (the focused tests pin them down in detail)."""
        operation = before.operation
        cancelled = operation is not None and operation.cancel_requested
        if kind == "start_tool":
            assert kinds(t) == ["tool_start"]
        elif kind == "update_tool":
            assert kinds(t) == ["tool_update"]
        elif kind == "stage":
            assert kinds(t) in (["tool_end"], ["tool_start", "tool_end"])
            if kinds(t) == ["tool_start", "tool_end"]:
                assert operation is not None and operation.batch is not None
                call = operation.batch.call(t.events[0].tool_start.tool_call_id)
                assert call is not None and call.status == CallStatus.PLANNED
                source = operation.batch.assistant.content[call.source_index].tool_call
                assert t.events[0].tool_start.arguments_json == source.arguments_json
        elif kind == "abort":
            assert kinds(t)[:1] == ([] if cancelled else ["operation_abort"])
        elif kind == "end_run":
            assert kinds(t)[-1] == "run_end"
            assert t.state.operation is None
            if cancelled:
                assert t.events[-1].run_end.status == ABORTED
        for event in t.events:
            if event.WhichOneof("kind") == "tool_end" and cancelled:
                assert event.tool_end.terminate is False
                assert event.tool_end.result.terminate is False


def _run(data: st.DataObject, *, source_order: bool) -> None:
    driver = Driver(data, source_order=source_order)
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        driver.step()


PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # No "explain" phase: its line tracer makes a failing case take minutes on Python 3.11.
    phases=(Stage.explicit, Stage.reuse, Stage.generate, Stage.shrink),
)


@PROPERTY_SETTINGS
@given(st.data())
def test_fold_equals_capture_with_calls_started_in_any_order(data: st.DataObject) -> None:
    _run(data, source_order=False)


@PROPERTY_SETTINGS
@given(st.data())
def test_fold_equals_capture_with_calls_leaving_planned_in_source_order(
    data: st.DataObject,
) -> None:
    _run(data, source_order=True)
