"""Run commands: start, turns, assistant settlement, usage, abort, end (docs/contract.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2

from lane.server.domain import guards
from lane.server.domain.assistant import open_turn
from lane.server.domain.errors import FailedPrecondition, InvalidArgument
from lane.server.domain.event_log import EventLog
from lane.server.domain.leases import granted
from lane.server.domain.placement import Placer
from lane.server.domain.results import synthetic_result
from lane.server.domain.run_inputs import Cause, Delivery, RunSettings, Synthetic
from lane.server.domain.state import (
    CallStatus,
    Continuation,
    LaneState,
    Operation,
    Phase,
    ToolBatch,
    ToolCall,
    evolve,
)
from lane.server.domain.tools import stage_call
from lane.server.domain.transition import OperationEnded, OperationOpened, Transition

QueueKind = snapshot_pb2.QueueKind
_CONVERSATIONAL = (
    QueueKind.QUEUE_KIND_STEER,
    QueueKind.QUEUE_KIND_FOLLOW_UP,
    QueueKind.QUEUE_KIND_NEXT_RUN,
)


@dataclass(frozen=True, kw_only=True)
class AbortRequested(Transition):
    """AbortOperation: whether this command asked for the abort (False: asked before)."""

    newly_requested: bool


@dataclass(frozen=True, kw_only=True)
class AssistantSettled(Transition):
    """The settled assistant message's entry id, and the calls it planned (source order)."""

    entry_id: str
    planned: tuple[ToolCall, ...]


def _take(
    inbox: Sequence[snapshot_pb2.QueuedItem], kind: int, one_at_a_time: bool
) -> list[snapshot_pb2.QueuedItem]:
    items = [item for item in inbox if item.kind == kind]
    return items[:1] if one_at_a_time else items


def _place_messages(
    state: LaneState, log: EventLog, items: Sequence[entries_pb2.Entry], run_id: str
) -> tuple[str, int]:
    """Place ``items`` as a parent chain from the tip; return (new tip, messages placed)."""
    tip = state.tip_id
    messages = 0
    for entry in items:
        chained = entries_pb2.Entry()
        chained.CopyFrom(entry)
        chained.parent_id = tip
        if chained.WhichOneof("payload") == "message":
            log.emit(
                "message_start",
                events_pb2.MessageStartEvent(run_id=run_id, message=chained.message.message),
            )
            log.emit(
                "message_end",
                events_pb2.MessageEndEvent(
                    run_id=run_id, message=chained.message.message, entry_id=chained.id
                ),
            )
            messages += 1
        log.place_entry(chained)
        tip = chained.id
    return tip, messages


def _queued_entry(item: snapshot_pb2.QueuedItem) -> entries_pb2.Entry:
    entry = entries_pb2.Entry(id=item.entry_id)
    if item.WhichOneof("item") == "custom":
        entry.custom.CopyFrom(item.custom)
    else:
        entry.message.message.CopyFrom(item.message)
    return entry


def _without(
    inbox: tuple[snapshot_pb2.QueuedItem, ...], taken: Sequence[snapshot_pb2.QueuedItem]
) -> tuple[snapshot_pb2.QueuedItem, ...]:
    ids = {item.entry_id for item in taken}
    return tuple(item for item in inbox if item.entry_id not in ids)


