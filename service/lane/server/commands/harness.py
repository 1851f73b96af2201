"""Commands of the rest of the harness: streaming responses, retries, deferred runs,
compaction, navigation, faults, handler errors and session metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from google.protobuf import timestamp_pb2
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import Command, Result, cancel_requested, run, run_for_revision
from lane.server.commands.operation_state import lease_of
from lane.server.domain import assistant, compaction, lane_values, navigation
from lane.server.domain.errors import NotFound
from lane.server.domain.ids import new_id
from lane.server.domain.run_inputs import Partial
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store

# -- the open turn's model call -------------------------------------------------------------


@dataclass(frozen=True)
class AppendAssistantStream(Command):
    operation_id: str
    turn_id: str
    partials: Sequence[pb.StreamedPartial]
    lease_token: int


@dataclass(frozen=True)
class StreamAppended(Result[pb.AppendAssistantStreamResponse]):
    response = pb.AppendAssistantStreamResponse
    revision: int
    cancel_requested: bool


async def append_assistant_stream(store: Store, command: AppendAssistantStream) -> StreamAppended:
    """Streamed partials of the turn's response."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, StreamAppended]:
        t = assistant.append_stream(
            state,
            command.operation_id,
            command.turn_id,
            [partial_of(p) for p in command.partials],
            now,
            command.lease_token,
        )
        appended = StreamAppended(
            revision=t.state.revision, cancel_requested=cancel_requested(t.state)
        )
        return t, appended

    return await run(store, command.lane, command.request, step, StreamAppended)


@dataclass(frozen=True)
class ScheduleRetry(Command):
    operation_id: str
    turn_id: str
    #: The failed response, placed in the transcript (None: none to keep).
    failed: messages_pb2.AssistantMessage | None
    max_attempts: int
    delay: timedelta
    error_message: str
    lease_token: int


@dataclass(frozen=True)
class RetryScheduled(Result[pb.ScheduleRetryResponse]):
    response = pb.ScheduleRetryResponse
    revision: int
    attempt: int
    next_attempt_time: timestamp_pb2.Timestamp


async def schedule_retry(store: Store, command: ScheduleRetry) -> RetryScheduled:
    """The turn's model call failed: schedule its next attempt."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, RetryScheduled]:
        t = assistant.schedule_retry(
            state,
            command.operation_id,
            command.turn_id,
            command.failed,
            command.max_attempts,
            command.delay,
            command.error_message,
            now,
            new_id,
            command.lease_token,
        )
        scheduled = RetryScheduled(
            revision=t.state.revision,
            attempt=t.retry.attempt,
            next_attempt_time=t.retry.next_attempt_time,
        )
        return t, scheduled

    return await run(store, command.lane, command.request, step, RetryScheduled)


@dataclass(frozen=True)
class StartRetry(Command):
    operation_id: str
    turn_id: str
    lease_token: int


@dataclass(frozen=True)
class RetryStarted(Result[pb.StartRetryResponse]):
    response = pb.StartRetryResponse
    revision: int
    attempt: int


async def start_retry(store: Store, command: StartRetry) -> RetryStarted:
    """The scheduled retry begins."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, RetryStarted]:
        t = assistant.start_retry(
            state, command.operation_id, command.turn_id, now, command.lease_token
        )
        return t, RetryStarted(revision=t.state.revision, attempt=t.attempt)

    return await run(store, command.lane, command.request, step, RetryStarted)


@dataclass(frozen=True)
class SuspendRun(Command):
    operation_id: str
    turn_id: str
    deferred: snapshot_pb2.DeferredState
    lease_token: int


@dataclass(frozen=True)
class RunSuspended(Result[pb.SuspendRunResponse]):
    response = pb.SuspendRunResponse
    revision: int


async def suspend_run(store: Store, command: SuspendRun) -> RunSuspended:
    """The model answered with a deferred handle: the run waits for it."""
    return await run_for_revision(
        store,
        command,
        lambda state, now: assistant.suspend_run(
            state,
            command.operation_id,
            command.turn_id,
            command.deferred,
            now,
            command.lease_token,
        ),
        RunSuspended,
    )


@dataclass(frozen=True)
class ResumeRun(Command):
    operation_id: str
    lease_token: int


@dataclass(frozen=True)
class RunResumed(Result[pb.ResumeRunResponse]):
    response = pb.ResumeRunResponse
    revision: int


async def resume_run(store: Store, command: ResumeRun) -> RunResumed:
    """The deferred response arrived: the run goes on."""
    return await run_for_revision(
        store,
        command,
        lambda state, now: assistant.resume_run(
            state, command.operation_id, now, command.lease_token
        ),
        RunResumed,
    )


# -- compaction -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartCompaction(Command):
    #: None: the service mints one.
    operation_id: str | None
    reason: events_pb2.CompactionReason.ValueType
    #: (driver id, seconds) to lease the compaction to; None: unleased.
    lease: tuple[str, int] | None


@dataclass(frozen=True)
class CompactionStarted(Result[pb.StartCompactionResponse]):
    response = pb.StartCompactionResponse
    operation_id: str
    revision: int
    lease: pb.Lease | None


async def start_compaction(store: Store, command: StartCompaction) -> CompactionStarted:
    """Open a standalone compaction."""
    operation_id = command.operation_id or new_id()

    def step(state: LaneState, now: datetime) -> tuple[Transition, CompactionStarted]:
        t = compaction.start_compaction(state, operation_id, command.reason, now, command.lease)
        started = CompactionStarted(
            operation_id=operation_id, revision=t.state.revision, lease=lease_of(t.operation)
        )
        return t, started

    return await run(store, command.lane, command.request, step, CompactionStarted)


