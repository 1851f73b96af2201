"""The commit rule (service/lane/server/domain/limits.py) at its byte-exact boundaries.

With a fixed clock every size is deterministic, so each limit is tested at the last accepted
size and the first refused one: RESOURCE_EXHAUSTED ``COMMIT_TOO_LARGE`` naming the part, the
size and the limit. The sizes the rule computes are checked against the real encodings (the
wire frames of service/lane/server/api/framing.py and watch.py), and the closed-form bounds of the
future commits (service/lane/server/domain/future_commits.py) against the real ones: they are upper
bounds (randomized in test_domain_limit_bounds.py). :func:`content_bound`, the rule's shortcut for
the live state and the run's durable state, bounds both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from lane.v1 import entries_pb2, events_pb2, lane_service_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.framing import event_group_frame, snapshot_head_frame
from lane.server.api.snapshot_stream import snapshot_frames
from lane.server.commands.operation_state import operation_state
from lane.server.domain import lane_values, lanes, leases, runs, tools
from lane.server.domain.capture import capture
from lane.server.domain.errors import Code, ResourceExhausted
from lane.server.domain.future_commits import run_end_bytes, run_start_bytes
from lane.server.domain.limits import (
    FUTURE_MARGIN_BYTES,
    MAX_LIVE_STATE_BYTES,
    MAX_MESSAGE_BYTES,
    check_commit,
    check_snapshot_message,
    content_bound,
    group_frame_bytes,
    live_state_bytes,
    operation_state_bytes,
)
from lane.server.domain.state import CallStatus, LaneState
from lane.server.domain.transition import Transition
from lane.server.domain.wire import MAX_TIMESTAMP
from lane.server.store import SnapshotOutline
from tests.unit.domain.support import (
    Ids,
    assistant,
    default_configuration,
    executed,
    queued_message,
    result,
    run_settings,
    tool_call,
    usage,
    user,
)

NOW = datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
NEXT_RUN = snapshot_pb2.QUEUE_KIND_NEXT_RUN
FUTURE_LIMIT = MAX_MESSAGE_BYTES - FUTURE_MARGIN_BYTES


def refusal(before: LaneState, transition: Transition) -> ResourceExhausted | None:
    """The rule's refusal of ``transition``, or None when it is accepted."""
    try:
        check_commit(before, transition)
    except ResourceExhausted as error:
        assert error.reason == "COMMIT_TOO_LARGE"
        assert error.code == Code.RESOURCE_EXHAUSTED
        return error
    return None


