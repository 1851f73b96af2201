"""The open turn's model call: streaming partials, retries, deferred suspension.

Commit → events:
  AppendAssistantStream  message_start (first partial, PENDING) / message_update (later ones)
  ScheduleRetry          [message_end, entry_added, usage] (the failed response), retry_scheduled
  StartRetry             retry_start
  SuspendRun             run_suspend        ResumeRun   run_resume
retry_end is emitted by the settlement that ends a retried turn (runs.settle_assistant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2

from lane.server.domain import guards
from lane.server.domain.errors import FailedPrecondition
from lane.server.domain.event_log import EventLog
from lane.server.domain.run_inputs import Partial
from lane.server.domain.state import LaneState, Operation, Phase, evolve
from lane.server.domain.transition import Transition


@dataclass(frozen=True, kw_only=True)
class RetryScheduled(Transition):
    """ScheduleRetry: the retry as scheduled (its attempt, not before when)."""

    retry: snapshot_pb2.RetryState


@dataclass(frozen=True, kw_only=True)
class RetryStarted(Transition):
    """StartRetry: the attempt now running."""

    attempt: int


def open_turn(
    state: LaneState, operation_id: str, turn_id: str, lease_token: int, *, streaming_ok: bool
) -> Operation:
    """The run, if its turn ``turn_id`` awaits a model response (no retry pending, not
    suspended)."""
    operation = guards.driving(state, operation_id, lease_token)
    guards.require_phase(operation, Phase.TURN_OPEN)
    if operation.turn_id != turn_id:
        raise FailedPrecondition(
            "TURN_MISMATCH",
            f"turn {turn_id} is not the open turn {operation.turn_id}",
            turnId=turn_id,
            openTurnId=operation.turn_id or "",
        )
    if operation.retry is not None:
        raise FailedPrecondition(
            "RETRY_PENDING",
            f"a retry of turn {turn_id} is scheduled; start it first",
            turnId=turn_id,
        )
    if operation.deferred is not None:
        raise FailedPrecondition(
            "RUN_SUSPENDED",
            f"operation {operation_id} is suspended; resume it first",
            operationId=operation_id,
        )
    if not streaming_ok and operation.streaming is not None:
        raise FailedPrecondition(
            "RESPONSE_STREAMING", f"turn {turn_id} is streaming a response", turnId=turn_id
        )
    return operation


def append_stream(
    state: LaneState,
    operation_id: str,
    turn_id: str,
    partials: Sequence[Partial],
    now: datetime,
    lease_token: int = 0,
) -> Transition:
    """Commit streamed partials: message_start for the first of the response, then updates."""
    operation = open_turn(state, operation_id, turn_id, lease_token, streaming_ok=True)
    log = EventLog(state.lane_id, state.revision, now)
    streaming = operation.streaming
    for partial in partials:
        if streaming is None:
            log.emit(
                "message_start",
                events_pb2.MessageStartEvent(
                    run_id=operation_id,
                    message=messages_pb2.AgentMessage(assistant=partial.message),
                ),
            )
        else:
            update = events_pb2.MessageUpdateEvent(run_id=operation_id, message=partial.message)
            if partial.stream_event_json is not None:
                update.stream_event_json = partial.stream_event_json
            log.emit("message_update", update)
        streaming = partial.message
    next_operation = evolve(operation, streaming=streaming)
    return Transition.of(evolve(state, operation=next_operation, revision=log.revision), log)


def schedule_retry(
    state: LaneState,
    operation_id: str,
    turn_id: str,
    failed: messages_pb2.AssistantMessage | None,
    max_attempts: int,
    delay: timedelta,
    error_message: str,
    now: datetime,
    new_id: Callable[[], str],
    lease_token: int = 0,
) -> RetryScheduled:
    """The turn's model call failed: place the failed response (if given), schedule the retry."""
    operation = open_turn(state, operation_id, turn_id, lease_token, streaming_ok=True)
    guards.require_not_cancelled(operation)
    attempt = operation.attempt + 1
    if attempt > max_attempts:
        raise FailedPrecondition(
            "RETRIES_EXHAUSTED",
            f"attempt {attempt} would exceed max_attempts {max_attempts}; end the run FAILED",
            attempt=attempt,
            maxAttempts=max_attempts,
        )
    log = EventLog(state.lane_id, state.revision, now)
    tip, totals, messages = state.tip_id, state.usage_totals, state.message_count
    if failed is not None:
        agent_message = messages_pb2.AgentMessage(assistant=failed)
        entry_id = new_id()
        log.emit(
            "message_end",
            events_pb2.MessageEndEvent(
                run_id=operation_id, message=agent_message, entry_id=entry_id
            ),
        )
        entry = entries_pb2.Entry(id=entry_id, parent_id=tip)
        entry.message.message.CopyFrom(agent_message)
        log.place_entry(entry)
        tip, messages = entry_id, messages + 1
        if failed.HasField("usage"):
            totals = log.record_usage(new_id(), failed.usage, totals, entry_id=entry_id)
    elif operation.streaming is not None:
        # The failed attempt's partial is dropped from view.
        log.emit(
            "message_end",
            events_pb2.MessageEndEvent(
                run_id=operation_id,
                message=messages_pb2.AgentMessage(assistant=operation.streaming),
            ),
        )
    not_before = now + delay
    scheduled = events_pb2.RetryScheduledEvent(
        run_id=operation_id,
        step=turn_id,
        attempt=attempt,
        max_attempts=max_attempts,
        delay_ms=int(delay.total_seconds() * 1000),
        error_message=error_message,
    )
    scheduled.not_before_time.FromDatetime(not_before)
    log.emit("retry_scheduled", scheduled)
    retry = snapshot_pb2.RetryState(
        attempt=attempt, max_attempts=max_attempts, error_message=error_message
    )
    retry.next_attempt_time.FromDatetime(not_before)
    next_state = evolve(
        state,
        operation=evolve(operation, retry=retry, streaming=None),
        tip_id=tip,
        usage_totals=totals,
        message_count=messages,
        revision=log.revision,
    )
    return RetryScheduled.of(next_state, log, retry=retry)


