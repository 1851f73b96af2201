"""What every command shares: its address, its typed result and that result's proto form, and
running its domain step as one transaction through the store.

A command value names the lane it runs on and its request's key (None without a request id);
the rest of its fields are the validated inputs in the domain's words. A result is a frozen
dataclass whose fields are named as the fields of one RPC response message (``response``): that
message is the result's proto form, the form an answer is recorded in under its request id and
returned in to the caller. :meth:`Result.to_proto` and :meth:`Result.from_proto` map one to the
other field by field, so a retry decodes exactly the first answer and encodes it to the same
bytes. A response field a result does not name is never set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from google.protobuf.message import Message

from lane.server.commands.pending_placement import finish_placement, known_pending
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import LaneRef, Store
from lane.server.store.requests import Recording, RequestKey

P = TypeVar("P", bound=Message)
R = TypeVar("R", bound="Result[Any]")

#: A command's domain step: the transition from the lane's state, and the command's result.
Step = Callable[[LaneState, datetime], tuple[Transition, R]]


@dataclass(frozen=True)
class Command:
    """What every command names: the lane it runs on and its request's key."""

    lane: LaneRef
    #: None when the request has no request id (then it is not idempotent).
    request: RequestKey | None


@dataclass(frozen=True)
class Result(Generic[P]):
    """A command's typed answer; its proto form is a ``response`` message (module docstring)."""

    #: The response message whose fields this result names.
    response: ClassVar[type[Message]]

    def to_proto(self) -> P:
        """This result as its response message."""
        message = self.response()
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if message.DESCRIPTOR.fields_by_name[field.name].is_repeated:
                getattr(message, field.name).extend(value)
            elif isinstance(value, Message):
                getattr(message, field.name).CopyFrom(value)
            else:
                setattr(message, field.name, value)
        return cast(P, message)

    @classmethod
    def from_proto(cls, message: Message) -> Self:
        """The result whose proto form is ``message``."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            descriptor = message.DESCRIPTOR.fields_by_name[field.name]
            value = getattr(message, field.name)
            if descriptor.is_repeated:
                value = tuple(value)
            elif descriptor.message_type is not None and not message.HasField(field.name):
                value = None
            values[field.name] = value
        return cls(**values)


def cancel_requested(state: LaneState) -> bool:
    """Whether the lane's open operation was asked to abort (drivers learn it from answers)."""
    return state.operation is not None and state.operation.cancel_requested


def recording(key: RequestKey | None, result_type: type[R]) -> Recording[R] | None:
    """How a result of ``result_type`` is recorded under ``key`` (None without a key)."""
    if key is None:
        return None
    return Recording(key, result_type.response, _to_proto, result_type.from_proto)


def _to_proto(result: Result[Any]) -> Message:
    message: Message = result.to_proto()
    return message


async def run(
    store: Store, lane: LaneRef, key: RequestKey | None, step: Step[R], result_type: type[R]
) -> R:
    """Run ``step`` on ``lane`` as one transaction, its result recorded under ``key``: the
    store loads the lane (the kept state, or under its row lock), replays a recorded answer,
    or runs the step, writes its transition with the answer and commits, then rings the
    doorbell.

    A step refused on a lane whose batch has a placement pending (an earlier StageToolOutcome
    staged but could not place) has that placement finished first and runs again
    (pending_placement.py)."""
    recorded = recording(key, result_type)
    try:
        return await store.command(lane, step, recorded)
    except FailedPrecondition:
        if not known_pending(store, lane) or not await finish_placement(store, lane):
            raise
    return await store.command(lane, step, recorded)


async def run_for_revision(
    store: Store,
    command: Command,
    transition: Callable[[LaneState, datetime], Transition],
    result_type: type[R],
) -> R:
    """:func:`run` for the commands whose result is only the lane's revision after them:
    ``result_type`` has the one field ``revision``."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, R]:
        t = transition(state, now)
        return t, cast(Callable[..., R], result_type)(revision=t.state.revision)

    return await run(store, command.lane, command.request, step, result_type)
