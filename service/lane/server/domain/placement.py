"""Source-order prefix placement (docs/contract.md, Tool calls).

Placement flushes the contiguous run of outcome_ready calls that follows the completed prefix.
It is not an all-tools barrier: a call that settled early waits, settled, until every earlier
call is placed. Events per placed call: message_start, message_end, entry_added, [usage]; then
[config_update] for tools the results added; then turn_end when the batch is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from lane.v1 import entries_pb2, events_pb2, messages_pb2

from lane.server.domain.event_log import EventLog
from lane.server.domain.integrity import staged_result
from lane.server.domain.state import (
    CallStatus,
    Continuation,
    LaneState,
    Operation,
    Phase,
    ToolCall,
    evolve,
)
from lane.server.domain.transition import Transition


@dataclass(frozen=True, kw_only=True)
class ReadyPlaced(Transition):
    """A placement commit: the calls it placed (source order), and whether that completed the
    batch (turn_end)."""

    placed_tool_call_ids: tuple[str, ...]
    batch_complete: bool


def ready_prefix(calls: tuple[ToolCall, ...]) -> list[ToolCall]:
    """The outcome_ready calls directly after the completed prefix, in source order."""
    ready: list[ToolCall] = []
    for call in calls:
        if call.status == CallStatus.COMPLETED:
            continue
        if call.status != CallStatus.OUTCOME_READY:
            break
        ready.append(call)
    return ready


def placement_pending(state: LaneState) -> bool:
    """Whether the open batch has a ready prefix no commit placed yet: a StageToolOutcome whose
    placement commit failed after its staging committed (or is about to run)."""
    operation = state.operation
    batch = operation.batch if operation is not None else None
    return batch is not None and bool(ready_prefix(batch.calls))


class Placer:
    """Places calls of the current batch into one commit's ``log``, in source order.

    Each :meth:`place` is one placement step (the old ``place``): for each call
    message_start, message_end, entry_added, [usage]; then one [config_update] for the tools
    the step's results added. The work is proportional to the calls placed (tool names are
    deduplicated through a set), so a commit that places a whole batch step by step (ending
    a run) stays linear in the batch, never quadratic.
    """

    def __init__(
        self, state: LaneState, log: EventLog, new_id: Callable[[], str], *, recovery: bool
    ) -> None:
        operation = state.operation
        assert operation is not None and operation.batch is not None
        self.state = state
        self.batch = operation.batch
        self.run_id = operation.operation_id
        self.log = log
        self.new_id = new_id
        self.recovery = recovery
        self.tip = state.tip_id
        self.totals = state.usage_totals
        self.configuration = state.configuration
        self.active: list[str] | None = None  # built on the first added tool name
        self.active_set: set[str] = set()
        self.placed = 0
        self.placed_indices: set[int] = set()
        #: Set by :meth:`finish`: the operation after the steps, and whether every call of the
        #: batch is completed (turn_end).
        self.operation = operation
        self.batch_complete = False

    def place(self, calls: Sequence[ToolCall]) -> None:
        """One placement step: ``calls`` (outcome_ready, in source order) become entries."""
        log, recovery, run_id = self.log, self.recovery, self.run_id
        added: list[str] = []
        for call in calls:
            message = staged_result(self.state, self.batch, call)
            agent_message = messages_pb2.AgentMessage(tool_result=message)
            log.emit(
                "message_start",
                events_pb2.MessageStartEvent(run_id=run_id, message=agent_message),
                recovery=recovery,
            )
            log.emit(
                "message_end",
                events_pb2.MessageEndEvent(
                    run_id=run_id, message=agent_message, entry_id=call.result_entry_id
                ),
                recovery=recovery,
            )
            entry = entries_pb2.Entry(id=call.result_entry_id, parent_id=self.tip)
            entry.message.message.CopyFrom(agent_message)
            entry.message.terminate = call.terminate
            log.place_entry(entry, recovery=recovery)
            self.tip = call.result_entry_id
            if message.HasField("usage"):
                self.totals = log.record_usage(
                    self.new_id(), message.usage, self.totals, entry_id=self.tip, recovery=recovery
                )
            if message.added_tool_names:
                if self.active is None:
                    self.active = list(self.configuration.active_tool_names)
                    self.active_set = set(self.active)
                for name in message.added_tool_names:
                    if name not in self.active_set:
                        self.active_set.add(name)
                        added.append(name)
            self.placed_indices.add(call.source_index)
        self.placed += len(calls)
        if added:
            assert self.active is not None
            previous = self.active
            configuration = type(self.configuration)()
            configuration.CopyFrom(self.configuration)
            configuration.active_tool_names.extend(added)
            change = events_pb2.ConfigUpdateEvent()
            change.active_tools.value.extend(configuration.active_tool_names)
            change.active_tools.previous.extend(previous)
            log.emit("config_update", change, recovery=recovery)
            self.configuration = configuration
            self.active = previous + added

    def finish(self, calls: Sequence[ToolCall]) -> LaneState:
        """The state after the steps: ``calls`` is the batch's calls (staged ones replaced),
        those placed marked completed; a batch now all completed emits turn_end and closes."""
        state = self.state
        operation = state.operation
        assert operation is not None
        batch = self.batch
        placed = self.placed_indices
        final = tuple(
            evolve(c, status=CallStatus.COMPLETED) if c.source_index in placed else c for c in calls
        )
        next_operation = evolve(operation, batch=evolve(batch, calls=final))
        if all(c.status == CallStatus.COMPLETED for c in final):
            self.batch_complete = True
            results = [c.result_message for c in final if c.result_message is not None]
            self.log.emit(
                "turn_end",
                events_pb2.TurnEndEvent(
                    run_id=self.run_id,
                    turn_id=batch.turn_id,
                    message=batch.assistant,
                    tool_results=results,
                ),
                recovery=self.recovery,
            )
            everything_terminates = all(c.terminate for c in final)
            next_operation = evolve(
                next_operation,
                phase=Phase.IDLE,
                batch=None,
                turn_id=None,
                recovering=False,
                continuation=(
                    Continuation.MAY_FINISH
                    if everything_terminates
                    else Continuation.NEED_ASSISTANT
                ),
            )
        self.operation = next_operation
        return evolve(
            state,
            operation=next_operation,
            tip_id=self.tip,
            usage_totals=self.totals,
            configuration=self.configuration,
            message_count=state.message_count + self.placed,
            revision=self.log.revision,
        )


def place(
    state: LaneState,
    operation: Operation,
    log: EventLog,
    new_id: Callable[[], str],
    *,
    recovery: bool = False,
) -> tuple[LaneState, Operation]:
    """Place the ready prefix of ``operation``'s batch (the lane's open operation) into
    ``log``; return the next state and operation."""
    batch = operation.batch
    ready = ready_prefix(batch.calls) if batch is not None else []
    if batch is None or not ready:
        return state, operation
    placer = Placer(state, log, new_id, recovery=recovery)
    placer.place(ready)
    return placer.finish(batch.calls), placer.operation


def place_ready(state: LaneState, now: datetime, new_id: Callable[[], str]) -> ReadyPlaced:
    """The placement commit that follows a staging commit (no events when nothing is ready)."""
    log = EventLog(state.lane_id, state.revision, now)
    operation = state.operation
    batch = operation.batch if operation is not None else None
    ready = ready_prefix(batch.calls) if batch is not None else []
    if operation is None or batch is None or not ready:
        return ReadyPlaced.of(state, log, placed_tool_call_ids=(), batch_complete=False)
    placer = Placer(state, log, new_id, recovery=operation.recovering)
    placer.place(ready)
    next_state = placer.finish(batch.calls)
    return ReadyPlaced.of(
        next_state,
        log,
        placed_tool_call_ids=tuple(call.tool_call_id for call in ready),
        batch_complete=placer.batch_complete,
    )