def start_run(
    state: LaneState,
    operation_id: str,
    prompt: Sequence[messages_pb2.AgentMessage],
    settings: RunSettings,
    now: datetime,
    new_id: Callable[[], str],
    lease: tuple[str, int] | None = None,
) -> OperationOpened:
    """Accept a run: place captured inbox items then the prompt; emits run_start first.

    ``lease`` = (driver id, seconds) leases the new run to that driver.
    """
    guards.require_no_operation(state, now)
    captured = [
        item
        for item in state.inbox
        if item.kind in (QueueKind.QUEUE_KIND_WRITE, QueueKind.QUEUE_KIND_NEXT_RUN)
    ]
    captured += _take(
        state.inbox,
        QueueKind.QUEUE_KIND_STEER,
        settings.steering_mode == Delivery.ONE_AT_A_TIME,
    )
    captured += _take(
        state.inbox,
        QueueKind.QUEUE_KIND_FOLLOW_UP,
        settings.follow_up_mode == Delivery.ONE_AT_A_TIME,
    )
    position = {item.entry_id: index for index, item in enumerate(state.inbox)}
    captured.sort(key=lambda item: position[item.entry_id])
    if not prompt and not any(item.kind in _CONVERSATIONAL for item in captured):
        raise InvalidArgument(
            "EMPTY_PROMPT",
            "a run needs a prompt message or a queued message to capture",
            field="prompt",
        )
    log = EventLog(state.lane_id, state.revision, now)
    run_start = events_pb2.RunStartEvent(run_id=operation_id)
    run_start.started_time.FromDatetime(now)
    log.emit("run_start", run_start)
    entries = [_queued_entry(item) for item in captured]
    for message in prompt:
        entry = entries_pb2.Entry(id=new_id())
        entry.message.message.CopyFrom(message)
        entries.append(entry)
    tip, placed = _place_messages(state, log, entries, operation_id)
    inbox = _without(state.inbox, captured)
    if captured:
        log.emit("queue_update", events_pb2.QueueUpdateEvent(queues=inbox))
    operation = Operation(
        operation_id=operation_id,
        kind=snapshot_pb2.OPERATION_KIND_RUN,
        started_time=now,
        from_tip_id=state.tip_id,
        settings=settings,
    )
    if lease is not None:
        operation = granted(state, operation, lease[0], lease[1], now)
    next_state = evolve(
        state,
        operation=operation,
        tip_id=tip,
        inbox=inbox,
        message_count=state.message_count + placed,
        revision=log.revision,
    )
    return OperationOpened.of(next_state, log, operation=operation)


def abort_operation(state: LaneState, operation_id: str, now: datetime) -> AbortRequested:
    """Request cancellation: drains steer and follow-up items; emits operation_abort once."""
    operation = guards.open_operation(state, operation_id)
    log = EventLog(state.lane_id, state.revision, now)
    if operation.cancel_requested:
        return AbortRequested.of(state, log, newly_requested=False)
    steer = [i for i in state.inbox if i.kind == QueueKind.QUEUE_KIND_STEER]
    follow_up = [i for i in state.inbox if i.kind == QueueKind.QUEUE_KIND_FOLLOW_UP]
    log.emit(
        "operation_abort",
        events_pb2.OperationAbortEvent(
            operation_id=operation_id,
            steer=[i.message for i in steer],
            follow_up=[i.message for i in follow_up],
        ),
    )
    inbox = _without(state.inbox, steer + follow_up)
    if inbox != state.inbox:
        log.emit("queue_update", events_pb2.QueueUpdateEvent(queues=inbox))
    next_state = evolve(
        state,
        operation=evolve(operation, cancel_requested=True),
        inbox=inbox,
        revision=log.revision,
    )
    return AbortRequested.of(next_state, log, newly_requested=True)


def start_turn(
    state: LaneState, operation_id: str, turn_id: str, now: datetime, lease_token: int = 0
) -> Transition:
    """Begin a turn at a boundary: place queued steering (or, when the run may finish,
    follow-up) messages, then emit turn_start."""
    operation = guards.driving(state, operation_id, lease_token)
    guards.require_phase(operation, Phase.IDLE)
    guards.require_not_cancelled(operation)
    settings = operation.settings
    taken = _take(
        state.inbox,
        QueueKind.QUEUE_KIND_STEER,
        settings.steering_mode == Delivery.ONE_AT_A_TIME,
    )
    if not taken and operation.continuation == Continuation.MAY_FINISH:
        taken = _take(
            state.inbox,
            QueueKind.QUEUE_KIND_FOLLOW_UP,
            settings.follow_up_mode == Delivery.ONE_AT_A_TIME,
        )
    log = EventLog(state.lane_id, state.revision, now)
    tip, placed = _place_messages(state, log, [_queued_entry(i) for i in taken], operation_id)
    inbox = _without(state.inbox, taken)
    if taken:
        log.emit("queue_update", events_pb2.QueueUpdateEvent(queues=inbox))
    log.emit("turn_start", events_pb2.TurnStartEvent(run_id=operation_id, turn_id=turn_id))
    next_state = evolve(
        state,
        operation=evolve(operation, phase=Phase.TURN_OPEN, turn_id=turn_id),
        tip_id=tip,
        inbox=inbox,
        message_count=state.message_count + placed,
        revision=log.revision,
    )
    return Transition.of(next_state, log)


