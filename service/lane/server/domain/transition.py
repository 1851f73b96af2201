"""What a command does: the next state plus the events, entries and usage rows it committed.

A command whose answer needs more than the next state's revision returns a subclass of
:class:`Transition` naming what its answer needs (the run's result, the calls it placed, ...),
so nothing has to be read back out of the next state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from lane.v1 import entries_pb2, events_pb2, snapshot_pb2

from lane.server.domain.event_log import EventLog
from lane.server.domain.state import LaneState, Operation, evolve


@dataclass(frozen=True)
class Transition:
    """The outcome of one command: write ``state`` and append ``events`` in one transaction."""

    state: LaneState
    events: tuple[events_pb2.HarnessEvent, ...] = ()
    entries: tuple[entries_pb2.Entry, ...] = ()
    usage_rows: tuple[events_pb2.UsageRow, ...] = ()

    @classmethod
    def of(cls, state: LaneState, log: EventLog, **answer: Any) -> Self:
        """Close ``log`` into a transition to ``state`` (whose revision is the log's);
        ``answer``: a subclass's own fields."""
        return cls(
            state=state,
            events=tuple(log.events),
            entries=tuple(log.entries),
            usage_rows=tuple(log.usage_rows),
            **answer,
        )


@dataclass(frozen=True, kw_only=True)
class OperationOpened(Transition):
    """An operation opened (a run, a standalone compaction): the operation as opened."""

    operation: Operation


@dataclass(frozen=True, kw_only=True)
class OperationEnded(Transition):
    """An operation ended (a run, a compaction, a navigation): its result record."""

    result: snapshot_pb2.OperationResult

    @classmethod
    def ending(
        cls, state: LaneState, log: EventLog, result: snapshot_pb2.OperationResult
    ) -> OperationEnded:
        """Close ``log`` into the end of the lane's operation with ``result``: no operation
        open any more, the tip where the result left it, and the result the lane's last."""
        next_state = evolve(
            state,
            operation=None,
            tip_id=result.tip_id,
            last_operation_id=result.operation_id,
            last_result=result,
            revision=log.revision,
        )
        return cls.of(next_state, log, result=result)
