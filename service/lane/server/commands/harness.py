"""Commands of the rest of the harness: streaming responses, retries, deferred runs,
compaction, navigation, faults, handler errors and session metadata."""

from __future__ import annotations

from datetime import datetime, timedelta

from lane.v1 import events_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import Address, command, progress, run
from lane.server.commands.operation_state import lease_asked, opened
from lane.server.domain import assistant, compaction, lane_values, navigation
from lane.server.domain.errors import NotFound
from lane.server.domain.ids import new_id
from lane.server.domain.run_inputs import Partial
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store

# -- the open turn's model call -------------------------------------------------------------


@command(pb.AppendAssistantStreamResponse)
def append_assistant_stream(
    request: pb.AppendAssistantStreamRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.AppendAssistantStreamResponse]:
    """Streamed partials of the turn's response."""
    partials = [partial_of(p) for p in request.partials]
    t = assistant.append_stream(
        state, request.operation_id, request.turn_id, partials, now, request.lease_token
    )
    return t, progress(pb.AppendAssistantStreamResponse, t)


@command(pb.ScheduleRetryResponse)
def schedule_retry(
    request: pb.ScheduleRetryRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.ScheduleRetryResponse]:
    """The turn's model call failed: schedule its next attempt (the failed response, if
    any, is placed in the transcript)."""
    t = assistant.schedule_retry(
        state,
        request.operation_id,
        request.turn_id,
        request.failed_message if request.HasField("failed_message") else None,
        request.max_attempts,
        timedelta(milliseconds=request.delay_ms),
        request.error_message,
        now,
        new_id,
        request.lease_token,
    )
    answer = pb.ScheduleRetryResponse(
        revision=t.state.revision,
        attempt=t.retry.attempt,
        next_attempt_time=t.retry.next_attempt_time,
    )
    return t, answer


@command(pb.StartRetryResponse)
def start_retry(
    request: pb.StartRetryRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.StartRetryResponse]:
    """The scheduled retry begins."""
    t = assistant.start_retry(
        state, request.operation_id, request.turn_id, now, request.lease_token
    )
    return t, pb.StartRetryResponse(revision=t.state.revision, attempt=t.attempt)


@command(pb.SuspendRunResponse)
def suspend_run(
    request: pb.SuspendRunRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.SuspendRunResponse]:
    """The model answered with a deferred handle: the run waits for it."""
    t = assistant.suspend_run(
        state, request.operation_id, request.turn_id, request.deferred, now, request.lease_token
    )
    return t, pb.SuspendRunResponse(revision=t.state.revision)


@command(pb.ResumeRunResponse)
def resume_run(
    request: pb.ResumeRunRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.ResumeRunResponse]:
    """The deferred response arrived: the run goes on."""
    t = assistant.resume_run(state, request.operation_id, now, request.lease_token)
    return t, pb.ResumeRunResponse(revision=t.state.revision)


# -- compaction -----------------------------------------------------------------------------


@command(pb.StartCompactionResponse)
def start_compaction(
    request: pb.StartCompactionRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.StartCompactionResponse]:
    """Open a standalone compaction (its id minted when the request names none; leased when
    it names a driver)."""
    operation_id = request.operation_id or new_id()
    reason = request.reason or events_pb2.COMPACTION_REASON_MANUAL
    lease = lease_asked(request.driver_id, request.lease_seconds)
    t = compaction.start_compaction(state, operation_id, reason, now, lease)
    return t, opened(pb.StartCompactionResponse, t)


@command(pb.EndCompactionResponse)
def end_compaction(
    request: pb.EndCompactionRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.EndCompactionResponse]:
    """Close the compaction: its entry when completed, its error when failed."""
    t = compaction.end_compaction(
        state,
        request.operation_id,
        request.status,
        request.entry if request.HasField("entry") else None,
        request.error if request.HasField("error") else None,
        now,
        new_id,
        request.lease_token,
    )
    return t, pb.EndCompactionResponse(result=t.result, revision=t.state.revision)


@command(pb.CompactRunResponse)
def compact_run(
    request: pb.CompactRunRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.CompactRunResponse]:
    """Compact inside an idle run."""
    reason = request.reason or events_pb2.COMPACTION_REASON_THRESHOLD
    t = compaction.compact_run(
        state, request.operation_id, request.entry, reason, now, new_id, request.lease_token
    )
    return t, pb.CompactRunResponse(entry_id=t.entry_id, revision=t.state.revision)


# -- navigation, reports, metadata ----------------------------------------------------------


async def navigate_lane(
    store: Store, at: Address, request: pb.NavigateLaneRequest
) -> pb.NavigateLaneResponse:
    """Move the lane's tip to one of its entries (opened and ended in one commit)."""
    lane, target = at.lane, request.target_entry_id
    # Entries are immutable and never deleted: a check before the command is enough.
    if not await store.entry_exists(lane, target):
        await store.lane_head(lane)  # a lane that does not exist is refused as such
        raise NotFound(
            "ENTRY_NOT_FOUND",
            f"lane {lane.lane_id} has no entry {target}",
            laneId=lane.lane_id,
            entryId=target,
        )
    summary = request.summary if request.HasField("summary") else None

    def step(state: LaneState, now: datetime) -> tuple[Transition, pb.NavigateLaneResponse]:
        operation_id = new_id()
        t = navigation.navigate(state, operation_id, target, summary, now, new_id)
        answer = pb.NavigateLaneResponse(
            operation_id=operation_id, result=t.result, revision=t.state.revision
        )
        return t, answer

    return await run(store, at, step, pb.NavigateLaneResponse)


@command(pb.ReportFaultResponse)
def report_fault(
    request: pb.ReportFaultRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.ReportFaultResponse]:
    """The lane faulted."""
    t = lane_values.report_fault(state, request.code, request.message, now)
    return t, pb.ReportFaultResponse(revision=t.state.revision)


@command(pb.ReportHandlerErrorResponse)
def report_handler_error(
    request: pb.ReportHandlerErrorRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.ReportHandlerErrorResponse]:
    """A driver's hook or handler threw: the handler_error event carries the error, its
    stack, and the hook or event it came from."""
    error = events_pb2.HandlerErrorEvent(error=request.error)
    if request.HasField("stack"):
        error.stack = request.stack
    source = request.WhichOneof("source")
    if source == "hook":
        error.hook = request.hook
    elif source == "event":
        error.event = request.event
    t = lane_values.report_handler_error(state, error, now)
    return t, pb.ReportHandlerErrorResponse(revision=t.state.revision)


@command(pb.SetLaneValueResponse)
def set_lane_value(
    request: pb.SetLaneValueRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.SetLaneValueResponse]:
    """Session metadata changed: a session name or an entry label (the value_update
    event's payload)."""
    value = events_pb2.ValueUpdateEvent()
    if request.WhichOneof("value") == "session_name":
        value.session_name.CopyFrom(request.session_name)
    else:
        value.entry_label.CopyFrom(request.entry_label)
    t = lane_values.set_value(state, value, now)
    return t, pb.SetLaneValueResponse(revision=t.state.revision)


def partial_of(partial: pb.StreamedPartial) -> Partial:
    """The domain's value of a StreamedPartial."""
    event = partial.stream_event_json if partial.HasField("stream_event_json") else None
    return Partial(partial.message, event)
