"""Run ownership: leases with fencing tokens, and takeover by a new driver.

A lease is durable state of the run, not of the snapshot: granting, renewing and releasing emit
no events. Taking over a run mid-batch is a recovery: the takeover commit emits turn_start
tagged recovery and places the batch's ready prefix, and the batch's later events carry the tag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from lane.v1 import events_pb2

from lane.server.domain import guards
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.event_log import EventLog
from lane.server.domain.placement import place
from lane.server.domain.state import LaneState, Operation, Phase, evolve
from lane.server.domain.transition import Transition


@dataclass(frozen=True, kw_only=True)
class Leased(Transition):
    """A run leased (taken over, renewed): the run after the command."""

    operation: Operation


#: Fencing tokens of a lane's incarnation n start above n << TOKEN_BITS (see :func:`granted`).
TOKEN_BITS = 32


def grants(lease_token: int) -> int:
    """How many leases of its run came before and with ``lease_token``: the token's count
    within its incarnation's range (see :func:`granted`)."""
    return lease_token & ((1 << TOKEN_BITS) - 1)


def granted(
    state: LaneState, operation: Operation, driver_id: str, seconds: int, now: datetime
) -> Operation:
    """``operation`` of ``state`` leased to ``driver_id`` with the next fencing token.

    Tokens count up from the lane's incarnation shifted by :data:`TOKEN_BITS`, not from 0: a
    lane deleted and created again under its id is a later incarnation, so none of its tokens
    is one a driver of the deleted lane holds, even for a run given the same (caller-chosen)
    operation id. Such a driver's commands are refused ``STALE_LEASE``."""
    return evolve(
        operation,
        lease_token=max(operation.lease_token, state.incarnation << TOKEN_BITS) + 1,
        lease_holder=driver_id,
        lease_expires=now + timedelta(seconds=seconds),
    )


def acquire(
    state: LaneState,
    operation_id: str,
    driver_id: str,
    seconds: int,
    now: datetime,
    new_id: Callable[[], str],
) -> Leased:
    """Take the run over; refused while another driver holds a live lease."""
    operation = guards.open_run(state, operation_id)
    if operation.lease_live(now) and operation.lease_holder != driver_id:
        raise FailedPrecondition(
            "LEASE_HELD",
            f"operation {operation_id} is leased to {operation.lease_holder} until "
            f"{operation.lease_expires}",
            operationId=operation_id,
            driverId=operation.lease_holder or "",
            expireTime=operation.lease_expires.isoformat() if operation.lease_expires else "",
        )
    operation = granted(state, operation, driver_id, seconds, now)
    log = EventLog(state.lane_id, state.revision, now)
    state = evolve(state, operation=operation)
    batch = operation.batch
    if operation.phase == Phase.TOOLS and batch is not None:
        operation = evolve(operation, recovering=True)
        log.emit(
            "turn_start",
            events_pb2.TurnStartEvent(run_id=operation_id, turn_id=batch.turn_id),
            recovery=True,
        )
        state, operation = place(
            evolve(state, operation=operation), operation, log, new_id, recovery=True
        )
    return Leased.of(evolve(state, revision=log.revision), log, operation=operation)


def renew(
    state: LaneState, operation_id: str, lease_token: int, seconds: int, now: datetime
) -> Leased:
    """Extend the caller's lease (no events)."""
    operation = _held(state, operation_id, lease_token)
    renewed = evolve(operation, lease_expires=now + timedelta(seconds=seconds))
    return Leased(state=evolve(state, operation=renewed), operation=renewed)


def release(state: LaneState, operation_id: str, lease_token: int, now: datetime) -> Transition:
    """Give the lease up (no events); the run stays open."""
    operation = _held(state, operation_id, lease_token)
    # The expiry stays: an unclaimed run is reconciled as orphaned counting from here.
    released = evolve(operation, lease_holder=None, lease_expires=now)
    return Transition(state=evolve(state, operation=released))


def _held(state: LaneState, operation_id: str, lease_token: int) -> Operation:
    operation = guards.driving(state, operation_id, lease_token)
    if operation.lease_token == 0:
        raise FailedPrecondition(
            "NOT_LEASED",
            f"operation {operation_id} has no lease to renew or release",
            operationId=operation_id,
        )
    return operation


def reconcilable(operation: Operation, now: datetime, orphan_after: timedelta) -> bool:
    """Whether the service should end ``operation`` itself: it was leased, no driver holds it,
    and either its abort was requested or it has been orphaned for ``orphan_after``."""
    if operation.lease_token == 0 or operation.lease_live(now):
        return False
    if operation.cancel_requested:
        return True
    expired = operation.lease_expires
    return expired is None or expired + orphan_after <= now