def start_retry(
    state: LaneState, operation_id: str, turn_id: str, now: datetime, lease_token: int = 0
) -> RetryStarted:
    """The scheduled retry begins."""
    operation = guards.driving(state, operation_id, lease_token)
    guards.require_phase(operation, Phase.TURN_OPEN)
    guards.require_not_cancelled(operation)
    retry = operation.retry
    if retry is None or operation.turn_id != turn_id:
        raise FailedPrecondition(
            "NO_RETRY_SCHEDULED", f"turn {turn_id} has no scheduled retry", turnId=turn_id
        )
    log = EventLog(state.lane_id, state.revision, now)
    log.emit(
        "retry_start",
        events_pb2.RetryStartEvent(run_id=operation_id, step=turn_id, attempt=retry.attempt),
    )
    next_operation = evolve(operation, retry=None, attempt=retry.attempt)
    next_state = evolve(state, operation=next_operation, revision=log.revision)
    return RetryStarted.of(next_state, log, attempt=retry.attempt)


def suspend_run(
    state: LaneState,
    operation_id: str,
    turn_id: str,
    deferred: snapshot_pb2.DeferredState,
    now: datetime,
    lease_token: int = 0,
) -> Transition:
    """The model answered with a deferred handle: the run waits for it."""
    operation = open_turn(state, operation_id, turn_id, lease_token, streaming_ok=True)
    log = EventLog(state.lane_id, state.revision, now)
    log.emit(
        "run_suspend",
        events_pb2.RunSuspendEvent(run_id=operation_id, reason="deferred", deferred=deferred),
    )
    next_operation = evolve(operation, deferred=deferred, streaming=None)
    return Transition.of(evolve(state, operation=next_operation, revision=log.revision), log)


def resume_run(
    state: LaneState, operation_id: str, now: datetime, lease_token: int = 0
) -> Transition:
    """Polling the deferred response resumes the run."""
    operation = guards.driving(state, operation_id, lease_token)
    if operation.deferred is None:
        raise FailedPrecondition(
            "RUN_NOT_SUSPENDED",
            f"operation {operation_id} is not suspended",
            operationId=operation_id,
        )
    log = EventLog(state.lane_id, state.revision, now)
    log.emit("run_resume", events_pb2.RunResumeEvent(run_id=operation_id))
    next_operation = evolve(operation, deferred=None)
    return Transition.of(evolve(state, operation=next_operation, revision=log.revision), log)
