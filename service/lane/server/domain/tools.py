"""Tool-call commands: intent, progress, staging (docs/contract.md, Commits and their events).

Commit → events:
  intent     StartToolCall     planned → effect_pending         [tool_start]
  progress   UpdateToolCall    effect_pending (unchanged)       [tool_update]
  staging    StageToolOutcome  planned/effect_pending → outcome_ready
                               [tool_start (only when it was planned), tool_end]
After staging a call never executes again; placement (placement.py) is a separate commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lane.v1 import events_pb2, messages_pb2

from lane.server.domain import guards
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.event_log import EventLog
from lane.server.domain.results import message_from_result, result_from_message, synthetic_result
from lane.server.domain.run_inputs import Cause, Executed, Outcome, Replay, Synthetic, ToolExecution
from lane.server.domain.state import CallStatus, LaneState, Operation, ToolBatch, ToolCall, evolve
from lane.server.domain.transition import Transition

# Causes decided before intent: the call must still be planned.
_BEFORE_INTENT = {
    Cause.UNKNOWN_TOOL,
    Cause.INVALID_ARGUMENTS,
    Cause.DENIED,
    Cause.TRUNCATED,
}


@dataclass(frozen=True, kw_only=True)
class OutcomeStaged(Transition):
    """A staging commit: the call's result message as staged (and later placed)."""

    staged: messages_pb2.ToolResultMessage


@dataclass(frozen=True, kw_only=True)
class ToolCallReplayed(Transition):
    """A safe replay's restart: the arguments the call runs again with."""

    arguments_json: str


def _message_truncated(call: ToolCall) -> FailedPrecondition:
    return FailedPrecondition(
        "MESSAGE_TRUNCATED",
        f"tool call {call.tool_call_id} belongs to an assistant message that stopped for length; "
        "it can only be staged with the TRUNCATED synthetic outcome",
        toolCallId=call.tool_call_id,
    )


def require_truncation_rule(batch: ToolBatch, call: ToolCall, outcome: Outcome) -> None:
    """The service decides truncation from the settled message: a call of a message that
    stopped for length takes the TRUNCATED outcome and nothing else; no other call may."""
    truncated = isinstance(outcome, Synthetic) and outcome.cause == Cause.TRUNCATED
    if batch.cut_for_length and not truncated:
        raise _message_truncated(call)
    if truncated and not batch.cut_for_length:
        raise FailedPrecondition(
            "MESSAGE_NOT_TRUNCATED",
            f"tool call {call.tool_call_id} belongs to an assistant message that did not stop "
            "for length; the TRUNCATED outcome is only for calls of such a message",
            toolCallId=call.tool_call_id,
        )


def source_arguments(batch: ToolBatch, call: ToolCall) -> str:
    """The arguments the assistant wrote for ``call`` (its source block)."""
    return batch.assistant.content[call.source_index].tool_call.arguments_json


def with_call(state: LaneState, operation: Operation, call: ToolCall, revision: int) -> LaneState:
    """``state`` at ``revision`` with ``call`` replaced in the current batch."""
    batch = operation.batch
    assert batch is not None
    calls = tuple(call if c.source_index == call.source_index else c for c in batch.calls)
    next_operation = evolve(operation, batch=evolve(batch, calls=calls))
    return evolve(state, operation=next_operation, revision=revision)


def _tool_start(
    log: EventLog,
    operation: Operation,
    batch: ToolBatch,
    call: ToolCall,
    arguments_json: str,
    *,
    recovery: bool,
) -> None:
    log.emit(
        "tool_start",
        events_pb2.ToolStartEvent(
            run_id=operation.operation_id,
            turn_id=batch.turn_id,
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments_json=arguments_json,
        ),
        recovery=recovery,
    )


def _not_status(call: ToolCall, needed: str) -> FailedPrecondition:
    return FailedPrecondition(
        "TOOL_CALL_WRONG_STATUS",
        f"tool call {call.tool_call_id} is {call.status.value}; this command needs {needed}",
        toolCallId=call.tool_call_id,
        status=call.status.value,
    )


