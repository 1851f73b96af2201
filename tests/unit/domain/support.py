"""Builders and checks shared by the pure-domain tests.

:class:`Lane` drives one lane through the domain functions the way the store does: it keeps the
durable state and the transcript (the entries each transition placed, appended as a chain) and
checks every accepted commit against the contract:

* event revisions are consecutive from ``state.revision + 1`` and the new state's revision is
  the last of them; every event is stamped with the lane id and the commit time;
* every placed entry is the entry of an ``entry_added`` event whose revision is its ``seq``, and
  the entries chain from the previous tip; every usage row is announced by a ``usage`` event
  whose revision is its ``seq``;
* the command did not mutate the state object it was given;
* fold equals capture: folding the events into the snapshot captured before the command gives
  the snapshot captured after it (docs/contract.md, invariant 2).

Refused commands are checked by :meth:`Lane.refuse`: the documented error class and reason, and
the input state unchanged.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf import text_format
from lane.client.reducer import fold
from lane.v1 import entries_pb2, events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from lane.server.domain import lanes, placement, runs, tools
from lane.server.domain.capture import capture
from lane.server.domain.errors import (
    Code,
    Corruption,
    FailedPrecondition,
    InvalidArgument,
    LaneError,
    NotFound,
)
from lane.server.domain.run_inputs import Executed, Outcome, RunSettings, Synthetic
from lane.server.domain.state import LaneState, ToolBatch, ToolCall
from lane.server.domain.transition import Transition

LANE = "lane-1"
RUN = "run-1"
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)

PARALLEL = lane_service_pb2.TOOL_EXECUTION_PARALLEL
SEQUENTIAL = lane_service_pb2.TOOL_EXECUTION_SEQUENTIAL
NEVER = lane_service_pb2.REPLAY_POLICY_NEVER
SAFE = lane_service_pb2.REPLAY_POLICY_SAFE
Cause = lane_service_pb2.SyntheticCause
COMPLETED = snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
STEER = snapshot_pb2.QUEUE_KIND_STEER
FOLLOW_UP = snapshot_pb2.QUEUE_KIND_FOLLOW_UP
NEXT_RUN = snapshot_pb2.QUEUE_KIND_NEXT_RUN
WRITE = snapshot_pb2.QUEUE_KIND_WRITE
TOOL_USE = messages_pb2.STOP_REASON_TOOL_USE
LENGTH = messages_pb2.STOP_REASON_LENGTH

#: Every refusal the state machine documents for the commands under test: reason → class.
DOCUMENTED_REFUSALS: dict[str, type[LaneError]] = {
    "LANE_BUSY": FailedPrecondition,
    "OPERATION_NOT_OPEN": FailedPrecondition,
    "OPERATION_NOT_A_RUN": FailedPrecondition,
    "WRONG_RUN_PHASE": FailedPrecondition,
    "OPERATION_CANCELLED": FailedPrecondition,
    "TOOL_CALL_WRONG_STATUS": FailedPrecondition,
    "SEQUENTIAL_ORDER": FailedPrecondition,
    "START_ORDER": FailedPrecondition,
    "OPERATION_NOT_CANCELLED": FailedPrecondition,
    "RUN_NEEDS_ASSISTANT": FailedPrecondition,
    "MESSAGE_TRUNCATED": FailedPrecondition,
    "MESSAGE_NOT_TRUNCATED": FailedPrecondition,
    "TURN_MISMATCH": FailedPrecondition,
    "TOOL_CALL_NOT_FOUND": NotFound,
    "EMPTY_PROMPT": InvalidArgument,
    "INVALID_SYNTHETIC_CAUSE": InvalidArgument,
}


class Ids:
    """A deterministic id factory: ``prefix-1``, ``prefix-2``, …"""

    def __init__(self, prefix: str = "id") -> None:
        self.prefix = prefix
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return f"{self.prefix}-{self.count}"


# --- message builders -------------------------------------------------------------------------


def text(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def thinking(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent(thinking=value))


def user(value: str) -> messages_pb2.AgentMessage:
    return messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text(value)]))


def tool_call(call_id: str, name: str, arguments_json: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(
        tool_call=messages_pb2.ToolCallContent(id=call_id, name=name, arguments_json=arguments_json)
    )


def assistant(
    *blocks: messages_pb2.ContentBlock,
    usage: messages_pb2.Usage | None = None,
    stop_reason: messages_pb2.StopReason.ValueType = messages_pb2.STOP_REASON_TOOL_USE,
) -> messages_pb2.AssistantMessage:
    message = messages_pb2.AssistantMessage(
        content=blocks, api="messages", provider="acme", model="m-1", stop_reason=stop_reason
    )
    if usage is not None:
        message.usage.CopyFrom(usage)
    return message


def usage(n: int) -> messages_pb2.Usage:
    return messages_pb2.Usage(
        input=n,
        output=2 * n,
        total_tokens=3 * n,
        cost=messages_pb2.UsageCost(input=n / 1000, output=n / 500, total=3 * n / 1000),
    )


def result(
    value: str,
    *,
    details_json: str | None = None,
    usage: messages_pb2.Usage | None = None,
    added: Sequence[str] = (),
    terminate: bool = False,
) -> messages_pb2.ToolResult:
    built = messages_pb2.ToolResult(content=[text(value)], added_tool_names=added)
    if details_json is not None:
        built.details_json = details_json
    if usage is not None:
        built.usage.CopyFrom(usage)
    built.terminate = terminate
    return built


def executed(outcome: messages_pb2.ToolResult, *, is_error: bool = False) -> Executed:
    return Executed(result=outcome, is_error=is_error)


def synthetic(
    cause: lane_service_pb2.SyntheticCause.ValueType, message: str = "", terminate: bool = False
) -> Synthetic:
    return Synthetic(cause=cause, message=message, terminate=terminate)


def run_settings(
    mode: lane_service_pb2.ToolExecution.ValueType = PARALLEL,
    steering: lane_service_pb2.DeliveryMode.ValueType = lane_service_pb2.DELIVERY_MODE_ALL,
    follow_up: lane_service_pb2.DeliveryMode.ValueType = lane_service_pb2.DELIVERY_MODE_ALL,
) -> RunSettings:
    return RunSettings(tool_execution=mode, steering_mode=steering, follow_up_mode=follow_up)


def queued_message(
    entry_id: str, kind: snapshot_pb2.QueueKind.ValueType, value: str
) -> snapshot_pb2.QueuedItem:
    return snapshot_pb2.QueuedItem(entry_id=entry_id, kind=kind, message=user(value))


def queued_custom(entry_id: str, custom_type: str, data_json: str) -> snapshot_pb2.QueuedItem:
    return snapshot_pb2.QueuedItem(
        entry_id=entry_id,
        kind=WRITE,
        custom=entries_pb2.CustomEntry(custom_type=custom_type, data_json=data_json),
    )


def default_configuration() -> snapshot_pb2.LaneConfiguration:
    return snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="acme", model_id="m-1"),
        thinking_level=snapshot_pb2.THINKING_LEVEL_LOW,
        active_tool_names=["read", "bash"],
    )


# --- event helpers ----------------------------------------------------------------------------


def kinds(events: Sequence[events_pb2.HarnessEvent] | Transition) -> list[str]:
    """The kind of each event, in order."""
    if isinstance(events, Transition):
        events = events.events
    return [str(event.WhichOneof("kind")) for event in events]


def of_kind(t: Transition, kind: str) -> list[events_pb2.HarnessEvent]:
    return [event for event in t.events if event.WhichOneof("kind") == kind]


def row_id(row: snapshot_pb2.SnapshotTool) -> str:
    state = row.WhichOneof("state")
    assert state in ("running", "settled"), f"a SnapshotTool without a state: {row}"
    return row.running.tool_call_id if state == "running" else row.settled.tool_call_id


def row_ids(snapshot: snapshot_pb2.LaneSnapshot) -> list[str]:
    if not snapshot.HasField("operation"):
        return []
    return [row_id(row) for row in snapshot.operation.running_tools]


def placed_tool_result_ids(
    transcript: Sequence[entries_pb2.Entry], after_entry_id: str | None = None
) -> list[str]:
    """Tool-call ids of the toolResult entries (after ``after_entry_id`` when given)."""
    start = 0
    if after_entry_id is not None:
        positions = [i for i, entry in enumerate(transcript) if entry.id == after_entry_id]
        assert positions, f"entry {after_entry_id} is not in the transcript"
        start = positions[0] + 1
    return [
        entry.message.message.tool_result.tool_call_id
        for entry in transcript[start:]
        if entry.WhichOneof("payload") == "message"
        and entry.message.message.WhichOneof("message") == "tool_result"
    ]


def check_commit(before: LaneState, t: Transition) -> None:
    """The structural rules every accepted commit follows (see the module docstring)."""
    revisions = [event.revision for event in t.events]
    assert revisions == list(range(before.revision + 1, before.revision + 1 + len(revisions)))
    assert t.state.revision == before.revision + len(t.events)
    for event in t.events:
        assert event.lane_id == before.lane_id
        assert event.WhichOneof("kind") is not None
        assert event.HasField("commit_time")
    added = [e for e in t.events if e.WhichOneof("kind") == "entry_added"]
    assert [e.entry_added.entry for e in added] == list(t.entries)
    for event in added:
        assert event.entry_added.entry.seq == event.revision, (
            "entry.seq is its entry_added revision"
        )
    usage_events = [e for e in t.events if e.WhichOneof("kind") == "usage"]
    assert [e.usage.row for e in usage_events] == list(t.usage_rows)
    for event in usage_events:
        assert event.usage.row.seq == event.revision
    tip = before.tip_id
    for entry in t.entries:
        assert entry.parent_id == tip, "placed entries chain from the tip"
        tip = entry.id
    assert t.state.tip_id == tip
    assert t.state.lane_id == before.lane_id


def assert_same_snapshot(
    folded: snapshot_pb2.LaneSnapshot, captured: snapshot_pb2.LaneSnapshot, context: str
) -> None:
    """Fold equals capture, failing with a readable diff of the two snapshots."""
    if folded == captured:
        return
    diff = "\n".join(
        difflib.unified_diff(
            text_format.MessageToString(captured).splitlines(),
            text_format.MessageToString(folded).splitlines(),
            "capture(after)",
            "fold(capture(before), events)",
            lineterm="",
        )
    )
    raise AssertionError(f"fold != capture {context}:\n{diff}")


class Lane:
    """One lane driven through the domain, checked at every commit (module docstring)."""

    def __init__(self, configuration: snapshot_pb2.LaneConfiguration | None = None) -> None:
        self.ids = Ids()
        self.ticks = 0
        created = lanes.create_lane(LANE, configuration or default_configuration(), self.now())
        assert kinds(created) == ["lane_created"]
        assert created.state.revision == 1
        self.state: LaneState = created.state
        self.transcript: list[entries_pb2.Entry] = list(created.entries)
        self.events: list[events_pb2.HarnessEvent] = list(created.events)

    # --- plumbing -----------------------------------------------------------------------------

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.ticks)

    def tick(self) -> datetime:
        self.ticks += 1
        return self.now()

    def snapshot(self) -> snapshot_pb2.LaneSnapshot:
        return capture(self.state, self.transcript)

    def commit(self, command: Callable[[LaneState], Transition]) -> Transition:
        """Run ``command`` on the current state; check and keep its transition."""
        before = self.state
        untouched = copy.deepcopy(before)
        snapshot_before = self.snapshot()
        t = command(before)
        assert before == untouched, "a command must not mutate the state it was given"
        check_commit(before, t)
        self.transcript.extend(t.entries)
        self.events.extend(t.events)
        self.state = t.state
        folded = fold(snapshot_before, t.events)
        assert_same_snapshot(folded.snapshot, self.snapshot(), f"after {kinds(t)}")
        assert not folded.rebase
        return t

    def refuse(
        self,
        command: Callable[[LaneState], Transition],
        reason: str | None,
        cls: type[LaneError],
    ) -> LaneError:
        """Run ``command``; it must be refused with ``cls`` and ``reason`` (any reason when
        None) and change nothing."""
        before = self.state
        untouched = copy.deepcopy(before)
        with pytest.raises(LaneError) as caught:
            command(before)
        error = caught.value
        assert type(error) is cls, f"{type(error).__name__}({error.reason}): {error.message}"
        assert reason is None or error.reason == reason, error.message
        assert error.code == cls.code
        assert before == untouched, "a refused command must not mutate the state"
        return error

    def accept_or_refuse(self, command: Callable[[LaneState], Transition]) -> Transition | None:
        """Commit ``command`` (checked), or None when it is refused as a FailedPrecondition that
        changed nothing: for behaviour the contract allows either way."""
        untouched = copy.deepcopy(self.state)
        try:
            return self.commit(command)
        except FailedPrecondition:
            assert self.state == untouched
            return None

    # --- state access -------------------------------------------------------------------------

    @property
    def batch(self) -> ToolBatch:
        operation = self.state.operation
        assert operation is not None and operation.batch is not None
        return operation.batch

    def call(self, call_id: str) -> ToolCall:
        found = self.batch.call(call_id)
        assert found is not None
        return found

    @property
    def operation_id(self) -> str:
        assert self.state.operation is not None
        return self.state.operation.operation_id

    # --- commands -----------------------------------------------------------------------------

    def start_run(
        self,
        *prompt: messages_pb2.AgentMessage,
        settings: RunSettings | None = None,
        run_id: str = RUN,
    ) -> Transition:
        now = self.tick()
        return self.commit(
            lambda s: runs.start_run(s, run_id, prompt, settings or run_settings(), now, self.ids)
        )

    def start_turn(self, turn_id: str) -> Transition:
        now, run_id = self.tick(), self.operation_id
        return self.commit(lambda s: runs.start_turn(s, run_id, turn_id, now))

    def settle(self, turn_id: str, message: messages_pb2.AssistantMessage) -> Transition:
        now, run_id = self.tick(), self.operation_id
        return self.commit(
            lambda s: runs.settle_assistant(s, run_id, turn_id, message, now, self.ids)
        )

    def start_tool(self, call_id: str, arguments_json: str | None = None) -> Transition:
        now, run_id = self.tick(), self.operation_id
        if arguments_json is None:
            arguments_json = tools.source_arguments(self.batch, self.call(call_id))
        args = arguments_json
        return self.commit(lambda s: tools.start_tool_call(s, run_id, call_id, args, NEVER, now))

    def update_tool(
        self, call_id: str, progress: messages_pb2.ToolResult, *, checkpoint: bool = False
    ) -> Transition:
        now, run_id = self.tick(), self.operation_id
        return self.commit(
            lambda s: tools.update_tool_call(s, run_id, call_id, progress, checkpoint, now)
        )

    def stage(self, call_id: str, outcome: Outcome) -> Transition:
        now, run_id = self.tick(), self.operation_id
        return self.commit(lambda s: tools.stage_tool_outcome(s, run_id, call_id, outcome, now))

    def place(self) -> Transition:
        now = self.tick()
        return self.commit(lambda s: placement.place_ready(s, now, self.ids))

    def abort(self) -> Transition:
        now, run_id = self.tick(), self.operation_id
        return self.commit(lambda s: runs.abort_operation(s, run_id, now))

    def end_run(
        self,
        status: snapshot_pb2.OperationResultStatus.ValueType,
        error: snapshot_pb2.OperationError | None = None,
    ) -> Transition:
        now, run_id = self.tick(), self.operation_id
        return self.commit(lambda s: runs.end_run(s, run_id, status, error, now, self.ids))

    def enqueue(self, item: snapshot_pb2.QueuedItem) -> Transition:
        now = self.tick()
        return self.commit(lambda s: lanes.enqueue(s, item, now))


def lane_with_batch(
    *calls: tuple[str, str, str],
    mode: lane_service_pb2.ToolExecution.ValueType = PARALLEL,
    usage_of_assistant: messages_pb2.Usage | None = None,
    stop_reason: messages_pb2.StopReason.ValueType = TOOL_USE,
) -> Lane:
    """A lane whose run has a settled assistant with ``calls`` (id, name, args), all planned,
    that stopped for ``stop_reason``.

    A text block precedes the calls, so source indices start at 1.
    """
    lane = Lane()
    lane.start_run(user("do it"), settings=run_settings(mode))
    lane.start_turn("turn-1")
    blocks = [text("On it.")] + [tool_call(*call) for call in calls]
    lane.settle("turn-1", assistant(*blocks, usage=usage_of_assistant, stop_reason=stop_reason))
    return lane


def assert_corrupt(state: LaneState, transcript: Sequence[entries_pb2.Entry], call_id: str) -> None:
    """Capture must fault loudly, naming the call, rather than return a snapshot."""
    with pytest.raises(Corruption) as caught:
        capture(state, transcript)
    assert caught.value.reason == "LANE_STATE_CORRUPT"
    assert caught.value.code == Code.DATA_LOSS
    assert caught.value.metadata["toolCallId"] == call_id