def settle_assistant(
    state: LaneState,
    operation_id: str,
    turn_id: str,
    message: messages_pb2.AssistantMessage,
    now: datetime,
    new_id: Callable[[], str],
    lease_token: int = 0,
) -> AssistantSettled:
    """Place the settled assistant message; its tool calls become the planned batch. Without
    tool calls the turn ends; the run may then finish, unless the message stopped for
    TOOL_USE (it asked for tools and named none: docs/contract.md, Tool calls)."""
    operation = open_turn(state, operation_id, turn_id, lease_token, streaming_ok=True)
    log = EventLog(state.lane_id, state.revision, now)
    entry_id = new_id()
    agent_message = messages_pb2.AgentMessage(assistant=message)
    log.emit(
        "message_end",
        events_pb2.MessageEndEvent(run_id=operation_id, message=agent_message, entry_id=entry_id),
    )
    entry = entries_pb2.Entry(id=entry_id, parent_id=state.tip_id)
    entry.message.message.CopyFrom(agent_message)
    log.place_entry(entry)
    totals = state.usage_totals
    if message.HasField("usage"):
        totals = log.record_usage(new_id(), message.usage, totals, entry_id=entry_id)
    if operation.attempt > 1:
        retry_end = events_pb2.RetryEndEvent(
            run_id=operation_id,
            step=turn_id,
            attempt=operation.attempt,
            success=message.stop_reason != messages_pb2.STOP_REASON_ERROR,
        )
        if message.HasField("error_message"):
            retry_end.final_error = message.error_message
        log.emit("retry_end", retry_end)
    operation = evolve(operation, streaming=None, attempt=1)
    calls = tuple(
        ToolCall(
            source_index=index,
            tool_call_id=block.tool_call.id,
            tool_name=block.tool_call.name,
            result_entry_id=new_id(),
        )
        for index, block in enumerate(message.content)
        if block.WhichOneof("block") == "tool_call"
    )
    if calls:
        next_operation = evolve(
            operation,
            phase=Phase.TOOLS,
            batch=ToolBatch(
                turn_id=turn_id, assistant_entry_id=entry_id, assistant=message, calls=calls
            ),
        )
    else:
        log.emit(
            "turn_end",
            events_pb2.TurnEndEvent(run_id=operation_id, turn_id=turn_id, message=message),
        )
        # A message that stopped to use tools but asked for none is a failed turn, not an
        # answer: the run cannot complete on it (it ends FAILED or ABORTED, or takes a turn).
        no_answer = message.stop_reason == messages_pb2.STOP_REASON_TOOL_USE
        next_operation = evolve(
            operation,
            phase=Phase.IDLE,
            turn_id=None,
            continuation=Continuation.NEED_ASSISTANT if no_answer else Continuation.MAY_FINISH,
        )
    next_state = evolve(
        state,
        operation=next_operation,
        tip_id=entry_id,
        usage_totals=totals,
        message_count=state.message_count + 1,
        revision=log.revision,
    )
    return AssistantSettled.of(next_state, log, entry_id=entry_id, planned=calls)


def record_usage(
    state: LaneState,
    usage_id: str,
    usage: messages_pb2.Usage,
    entry_id: str | None,
    adjustment: bool,
    now: datetime,
) -> Transition:
    """Add a ledger row; emits usage with the new totals."""
    log = EventLog(state.lane_id, state.revision, now)
    totals = log.record_usage(
        usage_id, usage, state.usage_totals, entry_id=entry_id, adjustment=adjustment
    )
    return Transition.of(evolve(state, usage_totals=totals, revision=log.revision), log)


