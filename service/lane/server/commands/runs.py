"""Commands of a run's life: start, abort, end, turns, assistant settlement, usage."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import cancel_requested, command
from lane.server.commands.operation_state import lease_asked, opened
from lane.server.domain import runs
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store.run_settings import settings_of


@command(pb.StartRunResponse)
def start_run(
    request: pb.StartRunRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.StartRunResponse]:
    """Open a run: captured inbox items, then the prompt (its id minted when the request
    names none; leased when it names a driver)."""
    operation_id = request.operation_id or new_id()
    lease = lease_asked(request.driver_id, request.lease_seconds)
    settings = settings_of(request.settings)
    t = runs.start_run(state, operation_id, request.prompt, settings, now, new_id, lease)
    return t, opened(pb.StartRunResponse, t)


@command(pb.AbortOperationResponse)
def abort_operation(
    request: pb.AbortOperationRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.AbortOperationResponse]:
    """Ask the lane's open operation to abort (newly_requested: False when asked before)."""
    t = runs.abort_operation(state, request.operation_id, now)
    return t, pb.AbortOperationResponse(
        revision=t.state.revision, newly_requested=t.newly_requested
    )


@command(pb.EndRunResponse)
def end_run(
    request: pb.EndRunRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.EndRunResponse]:
    """End the run: settle what is unfinished, record its result (its error when failed)."""
    error = request.error if request.HasField("error") else None
    t = runs.end_run(
        state,
        request.operation_id,
        request.status,
        error,
        now,
        new_id,
        lease_token=request.lease_token,
    )
    return t, pb.EndRunResponse(result=t.result, revision=t.state.revision)


@command(pb.StartTurnResponse)
def start_turn(
    request: pb.StartTurnRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.StartTurnResponse]:
    """Begin a turn (after the steering or follow-up messages it places; its id minted when
    the request names none)."""
    turn_id = request.turn_id or new_id()
    t = runs.start_turn(state, request.operation_id, turn_id, now, request.lease_token)
    return t, pb.StartTurnResponse(turn_id=turn_id, revision=t.state.revision)


@command(pb.SettleAssistantMessageResponse)
def settle_assistant_message(
    request: pb.SettleAssistantMessageRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.SettleAssistantMessageResponse]:
    """Place the settled assistant message; its tool calls become the planned batch (named
    in the answer in source order)."""
    t = runs.settle_assistant(
        state,
        request.operation_id,
        request.turn_id,
        request.message,
        now,
        new_id,
        request.lease_token,
    )
    planned = [
        pb.PlannedToolCall(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            source_index=call.source_index,
            result_entry_id=call.result_entry_id,
        )
        for call in t.planned
    ]
    answer = pb.SettleAssistantMessageResponse(
        entry_id=t.entry_id,
        revision=t.state.revision,
        tool_calls=planned,
        cancel_requested=cancel_requested(t.state),
    )
    return t, answer


@command(pb.RecordUsageResponse)
def record_usage(
    request: pb.RecordUsageRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.RecordUsageResponse]:
    """Add a row to the lane's usage ledger (for the entry the request names, if any)."""
    usage_id = new_id()
    entry_id = request.entry_id or None
    t = runs.record_usage(state, usage_id, request.usage, entry_id, request.adjustment, now)
    return t, pb.RecordUsageResponse(usage_id=usage_id, revision=t.state.revision)
