"""What a driver reports about a lane beyond its runs: faults, handler errors, metadata."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import events_pb2

from lane.server.domain.event_log import EventLog
from lane.server.domain.state import LaneState, evolve
from lane.server.domain.transition import Transition


def report_fault(state: LaneState, code: str, message: str, now: datetime) -> Transition:
    """The lane faulted: emits fault; the snapshot shows ``faulted`` from now on."""
    log = EventLog(state.lane_id, state.revision, now)
    log.emit("fault", events_pb2.FaultEvent(code=code, message=message))
    return Transition.of(evolve(state, faulted=True, revision=log.revision), log)


def report_handler_error(
    state: LaneState, error: events_pb2.HandlerErrorEvent, now: datetime
) -> Transition:
    """A driver's hook or handler threw: emits handler_error (no state changes)."""
    log = EventLog(state.lane_id, state.revision, now)
    log.emit("handler_error", error)
    return Transition.of(evolve(state, revision=log.revision), log)


def set_value(state: LaneState, value: events_pb2.ValueUpdateEvent, now: datetime) -> Transition:
    """Session metadata changed: emits value_update (kept in the event log)."""
    log = EventLog(state.lane_id, state.revision, now)
    log.emit("value_update", value)
    return Transition.of(evolve(state, revision=log.revision), log)