@dataclass(frozen=True)
class EndCompaction(Command):
    operation_id: str
    status: snapshot_pb2.OperationResultStatus.ValueType
    #: With status COMPLETED only.
    entry: entries_pb2.CompactionEntry | None
    #: With status FAILED only.
    error: snapshot_pb2.OperationError | None
    lease_token: int


@dataclass(frozen=True)
class CompactionEnded(Result[pb.EndCompactionResponse]):
    response = pb.EndCompactionResponse
    result: snapshot_pb2.OperationResult
    revision: int


async def end_compaction(store: Store, command: EndCompaction) -> CompactionEnded:
    """Close the compaction: its entry when completed."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, CompactionEnded]:
        t = compaction.end_compaction(
            state,
            command.operation_id,
            command.status,
            command.entry,
            command.error,
            now,
            new_id,
            command.lease_token,
        )
        return t, CompactionEnded(result=t.result, revision=t.state.revision)

    return await run(store, command.lane, command.request, step, CompactionEnded)


@dataclass(frozen=True)
class CompactRun(Command):
    operation_id: str
    entry: entries_pb2.CompactionEntry
    reason: events_pb2.CompactionReason.ValueType
    lease_token: int


@dataclass(frozen=True)
class RunCompacted(Result[pb.CompactRunResponse]):
    response = pb.CompactRunResponse
    entry_id: str
    revision: int


async def compact_run(store: Store, command: CompactRun) -> RunCompacted:
    """Compact inside an idle run."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, RunCompacted]:
        t = compaction.compact_run(
            state,
            command.operation_id,
            command.entry,
            command.reason,
            now,
            new_id,
            command.lease_token,
        )
        return t, RunCompacted(entry_id=t.entry_id, revision=t.state.revision)

    return await run(store, command.lane, command.request, step, RunCompacted)


# -- navigation, reports, metadata ----------------------------------------------------------


@dataclass(frozen=True)
class NavigateLane(Command):
    target_entry_id: str
    summary: entries_pb2.BranchSummaryEntry | None


@dataclass(frozen=True)
class LaneNavigated(Result[pb.NavigateLaneResponse]):
    response = pb.NavigateLaneResponse
    operation_id: str
    result: snapshot_pb2.OperationResult
    revision: int


async def navigate_lane(store: Store, command: NavigateLane) -> LaneNavigated:
    """Move the lane's tip to one of its entries (opened and ended in one commit)."""
    lane, target = command.lane, command.target_entry_id
    # Entries are immutable and never deleted: a check before the command is enough.
    if not await store.entry_exists(lane, target):
        await store.lane_head(lane)  # a lane that does not exist is refused as such
        raise NotFound(
            "ENTRY_NOT_FOUND",
            f"lane {lane.lane_id} has no entry {target}",
            laneId=lane.lane_id,
            entryId=target,
        )
    operation_id = new_id()

    def step(state: LaneState, now: datetime) -> tuple[Transition, LaneNavigated]:
        t = navigation.navigate(state, operation_id, target, command.summary, now, new_id)
        navigated = LaneNavigated(
            operation_id=operation_id, result=t.result, revision=t.state.revision
        )
        return t, navigated

    return await run(store, lane, command.request, step, LaneNavigated)


@dataclass(frozen=True)
class ReportFault(Command):
    code: str
    message: str


@dataclass(frozen=True)
class FaultReported(Result[pb.ReportFaultResponse]):
    response = pb.ReportFaultResponse
    revision: int


async def report_fault(store: Store, command: ReportFault) -> FaultReported:
    """The lane faulted."""
    return await run_for_revision(
        store,
        command,
        lambda state, now: lane_values.report_fault(state, command.code, command.message, now),
        FaultReported,
    )


@dataclass(frozen=True)
class ReportHandlerError(Command):
    #: The error as the handler_error event carries it (error, stack, hook or event).
    error: events_pb2.HandlerErrorEvent


@dataclass(frozen=True)
class HandlerErrorReported(Result[pb.ReportHandlerErrorResponse]):
    response = pb.ReportHandlerErrorResponse
    revision: int


async def report_handler_error(store: Store, command: ReportHandlerError) -> HandlerErrorReported:
    """A driver's hook or handler threw."""
    return await run_for_revision(
        store,
        command,
        lambda state, now: lane_values.report_handler_error(state, command.error, now),
        HandlerErrorReported,
    )


@dataclass(frozen=True)
class SetLaneValue(Command):
    #: The value_update event's payload (a session name or an entry label).
    value: events_pb2.ValueUpdateEvent


@dataclass(frozen=True)
class LaneValueSet(Result[pb.SetLaneValueResponse]):
    response = pb.SetLaneValueResponse
    revision: int


async def set_lane_value(store: Store, command: SetLaneValue) -> LaneValueSet:
    """Session metadata changed."""
    return await run_for_revision(
        store,
        command,
        lambda state, now: lane_values.set_value(state, command.value, now),
        LaneValueSet,
    )


def partial_of(partial: pb.StreamedPartial) -> Partial:
    """The domain's value of a StreamedPartial."""
    event = partial.stream_event_json if partial.HasField("stream_event_json") else None
    return Partial(partial.message, event)
