"""What every command shares: its address, and running its domain step on the lane as one
transaction through the store, its answer recorded under the request's key.

A command takes the request message (validated by the api) and answers with the response
message. That message is also the form its answer is recorded in under the request id, so a
retry returns the first answer as it was. Most commands are one domain step
(:func:`command`): from the request, the lane's state and the time to the domain's
transition and the response; :meth:`Command.__call__` runs it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Generic, TypeVar, cast

from google.protobuf.message import Message

from lane.server.commands.pending_placement import finish_placement, known_pending
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import LaneRef, Store
from lane.server.store.requests import Recording, RequestKey

Q = TypeVar("Q", bound=Message)
R = TypeVar("R", bound=Message)

#: A command's domain step: from the request, the lane's state and the time, the transition
#: and the response.
Step = Callable[[Q, LaneState, datetime], tuple[Transition, R]]


@dataclass(frozen=True)
class Address:
    """Where a command runs: its lane, and its request's key (None without a request id: then
    the request is not idempotent)."""

    lane: LaneRef
    key: RequestKey | None


#: Any command, called with the store, its address and its request: a :class:`Command`, or a
#: coroutine of more than one step or with a check before its transaction.
AnyCommand = Callable[[Store, Address, Q], Awaitable[R]]


@dataclass(frozen=True)
class Command(Generic[Q, R]):
    """A command of one domain step answering with a ``response`` message."""

    response: type[R]
    step: Step[Q, R]

    async def __call__(self, store: Store, at: Address, request: Q) -> R:
        """Run the step on ``request`` (:func:`run`)."""
        return await run(store, at, partial(self.step, request), self.response)


def command(response: type[R]) -> Callable[[Step[Q, R]], Command[Q, R]]:
    """Make a step the command answering with ``response`` (a decorator)."""

    def make(step: Step[Q, R]) -> Command[Q, R]:
        return Command(response, step)

    return make


def cancel_requested(state: LaneState) -> bool:
    """Whether the lane's open operation was asked to abort (drivers learn it from answers)."""
    return state.operation is not None and state.operation.cancel_requested


def progress(response: type[R], t: Transition) -> R:
    """The answer of a step of a running operation: the lane's revision after it, and whether
    the operation was asked to abort."""
    return response(revision=t.state.revision, cancel_requested=cancel_requested(t.state))


def recording(key: RequestKey | None, response: type[R]) -> Recording[R] | None:
    """How an answer of type ``response`` is recorded under ``key`` (None without a key): as
    itself."""
    if key is None:
        return None

    def decoded(message: Message) -> R:
        return cast(R, message)

    return Recording(key, response, _same, decoded)


def _same(message: Message) -> Message:
    return message


async def run(
    store: Store,
    at: Address,
    step: Callable[[LaneState, datetime], tuple[Transition, R]],
    response: type[R],
) -> R:
    """Run ``step`` on ``at.lane`` as one transaction, its answer recorded under ``at.key``:
    the store loads the lane (the kept state, or under its row lock), replays a recorded
    answer, or runs the step, writes its transition with the answer and commits, then rings
    the doorbell.

    A step refused on a lane whose batch has a placement pending (an earlier StageToolOutcome
    staged but could not place) has that placement finished first and runs again
    (pending_placement.py)."""
    recorded = recording(at.key, response)
    try:
        return await store.command(at.lane, step, recorded)
    except FailedPrecondition:
        if not known_pending(store, at.lane) or not await finish_placement(store, at.lane):
            raise
    return await store.command(at.lane, step, recorded)