def settle_unfinished_calls(
    state: LaneState, log: EventLog, new_id: Callable[[], str], *, recovery: bool
) -> LaneState:
    """Give every unfinished call of the batch its cancellation outcome, then place them all.

    planned → cancelled synthetic, or truncated when the assistant message stopped for length
    (tool_start + tool_end); effect_pending → interruption result
    from its checkpoint (tool_end only; the running row already exists); outcome_ready → placed.
    No tool runs.

    The events are those of placing the ready prefix, then, for each unfinished call in source
    order, staging it and placing the ready prefix again (that call and the outcome_ready calls
    after it). One pass over the batch produces them: linear in the batch.
    """
    operation = state.operation
    if operation is None or operation.batch is None:
        return state
    batch = operation.batch
    calls = sorted(batch.calls, key=lambda c: c.source_index)
    placer = Placer(state, log, new_id, recovery=recovery)
    step: list[ToolCall] = []
    for index, call in enumerate(calls):
        if call.status == CallStatus.COMPLETED:
            continue
        if call.status != CallStatus.OUTCOME_READY:
            if step:
                placer.place(step)
            if call.status != CallStatus.PLANNED:
                cause = Cause.INTERRUPTED
            elif batch.cut_for_length:
                cause = Cause.TRUNCATED
            else:
                cause = Cause.CANCELLED
            result = synthetic_result(Synthetic(cause=cause), call.tool_name, call.checkpoint)
            call, _ = stage_call(
                log, operation, batch, call, result, is_error=True, recovery=recovery
            )
            calls[index] = call
            step = []
        step.append(call)
    if not step:
        return state  # nothing unfinished: nothing to place (as placing an empty prefix)
    placer.place(step)
    return placer.finish(calls)


def end_run(
    state: LaneState,
    operation_id: str,
    status: snapshot_pb2.OperationResultStatus.ValueType,
    error: snapshot_pb2.OperationError | None,
    now: datetime,
    new_id: Callable[[], str],
    *,
    recovery: bool = False,
    lease_token: int | None = 0,
) -> OperationEnded:
    """Terminal commit: settle what is unfinished, record the result, close the operation.

    ``lease_token=None`` is the service itself ending an orphaned run (no driver holds it).
    """
    operation = (
        guards.open_run(state, operation_id)
        if lease_token is None
        else guards.driving(state, operation_id, lease_token)
    )
    if operation.cancel_requested:
        status = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
        error = None
    if status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED:
        guards.require_phase(operation, Phase.IDLE)
        if operation.continuation != Continuation.MAY_FINISH:
            # A run completes only at a point where it may finish: after an assistant message
            # without tool calls, or a batch whose every call asked to terminate.
            raise FailedPrecondition(
                "RUN_NEEDS_ASSISTANT",
                f"operation {operation_id} awaits an assistant response; end it FAILED or "
                "ABORTED, or take another turn",
                operationId=operation_id,
            )
    log = EventLog(state.lane_id, state.revision, now)
    state = settle_unfinished_calls(state, log, new_id, recovery=recovery)
    result = snapshot_pb2.OperationResult(
        operation_id=operation_id,
        kind=snapshot_pb2.OPERATION_KIND_RUN,
        status=status,
        from_tip_id=operation.from_tip_id,
        tip_id=state.tip_id,
    )
    if status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED and error is not None:
        result.error.CopyFrom(error)
    result.started_time.FromDatetime(operation.started_time)
    result.ended_time.FromDatetime(now)
    run_end = events_pb2.RunEndEvent(
        run_id=operation_id,
        status=result.status,
        from_tip_id=result.from_tip_id,
        tip_id=result.tip_id,
        ended_time=result.ended_time,
    )
    if result.HasField("error"):
        run_end.error.CopyFrom(result.error)
    log.emit("run_end", run_end, recovery=recovery)
    return OperationEnded.ending(state, log, result)
