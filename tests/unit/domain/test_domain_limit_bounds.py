"""The closed-form bounds of service/lane/server/domain/future_commits.py against real encodings.

The rule never builds the commits the service may later have to make; it bounds them from each
call's and item's own sizes. Here randomized lanes are built through the domain's commands and
the real commits are built and encoded: ending the run (the ABORTED end a reconciler records,
at the largest revision and clock the bound allows, and as a driver's end at an ordinary one)
and a run capturing the whole inbox (every delivery mode). The bound is never below the real
group. The live state and the run's durable state stay within :func:`content_bound`, the
rule's shortcut for them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lane.v1 import entries_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from lane.server.domain import lanes, placement, runs, tools
from lane.server.domain.errors import LaneError
from lane.server.domain.future_commits import run_end_bytes, run_start_bytes
from lane.server.domain.limits import (
    FUTURE_COMMITS_WITHIN_BOUND,
    FUTURE_MARGIN_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_TOOL_CALLS,
    check_commit,
    content_bound,
    group_frame_bytes,
    live_state_bytes,
)
from lane.server.domain.state import LaneState, ToolCall
from lane.server.domain.wire import MAX_TIMESTAMP
from tests.unit.domain.support import NEVER, Ids, assistant, text, tool_call, user

NOW = datetime(2025, 6, 1, 8, 30, 0, 250000, tzinfo=UTC)
Cause = lane_service_pb2.SyntheticCause
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
FUTURE_LIMIT = MAX_MESSAGE_BYTES - FUTURE_MARGIN_BYTES
#: The largest revision a lane may reach (int64), and one far below it.
LATE_REVISION = 2**62


def uuid_ids() -> str:
    return str(uuid.uuid4())  # what the service mints: 36 bytes


def identifier(index: int, length: int, fill: str) -> str:
    """A unique id of ``length`` bytes (at least as long as the index needs)."""
    return str(index).rjust(length, fill)


lengths = st.integers(1, 128)
texts = st.text(alphabet="aé漢x", max_size=300)


@st.composite
def results(draw: st.DrawFn) -> messages_pb2.ToolResult:
    result = messages_pb2.ToolResult(
        content=[text(draw(texts)) for _ in range(draw(st.integers(0, 4)))],
        added_tool_names=[
            identifier(i, draw(st.integers(1, 40)), "t")
            for i in range(draw(st.sampled_from([0, 0, 1, 3, 20])))
        ],
        terminate=draw(st.booleans()),
    )
    if draw(st.booleans()):
        result.details_json = json.dumps({"d": draw(texts)})
    if draw(st.booleans()):
        n = draw(st.integers(0, 2**40))
        result.usage.CopyFrom(messages_pb2.Usage(input=n, output=n // 3, total_tokens=n))
    return result


def _configuration(draw: st.DrawFn) -> snapshot_pb2.LaneConfiguration:
    return snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="acme", model_id="m-1"),
        active_tool_names=[
            identifier(i, draw(st.integers(1, 30)), "a") for i in range(draw(st.integers(0, 6)))
        ],
    )


@st.composite
def batch_lanes(draw: st.DrawFn) -> LaneState:
    """A lane whose run has a tool batch with its calls in every status: planned, started
    (with progress, checkpoints), staged (executed, synthetic) and placed or waiting."""
    lane_id = "L" * draw(lengths)
    run_id = "R" * draw(lengths)
    turn_id = "T" * draw(lengths)
    ids = Ids("e" * draw(st.integers(1, 30)))
    state = lanes.create_lane(lane_id, _configuration(draw), NOW).state
    settings_ = lane_service_pb2.RunSettings(
        tool_execution=lane_service_pb2.TOOL_EXECUTION_PARALLEL
    )
    state = runs.start_run(state, run_id, [user("go")], settings_, NOW, ids).state
    state = runs.start_turn(state, run_id, turn_id, NOW).state
    calls = draw(st.integers(1, 10))
    call_ids = [identifier(i, draw(lengths), "c") for i in range(calls)]
    blocks = []
    for index, call_id in enumerate(call_ids):
        if draw(st.booleans()):
            blocks.append(text(draw(texts)))
        arguments = json.dumps({"a": "x" * draw(st.integers(0, 500)), "i": index})
        blocks.append(tool_call(call_id, "n" * draw(lengths), arguments))
    message = assistant(*blocks)
    if draw(st.booleans()):
        message.usage.CopyFrom(messages_pb2.Usage(input=5, output=7, total_tokens=12))
    state = runs.settle_assistant(state, run_id, turn_id, message, NOW, ids).state
    # Calls leave planned in source order: a prefix of them does.
    for call_id in call_ids:
        action = draw(st.sampled_from(["start", "start", "start", "unknown", "denied", "stop"]))
        if action == "stop":
            break
        if action != "start":
            cause = (
                Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL
                if action == "unknown"
                else Cause.SYNTHETIC_CAUSE_DENIED
            )
            outcome: tools.Outcome = lane_service_pb2.SyntheticOutcome(
                cause=cause, message=draw(texts) or "no"
            )
            state = tools.stage_tool_outcome(state, run_id, call_id, outcome, NOW).state
            state = placement.place_ready(state, NOW, ids).state
            continue
        arguments = json.dumps({"b": "y" * draw(st.integers(0, 300))})
        state = tools.start_tool_call(state, run_id, call_id, arguments, NEVER, NOW).state
        for _ in range(draw(st.integers(0, 2))):
            update = draw(results())
            checkpoint = draw(st.booleans())
            state = tools.update_tool_call(state, run_id, call_id, update, checkpoint, NOW).state
        end = draw(st.sampled_from(["executed", "running", "executed", "interrupted"]))
        if end == "running":
            continue
        if end == "executed":
            outcome = lane_service_pb2.ExecutedOutcome(
                result=draw(results()), is_error=draw(st.booleans())
            )
        else:
            outcome = lane_service_pb2.SyntheticOutcome(cause=Cause.SYNTHETIC_CAUSE_INTERRUPTED)
        state = tools.stage_tool_outcome(state, run_id, call_id, outcome, NOW).state
        state = placement.place_ready(state, NOW, ids).state
    if draw(st.booleans()):
        state = runs.abort_operation(state, run_id, NOW).state
    return state


@given(batch_lanes())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_run_end_bound_is_never_below_the_real_end(state: LaneState) -> None:
    operation = state.operation
    assert operation is not None
    if operation.batch is None:
        return  # the batch completed: nothing is left to bound
    bound = run_end_bytes(state)
    # The reconciler's end, at the largest revision and clock the bound allows.
    late = replace(state, revision=LATE_REVISION)
    ended = runs.end_run(
        late, operation.operation_id, ABORTED, None, MAX_TIMESTAMP, uuid_ids,
        recovery=True, lease_token=None,
    )  # fmt: skip
    assert group_frame_bytes(ended.events) <= bound
    # A driver's end now, and the limits of the rest of what the lane holds.
    ended = runs.end_run(state, operation.operation_id, ABORTED, None, NOW, uuid_ids)
    assert group_frame_bytes(ended.events) <= bound
    assert live_state_bytes(state) <= content_bound(state)
    # The commit rule's shortcut: below this the run's end is not bounded at all.
    assert bound <= FUTURE_COMMITS_WITHIN_BOUND * content_bound(state)


@st.composite
def inbox_lanes(draw: st.DrawFn) -> LaneState:
    """A lane with queued messages and custom entries of every kind (and entry ids of any
    length up to 128 bytes), after a first run or not."""
    state = lanes.create_lane("L" * draw(lengths), _configuration(draw), NOW).state
    if draw(st.booleans()):
        tip_ids = Ids("t" * draw(st.integers(1, 100)))
        started = runs.start_run(
            state, "first", [user("hi")], lane_service_pb2.RunSettings(), NOW, tip_ids
        )
        state = runs.end_run(started.state, "first", ABORTED, None, NOW, tip_ids).state
    kinds = [
        snapshot_pb2.QUEUE_KIND_STEER,
        snapshot_pb2.QUEUE_KIND_FOLLOW_UP,
        snapshot_pb2.QUEUE_KIND_NEXT_RUN,
        snapshot_pb2.QUEUE_KIND_WRITE,
    ]
    for index in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(kinds))
        entry_id = identifier(index, draw(lengths), "q")
        if kind == snapshot_pb2.QUEUE_KIND_WRITE:
            custom = entries_pb2.CustomEntry(custom_type="note", data_json=json.dumps(draw(texts)))
            item = snapshot_pb2.QueuedItem(entry_id=entry_id, kind=kind, custom=custom)
        else:
            content = [text(draw(texts)) for _ in range(draw(st.integers(0, 3)))]
            message = messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=content))
            item = snapshot_pb2.QueuedItem(entry_id=entry_id, kind=kind, message=message)
        state = lanes.enqueue(state, item, NOW).state
    return state


modes = st.sampled_from(
    [lane_service_pb2.DELIVERY_MODE_ALL, lane_service_pb2.DELIVERY_MODE_ONE_AT_A_TIME]
)


@given(inbox_lanes(), modes, modes)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_run_start_bound_is_never_below_the_real_start(
    state: LaneState, steering: int, follow_up: int
) -> None:
    bound = run_start_bytes(state)
    settings_ = lane_service_pb2.RunSettings(steering_mode=steering, follow_up_mode=follow_up)  # type: ignore[arg-type]
    prompt = [user(".")]
    for revision, now in ((LATE_REVISION, MAX_TIMESTAMP), (state.revision, NOW)):
        try:
            started = runs.start_run(
                replace(state, revision=revision), "o" * 128, prompt, settings_, now, uuid_ids
            )
        except LaneError:
            continue
        assert group_frame_bytes(started.events) <= bound
    assert live_state_bytes(state) <= content_bound(state)
    assert bound <= FUTURE_COMMITS_WITHIN_BOUND * content_bound(state)


def test_a_batch_at_the_call_limit_with_the_longest_ids_ends_within_a_message() -> None:
    # MAX_TOOL_CALLS planned calls with 128-byte ids and names: ending the run settles and
    # places every one of them in one group. The bound accepts it, and is close to the truth.
    long = "x" * 128
    ids = Ids("0123456789abcdef0123456789abcdef")
    state = lanes.create_lane("L" * 128, _fixed_configuration(), NOW).state
    state = runs.start_run(
        state, "R" * 128, [user("go")], lane_service_pb2.RunSettings(), NOW, ids
    ).state
    state = runs.start_turn(state, "R" * 128, "T" * 128, NOW).state
    blocks = [tool_call(identifier(i, 128, "c"), long, "{}") for i in range(MAX_TOOL_CALLS)]
    settled = runs.settle_assistant(state, "R" * 128, "T" * 128, assistant(*blocks), NOW, ids)
    check_commit(state, settled)  # accepted
    state = settled.state
    late = replace(state, revision=LATE_REVISION)
    ended = runs.end_run(
        late, "R" * 128, ABORTED, None, MAX_TIMESTAMP, uuid_ids, recovery=True, lease_token=None
    )
    real, bound = group_frame_bytes(ended.events), run_end_bytes(state)
    assert real <= bound <= FUTURE_LIMIT
    assert bound <= real * 1.1
    assert real < 1.25 * 2**20  # README: "about 1 MiB of events"


def _fixed_configuration() -> snapshot_pb2.LaneConfiguration:
    return snapshot_pb2.LaneConfiguration(active_tool_names=["read", "bash"])


def test_ending_the_run_is_linear_in_the_batch() -> None:
    # Not a timing: the work is counted, as reads of the calls' fields. Ending a run with n
    # unfinished calls reads each call a fixed number of times; settling them one by one and
    # rescanning the batch for each (as it once did) reads n times as much: quadratic.
    reads = {}
    for n in (32, 128):
        state = _planned_batch(n)
        operation = state.operation
        assert operation is not None and operation.batch is not None
        counted = tuple(_CountedCall(**vars(call)) for call in operation.batch.calls)
        batch = replace(operation.batch, calls=counted)
        _CountedCall.reads = 0
        ended = runs.end_run(
            replace(state, operation=replace(operation, batch=batch)),
            "run-1", ABORTED, None, NOW, Ids("e"),
        )  # fmt: skip
        assert ended.state.operation is None
        reads[n] = _CountedCall.reads
    assert reads[128] <= 5 * reads[32], reads  # quadratic work would be 16 times as much


@dataclass(frozen=True)
class _CountedCall(ToolCall):
    """A call counting reads of its fields (``dataclasses.replace`` keeps the class)."""

    reads: ClassVar[int] = 0

    def __getattribute__(self, name: str) -> Any:
        if name in _CALL_FIELDS:
            _CountedCall.reads += 1
        return super().__getattribute__(name)


_CALL_FIELDS = frozenset(f.name for f in fields(ToolCall))


def _planned_batch(n: int) -> LaneState:
    ids = Ids()
    state = lanes.create_lane("lane-1", _fixed_configuration(), NOW).state
    state = runs.start_run(
        state, "run-1", [user("go")], lane_service_pb2.RunSettings(), NOW, ids
    ).state
    state = runs.start_turn(state, "run-1", "turn-1", NOW).state
    blocks = [tool_call(f"c{i}", "read", "{}") for i in range(n)]
    return runs.settle_assistant(state, "run-1", "turn-1", assistant(*blocks), NOW, ids).state
