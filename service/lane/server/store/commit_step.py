"""A command's commit worked out: its domain step and the statement that
writes it — on the event loop as a rule, in a worker thread for a lane with a large batch.

The step is pure and its cost grows with the batch: ending a run of 256 calls settles and
places every call and encodes some 1,300 events, about 20 ms of Python. On the event loop that
would be 20 ms every other caller of the process waits; in a thread the loop still gets the
interpreter every few milliseconds (Python switches threads every 5 ms). A thread costs some
tens of microseconds, so small lanes — nearly every command — stay on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Generic, NamedTuple, TypeVar

from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store.lane_ref import LaneRef
from lane.server.store.lane_writes import CommitStatement, RecordedAnswer, commit_statement
from lane.server.store.requests import Recording

A = TypeVar("A")

#: ``decide(state, now) -> (transition, answer)``: a pure domain step plus the command's answer.
Decide = Callable[[LaneState, datetime], tuple[Transition, A]]

#: A lane whose batch has this many tool calls has its commits worked out in a worker thread.
OFF_LOOP_BATCH_CALLS = 32


class CommitStep(NamedTuple, Generic[A]):
    """A command's transition, its answer, and the statement writing both (None: nothing to
    write)."""

    transition: Transition
    answer: A
    statement: CommitStatement | None


def recorded(request: Recording[A] | None, answer: A) -> list[RecordedAnswer]:
    """The answer a command records under its request's key (none without a request id)."""
    if request is None:
        return []
    key = request.key
    return [RecordedAnswer(key.request_id, key.method, key.digest, request.encode(answer))]


def work_out(
    lane: LaneRef,
    state: LaneState,
    version: int,
    decide: Decide[A],
    now: datetime,
    request: Recording[A] | None,
) -> CommitStep[A]:
    """Run the step on ``state`` (read at ``version``) and build its statement; a refusal
    raises."""
    transition, answer = decide(state, now)
    statement = commit_statement(lane, state, transition, version, recorded(request, answer))
    return CommitStep(transition, answer, statement)


async def worked_out(
    lane: LaneRef,
    state: LaneState,
    version: int,
    decide: Decide[A],
    now: datetime,
    request: Recording[A] | None,
) -> CommitStep[A]:
    """:func:`work_out`, in a worker thread when the lane's batch is large."""
    operation = state.operation
    batch = None if operation is None else operation.batch
    if batch is not None and len(batch.calls) >= OFF_LOOP_BATCH_CALLS:
        return await asyncio.to_thread(work_out, lane, state, version, decide, now, request)
    return work_out(lane, state, version, decide, now, request)