def last_accepted(accepts: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high) with accepts(n), given accepts(low) and not accepts(high)
    and a monotone accepts."""
    assert accepts(low) and not accepts(high)
    while high - low > 1:
        middle = (low + high) // 2
        if accepts(middle):
            low = middle
        else:
            high = middle
    return low


def new_lane(lane_id: str = "lane-1") -> LaneState:
    return lanes.create_lane(lane_id, default_configuration(), NOW).state


def batch_lane(
    calls: int,
    *,
    lane_id: str = "lane-1",
    run_id: str = "run-1",
    turn_id: str = "turn-1",
    call_id: Callable[[int], str] = lambda i: f"c{i}",
    name: str = "read",
    ids: Ids | None = None,
) -> LaneState:
    """A lane whose run has a settled assistant message with ``calls`` planned calls."""
    ids = ids or Ids()
    state = new_lane(lane_id)
    state = runs.start_run(state, run_id, [user("go")], run_settings(), NOW, ids).state
    state = runs.start_turn(state, run_id, turn_id, NOW).state
    blocks = [tool_call(call_id(i), name, "{}") for i in range(calls)]
    return runs.settle_assistant(state, run_id, turn_id, assistant(*blocks), NOW, ids).state


FAILED = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
NEVER = pb.REPLAY_POLICY_NEVER


def start(state: LaneState, *call_ids: str, run_id: str = "run-1") -> LaneState:
    for call_id in call_ids:
        state = tools.start_tool_call(state, run_id, call_id, "{}", NEVER, NOW).state
    return state


# -- the sizes are the wire's ------------------------------------------------------------------


def test_group_frame_bytes_is_the_frame_watchers_are_sent() -> None:
    state = start(batch_lane(3), "c0", "c1")
    staged = tools.stage_tool_outcome(state, "run-1", "c0", executed(result("x" * 300)), NOW)
    ends = runs.end_run(staged.state, "run-1", FAILED, None, NOW, Ids("e"))
    for events in (staged.events, ends.events):
        frame = event_group_frame([e.SerializeToString() for e in events])
        assert group_frame_bytes(events) == len(frame)


def test_the_event_group_limit_to_the_byte() -> None:
    state = new_lane()

    def report(stack_bytes: int) -> Transition:
        error = events_pb2.HandlerErrorEvent(error="boom", stack="x" * stack_bytes)
        return lane_values.report_handler_error(state, error, NOW)

    stack = MAX_MESSAGE_BYTES
    for _ in range(5):  # length varints grow with the stack: converge on the exact size
        stack += MAX_MESSAGE_BYTES - group_frame_bytes(report(stack).events)
    at_limit = report(stack)
    assert group_frame_bytes(at_limit.events) == MAX_MESSAGE_BYTES
    assert refusal(state, at_limit) is None
    over = report(stack + 1)
    error = refusal(state, over)
    assert error is not None
    assert error.metadata == {
        "laneId": "lane-1",
        "part": "eventGroup",
        "bytes": str(MAX_MESSAGE_BYTES + 1),
        "limit": str(MAX_MESSAGE_BYTES),
    }


def test_the_snapshot_answer_limit_to_the_byte() -> None:
    check_snapshot_message("lane-1", MAX_MESSAGE_BYTES)
    with pytest.raises(ResourceExhausted) as caught:
        check_snapshot_message("lane-1", MAX_MESSAGE_BYTES + 1)
    assert caught.value.reason == "SNAPSHOT_TOO_LARGE"
    assert caught.value.metadata["bytes"] == str(MAX_MESSAGE_BYTES + 1)


# -- ending the run ----------------------------------------------------------------------------


def test_a_result_that_ending_the_run_could_not_carry_is_refused_to_the_byte() -> None:
    # c1 and c2 have results staged while c0 runs: ending the run now places both in one group.
    state = start(batch_lane(3), "c0", "c1", "c2")
    big = executed(result("y" * 500_000))
    state = tools.stage_tool_outcome(state, "run-1", "c1", big, NOW).state

    def stage(size: int) -> Transition:
        return tools.stage_tool_outcome(state, "run-1", "c2", executed(result("z" * size)), NOW)

    def accepts(size: int) -> bool:
        return refusal(state, stage(size)) is None

    size = last_accepted(accepts, 0, 1_000_000)
    assert run_end_bytes(stage(size).state) <= FUTURE_LIMIT < run_end_bytes(stage(size + 1).state)
    error = refusal(state, stage(size + 1))
    assert error is not None
    assert error.metadata["part"] == "runEnd"
    assert error.metadata["limit"] == str(FUTURE_LIMIT)
    assert error.metadata["bytes"] == str(run_end_bytes(stage(size + 1).state))
    # The accepted state really ends within a message: the real commit (any clock, any later
    # revision, the abort a reconciler records) is at most the simulated one.
    accepted = stage(size).state
    for status in (ABORTED, FAILED):
        ended = runs.end_run(accepted, "run-1", status, None, NOW, Ids("e"), lease_token=None)
        assert group_frame_bytes(ended.events) <= run_end_bytes(accepted)
        assert refusal(accepted, ended) is None


def test_a_checkpoint_counts_as_the_result_an_interruption_would_place() -> None:
    state = start(batch_lane(2), "c0", "c1")

    def checkpoint(call_id: str, size: int, on: LaneState) -> Transition:
        return tools.update_tool_call(on, "run-1", call_id, result("k" * size), True, NOW)

    state = checkpoint("c0", 600_000, state).state

    def accepts(size: int) -> bool:
        return refusal(state, checkpoint("c1", size, state)) is None

    size = last_accepted(accepts, 0, 2_000_000)
    error = refusal(state, checkpoint("c1", size + 1, state))
    assert error is not None and error.metadata["part"] == "runEnd"
    # Progress without checkpoint is not kept for an interruption: it only counts live.
    progress = tools.update_tool_call(state, "run-1", "c1", result("p" * size * 2), False, NOW)
    assert refusal(state, progress) is None


# -- the live state ----------------------------------------------------------------------------


def test_the_live_state_limit_to_the_byte() -> None:
    calls = [f"c{i}" for i in range(8)]
    state = start(batch_lane(8), *calls)
    for call_id in calls[:6]:
        partial = result("p" * 500_000)
        state = tools.update_tool_call(state, "run-1", call_id, partial, False, NOW).state

    def progress(size: int) -> Transition:
        return tools.update_tool_call(state, "run-1", "c6", result("q" * size), False, NOW)

    def accepts(size: int) -> bool:
        return refusal(state, progress(size)) is None

    size = last_accepted(accepts, 0, 1_000_000)
    assert live_state_bytes(progress(size).state) == MAX_LIVE_STATE_BYTES
    error = refusal(state, progress(size + 1))
    assert error is not None
    assert error.metadata["part"] == "liveState"
    assert error.metadata["bytes"] == str(MAX_LIVE_STATE_BYTES + 1)
    assert error.metadata["limit"] == str(MAX_LIVE_STATE_BYTES)
    # What it measures is the WatchLane head message (following_chunks counted at its largest).
    accepted = progress(size).state
    head = snapshot_head_frame(capture(accepted, []), [], following_chunks=0)
    assert len(head) <= live_state_bytes(accepted) <= len(head) + 6


# -- a run capturing the inbox -----------------------------------------------------------------


def test_an_inbox_a_run_could_not_capture_in_one_commit_is_refused() -> None:
    # Many small queued messages: each is placed three times, with envelopes, by StartRun.
    ids = Ids("queued-entry-id-of-thirty-six-chars")
    base = new_lane("L" * 128)
    items = [queued_message(ids(), NEXT_RUN, "hello") for _ in range(10_000)]

    def enqueue(count: int) -> tuple[LaneState, Transition]:
        before = replace(base, inbox=tuple(items[: count - 1]))
        return before, lanes.enqueue(before, items[count - 1], NOW)

    def accepts(count: int) -> bool:
        return refusal(*enqueue(count)) is None

    count = last_accepted(accepts, 1, 10_000)
    before, over = enqueue(count + 1)
    error = refusal(before, over)
    assert error is not None and error.metadata["part"] == "runStart"
    assert sum(item.ByteSize() for item in over.state.inbox) < lanes.MAX_QUEUE_BYTES
    # The accepted inbox is captured by a real StartRun within a message.
    accepted = enqueue(count)[1].state
    run = runs.start_run(accepted, "R" * 128, [user(".")], run_settings(), NOW, Ids())
    assert group_frame_bytes(run.events) <= run_start_bytes(accepted) <= FUTURE_LIMIT


# -- the bound the rule's shortcut uses --------------------------------------------------------


def _long_ids_lane() -> LaneState:
    """A 200-call batch with 128-byte ids in every status, usage and added tools."""
    long = "x" * 128
    ids = Ids("0123456789abcdef0123456789abcdef")
    state = batch_lane(
        200,
        lane_id="L" * 128,
        run_id="R" * 128,
        turn_id="T" * 128,
        call_id=lambda i: f"{i:0128d}",
        name="n" * 128,
        ids=ids,
    )
    for i in range(100):
        state = tools.start_tool_call(state, "R" * 128, f"{i:0128d}", "{}", NEVER, NOW).state
    for i in range(1, 100, 2):
        outcome = result("", usage=usage(3), added=[long])
        staged = tools.stage_tool_outcome(state, "R" * 128, f"{i:0128d}", executed(outcome), NOW)
        state = staged.state
    for i in range(2, 100, 4):
        state = tools.update_tool_call(state, "R" * 128, f"{i:0128d}", result(""), True, NOW).state
    for _ in range(50):
        state = lanes.enqueue(state, queued_message(ids(), NEXT_RUN, ""), NOW).state
    return state


def _big_payload_lane() -> LaneState:
    state = batch_lane(1)
    state = lanes.enqueue(state, queued_message("q", NEXT_RUN, "i" * 400_000), NOW).state
    arguments = '{"a":"' + "a" * 500_000 + '"}'
    state = tools.start_tool_call(state, "run-1", "c0", arguments, NEVER, NOW).state
    return tools.update_tool_call(state, "run-1", "c0", result("k" * 500_000), True, NOW).state


@pytest.mark.parametrize("build", [_long_ids_lane, _big_payload_lane])
def test_content_bound_bounds_the_live_and_durable_state_the_others_bound_the_real_commits(
    build: Callable[[], LaneState],
) -> None:
    # The largest incarnation, so the lease carries the largest fencing token.
    state = replace(build(), incarnation=(1 << 31) - 1)
    operation = state.operation
    assert operation is not None
    leased = leases.granted(state, operation, "d" * 128, 30, NOW)
    answer = lane_service_pb2.AcquireOperationResponse(
        state=operation_state(leased), revision=1 << 62
    )
    answer.lease.CopyFrom(answer.state.lease)
    assert answer.ByteSize() <= operation_state_bytes(leased)
    sizes = {"live": live_state_bytes(state), "operation": operation_state_bytes(leased)}
    assert max(sizes.values()) <= content_bound(state), sizes
    # Ending the run and a run capturing the inbox are bounded in closed form (the shortcut
    # does not cover them: config_update events grow with each step that adds tools).
    late = replace(state, revision=1 << 62)
    ended = runs.end_run(
        late, operation.operation_id, ABORTED, None, MAX_TIMESTAMP, Ids("e" * 32), lease_token=None
    )
    assert group_frame_bytes(ended.events) <= run_end_bytes(state)
    started = runs.start_run(
        replace(late, operation=None), "R" * 128, [user(".")], run_settings(), NOW, Ids("s" * 32)
    )
    assert group_frame_bytes(started.events) <= run_start_bytes(state)


def test_a_commit_without_events_is_never_measured() -> None:
    state = batch_lane(1)
    assert refusal(state, Transition(state=state)) is None


def test_a_corrupt_lane_is_left_to_capture() -> None:
    # A staged call without its result is corrupt: capture faults on it (DATA_LOSS), so the
    # rule does not refuse in its place.
    state = start(batch_lane(1), "c0")
    operation = state.operation
    assert operation is not None and operation.batch is not None
    # Enough content that the rule measures exactly (and captures).
    arguments = '{"a":"' + "a" * 800_000 + '"}'
    call = replace(
        operation.batch.calls[0], status=CallStatus.OUTCOME_READY, arguments_json=arguments
    )
    batch = replace(operation.batch, calls=(call,))
    broken = replace(state, operation=replace(operation, batch=batch))
    assert content_bound(broken) > MAX_LIVE_STATE_BYTES
    error = events_pb2.HandlerErrorEvent(error="e")
    transition = lane_values.report_handler_error(broken, error, NOW)
    assert refusal(broken, transition) is None


def test_the_transcript_is_chunked_within_a_message_beside_a_large_live_state() -> None:
    state = new_lane()
    for i in range(3):
        item = queued_message(f"q{i}", NEXT_RUN, "i" * 330_000)
        state = lanes.enqueue(state, item, NOW).state
    entries = [entries_pb2.Entry(id=f"e{i}", parent_id=f"e{i - 1}") for i in range(6)]
    for i, entry in enumerate(entries):
        entry.message.message.CopyFrom(user(str(i) * (700_000 if i % 2 else 10)))
    snapshot = capture(state, entries)
    stored = {entry.id: entry.SerializeToString() for entry in entries}
    outline = SnapshotOutline(capture(state, []), [(i, len(body)) for i, body in stored.items()])
    reads: list[list[str]] = []

    async def read_entries(ids: Sequence[str]) -> list[bytes]:
        reads.append(list(ids))
        return [stored[i] for i in ids]

    async def frames() -> list[bytes]:
        limit_frames = snapshot_frames(outline, read_entries, 1 << 20, max_message_bytes=limit)
        return [frame async for frame in limit_frames]

    limit = 1_200_000
    sent = asyncio.run(frames())
    assert all(len(frame) <= limit for frame in sent)
    messages = [pb.WatchLaneResponse.FromString(frame) for frame in sent]
    # The entries are read a message at a time, never all at once.
    per_message = [len(messages[0].snapshot.snapshot.transcript)]
    per_message += [len(m.transcript_chunk.entries) for m in messages[1:]]
    assert [len(ids) for ids in reads] == [n for n in per_message if n]
    head = messages[0].snapshot
    assert head.following_chunks == len(messages) - 1
    assembled = snapshot_pb2.LaneSnapshot()
    assembled.CopyFrom(head.snapshot)
    for message in messages[1:]:
        assert len(message.transcript_chunk.entries) >= 1
        assembled.transcript.extend(message.transcript_chunk.entries)
    assert assembled == snapshot
    # Room in the head for the first small entry only, not the 700 kB one after it.
    assert [e.id for e in head.snapshot.transcript] == ["e0"]
