"""What a command does: the next state plus the events, entries and usage rows it committed."""

from __future__ import annotations

from dataclasses import dataclass

from lane.v1 import entries_pb2, events_pb2

from service.domain.event_log import EventLog
from service.domain.state import LaneState


@dataclass(frozen=True)
class Transition:
    """The outcome of one command: write ``state`` and append ``events`` in one transaction."""

    state: LaneState
    events: tuple[events_pb2.HarnessEvent, ...] = ()
    entries: tuple[entries_pb2.Entry, ...] = ()
    usage_rows: tuple[events_pb2.UsageRow, ...] = ()

    @classmethod
    def of(cls, state: LaneState, log: EventLog) -> Transition:
        """Close ``log`` into a transition to ``state`` (whose revision is the log's)."""
        return cls(
            state=state,
            events=tuple(log.events),
            entries=tuple(log.entries),
            usage_rows=tuple(log.usage_rows),
        )