def _driven_call(
    state: LaneState,
    operation_id: str,
    tool_call_id: str,
    lease_token: int,
    *statuses: CallStatus,
) -> tuple[Operation, ToolBatch, ToolCall]:
    """The run ``lease_token`` drives, its batch and call ``tool_call_id``, which must be in
    one of ``statuses`` (TOOL_CALL_WRONG_STATUS otherwise)."""
    operation = guards.driving(state, operation_id, lease_token)
    batch, call = guards.batch_call(operation, tool_call_id)
    if call.status not in statuses:
        raise _not_status(call, " or ".join(status.value for status in statuses))
    return operation, batch, call


def require_start_order(operation: Operation, batch: ToolBatch, call: ToolCall) -> None:
    """Refuse a planned call leaving ``planned`` out of order.

    Parallel batches start (intent, or an immediate synthetic outcome) in source order, as the
    reference harness does: running rows then appear in source order in a fold exactly as in a
    capture. Sequential batches go further: only the first unplaced call may leave ``planned``.
    """
    sequential = operation.settings.tool_execution == ToolExecution.SEQUENTIAL
    for earlier in batch.calls:
        if earlier.source_index >= call.source_index:
            return
        blocking = (
            earlier.status != CallStatus.COMPLETED
            if sequential
            else (earlier.status == CallStatus.PLANNED)
        )
        if blocking:
            raise FailedPrecondition(
                "SEQUENTIAL_ORDER" if sequential else "START_ORDER",
                f"call {earlier.tool_call_id} must "
                f"{'be settled and placed' if sequential else 'start'} before "
                f"{call.tool_call_id} leaves planned",
                toolCallId=call.tool_call_id,
                blockingToolCallId=earlier.tool_call_id,
            )


def start_tool_call(
    state: LaneState,
    operation_id: str,
    tool_call_id: str,
    arguments_json: str,
    replay: int,
    now: datetime,
    lease_token: int = 0,
) -> Transition:
    """Intent commit: persist effective args and replay policy; emits tool_start."""
    operation, batch, call = _driven_call(
        state, operation_id, tool_call_id, lease_token, CallStatus.PLANNED
    )
    if batch.cut_for_length:
        raise _message_truncated(call)
    guards.require_not_cancelled(operation)
    require_start_order(operation, batch, call)
    log = EventLog(state.lane_id, state.revision, now)
    _tool_start(log, operation, batch, call, arguments_json, recovery=operation.recovering)
    started = evolve(
        call, status=CallStatus.EFFECT_PENDING, arguments_json=arguments_json, replay=replay
    )
    return Transition.of(with_call(state, operation, started, log.revision), log)


def update_tool_call(
    state: LaneState,
    operation_id: str,
    tool_call_id: str,
    partial_result: messages_pb2.ToolResult,
    checkpoint: bool,
    now: datetime,
    lease_token: int = 0,
) -> Transition:
    """Progress of a running call; emits tool_update. A checkpoint also becomes durable."""
    operation, batch, call = _driven_call(
        state, operation_id, tool_call_id, lease_token, CallStatus.EFFECT_PENDING
    )
    log = EventLog(state.lane_id, state.revision, now)
    log.emit(
        "tool_update",
        events_pb2.ToolUpdateEvent(
            run_id=operation_id,
            turn_id=batch.turn_id,
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            partial_result=partial_result,
            checkpoint=checkpoint,
        ),
        recovery=operation.recovering,
    )
    updated = evolve(
        call, progress=partial_result, checkpoint=partial_result if checkpoint else call.checkpoint
    )
    return Transition.of(with_call(state, operation, updated, log.revision), log)


