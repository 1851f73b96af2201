"""Source-order prefix placement (harness-model §3.5).

Placement flushes the contiguous run of outcome_ready calls that follows the completed prefix.
It is not an all-tools barrier: a call that settled early waits, settled, until every earlier
call is placed. Events per placed call: message_start, message_end, entry_added, [usage]; then
[config_update] for tools the results added; then turn_end when the batch is complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from lane.v1 import entries_pb2, events_pb2, messages_pb2

from service.domain.event_log import EventLog
from service.domain.integrity import staged_result
from service.domain.state import CallStatus, Continuation, LaneState, Phase, ToolCall
from service.domain.transition import Transition


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


def place(
    state: LaneState, log: EventLog, new_id: Callable[[], str], *, recovery: bool = False
) -> LaneState:
    """Place the ready prefix of the current batch into ``log``; return the next state."""
    operation = state.operation
    if operation is None or operation.batch is None:
        return state
    batch = operation.batch
    ready = ready_prefix(batch.calls)
    if not ready:
        return state
    run_id = operation.operation_id
    tip = state.tip_id
    totals = state.usage_totals
    active = list(state.configuration.active_tool_names)
    added: list[str] = []
    placed_ids = set()
    for call in ready:
        message = staged_result(state, batch, call)
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
        entry = entries_pb2.Entry(id=call.result_entry_id, parent_id=tip)
        entry.message.message.CopyFrom(agent_message)
        entry.message.terminate = call.terminate
        log.place_entry(entry, recovery=recovery)
        tip = call.result_entry_id
        if message.HasField("usage"):
            totals = log.record_usage(
                new_id(), message.usage, totals, entry_id=tip, recovery=recovery
            )
        for name in message.added_tool_names:
            if name not in active and name not in added:
                added.append(name)
        placed_ids.add(call.source_index)

    configuration = state.configuration
    if added:
        configuration = type(configuration)()
        configuration.CopyFrom(state.configuration)
        configuration.active_tool_names.extend(added)
        change = events_pb2.ConfigUpdateEvent()
        change.active_tools.value.extend(configuration.active_tool_names)
        change.active_tools.previous.extend(active)
        log.emit("config_update", change, recovery=recovery)

    calls = tuple(
        replace(c, status=CallStatus.COMPLETED) if c.source_index in placed_ids else c
        for c in batch.calls
    )
    next_operation = replace(operation, batch=replace(batch, calls=calls))
    if all(c.status == CallStatus.COMPLETED for c in calls):
        results = [c.result_message for c in calls if c.result_message is not None]
        log.emit(
            "turn_end",
            events_pb2.TurnEndEvent(
                run_id=run_id, turn_id=batch.turn_id, message=batch.assistant, tool_results=results
            ),
            recovery=recovery,
        )
        everything_terminates = all(c.terminate for c in calls)
        next_operation = replace(
            next_operation,
            phase=Phase.IDLE,
            batch=None,
            turn_id=None,
            recovering=False,
            continuation=(
                Continuation.MAY_FINISH if everything_terminates else Continuation.NEED_ASSISTANT
            ),
        )
    return replace(
        state,
        operation=next_operation,
        tip_id=tip,
        usage_totals=totals,
        configuration=configuration,
        message_count=state.message_count + len(ready),
        revision=log.revision,
    )


def place_ready(state: LaneState, now: datetime, new_id: Callable[[], str]) -> Transition:
    """The placement commit that follows a staging commit (no events when nothing is ready)."""
    log = EventLog(state.lane_id, state.revision, now)
    recovering = state.operation is not None and state.operation.recovering
    return Transition.of(place(state, log, new_id, recovery=recovering), log)