def stage_call(
    log: EventLog,
    operation: Operation,
    batch: ToolBatch,
    call: ToolCall,
    result: messages_pb2.ToolResult,
    *,
    is_error: bool,
    recovery: bool = False,
) -> tuple[ToolCall, messages_pb2.ToolResultMessage]:
    """Emit ``call``'s staging events into ``log`` ([tool_start if planned], tool_end) and
    return the staged call and its result message (the batch is left to the caller: constant
    work per call).

    Terminate is forced false once the operation's abort was requested: event data describes
    the state actually committed.
    """
    terminate = result.terminate and not operation.cancel_requested
    message = message_from_result(
        call.tool_call_id, call.tool_name, result, is_error=is_error, now=log.now
    )
    if call.status == CallStatus.PLANNED:
        _tool_start(log, operation, batch, call, source_arguments(batch, call), recovery=recovery)
    log.emit(
        "tool_end",
        events_pb2.ToolEndEvent(
            run_id=operation.operation_id,
            turn_id=batch.turn_id,
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            result=result_from_message(message, terminate=terminate),
            is_error=is_error,
            terminate=terminate,
        ),
        recovery=recovery,
    )
    staged = evolve(
        call,
        status=CallStatus.OUTCOME_READY,
        result_message=message,
        terminate=terminate,
        progress=None,
        checkpoint=None,
    )
    return staged, message


def stage_tool_outcome(
    state: LaneState,
    operation_id: str,
    tool_call_id: str,
    outcome: Outcome,
    now: datetime,
    lease_token: int = 0,
) -> OutcomeStaged:
    """Staging commit for a real or synthetic outcome (placement follows in its own commit)."""
    operation, batch, call = _driven_call(
        state,
        operation_id,
        tool_call_id,
        lease_token,
        CallStatus.PLANNED,
        CallStatus.EFFECT_PENDING,
    )
    if call.status == CallStatus.PLANNED:
        require_start_order(operation, batch, call)
    require_truncation_rule(batch, call, outcome)
    if isinstance(outcome, Executed):
        if call.status != CallStatus.EFFECT_PENDING:
            raise _not_status(call, "effect_pending (an executed result needs an intent first)")
        result = outcome.result
        is_error = outcome.is_error
    else:
        cause = outcome.cause
        if cause in _BEFORE_INTENT and call.status != CallStatus.PLANNED:
            raise _not_status(call, "planned (this cause is decided before intent)")
        if cause == Cause.INTERRUPTED and call.status != CallStatus.EFFECT_PENDING:
            raise _not_status(call, "effect_pending (only a started call can be interrupted)")
        if cause == Cause.CANCELLED and not operation.cancel_requested:
            # A cancelled outcome is never staged before the cancellation is durable.
            raise FailedPrecondition(
                "OPERATION_NOT_CANCELLED",
                f"operation {operation_id} was not asked to abort; a cancelled outcome needs "
                "AbortOperation first",
                operationId=operation_id,
            )
        result = synthetic_result(outcome, call.tool_name, call.checkpoint)
        result.terminate = cause == Cause.DENIED and outcome.terminate
        is_error = True
    log = EventLog(state.lane_id, state.revision, now)
    staged, message = stage_call(
        log, operation, batch, call, result, is_error=is_error, recovery=operation.recovering
    )
    next_state = with_call(state, operation, staged, log.revision)
    return OutcomeStaged.of(next_state, log, staged=message)


def replay_tool_call(
    state: LaneState, operation_id: str, tool_call_id: str, lease_token: int, now: datetime
) -> ToolCallReplayed:
    """Safe replay after a takeover: the checkpoint-clear commit; emits tool_start tagged
    recovery with the persisted arguments. The replay then updates and stages as usual."""
    operation, batch, call = _driven_call(
        state, operation_id, tool_call_id, lease_token, CallStatus.EFFECT_PENDING
    )
    guards.require_not_cancelled(operation)
    if call.replay != Replay.SAFE or not operation.recovering:
        raise FailedPrecondition(
            "NOT_REPLAYABLE",
            f"tool call {tool_call_id} may not be replayed: only a SAFE call of a run taken over "
            "mid-batch can run again",
            toolCallId=tool_call_id,
        )
    assert call.arguments_json is not None  # effect_pending always has its arguments
    log = EventLog(state.lane_id, state.revision, now)
    _tool_start(log, operation, batch, call, call.arguments_json, recovery=True)
    cleared = evolve(call, progress=None, checkpoint=None)
    next_state = with_call(state, operation, cleared, log.revision)
    return ToolCallReplayed.of(next_state, log, arguments_json=call.arguments_json)
