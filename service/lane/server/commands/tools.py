"""Commands of a tool call's life: intent, progress, and staging with the placement after it.

StageToolOutcome is one command of two steps, each its own transaction, in this order (the
contract: the call's tool_end in one commit, its placement in the next):

1. staging — the call's outcome, recorded under the request's key;
2. placement — the ready source-order prefix of the batch, recorded under the key of the
   request's ``place`` step (``RequestKey.step``), even when nothing was ready.

A retry replays the staging's answer and then the placement's, or runs the placement if it
never committed (the service stopped between the two): what is ready is placed and the answer
names it. A retry without a request id is a new request: its staging is refused (the call is
staged already); the placement left pending is finished by the service all the same
(pending_placement.py).
"""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import Address, cancel_requested, command, progress, run
from lane.server.domain import placement, tools
from lane.server.domain.ids import new_id
from lane.server.domain.run_inputs import Executed, Outcome, Synthetic
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store

Answer = pb.StageToolOutcomeResponse


@command(pb.StartToolCallResponse)
def start_tool_call(
    request: pb.StartToolCallRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.StartToolCallResponse]:
    """The call's intent: it is about to run with these (effective) arguments."""
    t = tools.start_tool_call(
        state,
        request.operation_id,
        request.tool_call_id,
        request.arguments_json,
        request.replay or pb.REPLAY_POLICY_NEVER,
        now,
        request.lease_token,
    )
    return t, progress(pb.StartToolCallResponse, t)


@command(pb.UpdateToolCallResponse)
def update_tool_call(
    request: pb.UpdateToolCallRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.UpdateToolCallResponse]:
    """Progress of a running call (with ``checkpoint``, also its recovery point)."""
    t = tools.update_tool_call(
        state,
        request.operation_id,
        request.tool_call_id,
        request.partial_result,
        request.checkpoint,
        now,
        request.lease_token,
    )
    return t, progress(pb.UpdateToolCallResponse, t)


async def stage_tool_outcome(
    store: Store, at: Address, request: pb.StageToolOutcomeRequest
) -> Answer:
    """Stage the call's outcome, then place the ready prefix: two commits (module docstring)."""
    outcome = outcome_of(request)

    def stage(state: LaneState, now: datetime) -> tuple[Transition, Answer]:
        t = tools.stage_tool_outcome(
            state, request.operation_id, request.tool_call_id, outcome, now, request.lease_token
        )
        staged = Answer(
            staged_revision=t.state.revision,
            revision=t.state.revision,
            cancel_requested=cancel_requested(t.state),
            staged=t.staged,
        )
        return t, staged

    def place(state: LaneState, now: datetime) -> tuple[Transition, Answer]:
        # Only the fields placement sets (``revision`` is the lane's when nothing was placed,
        # and then not part of the command's answer).
        t = placement.place_ready(state, now, new_id)
        placed = Answer(
            revision=t.state.revision,
            placed_tool_call_ids=t.placed_tool_call_ids,
            batch_complete=t.batch_complete,
        )
        return t, placed

    staged = await run(store, at, stage, Answer)
    if placement_included(staged):
        return staged
    step_key = at.key.step("place") if at.key is not None else None
    placed = await run(store, Address(at.lane, step_key), place, Answer)
    if not placed.placed_tool_call_ids:
        return staged  # the placement committed nothing: the answer is the staging's
    answer = Answer()
    answer.CopyFrom(staged)
    answer.MergeFrom(placed)
    return answer


def placement_included(staged: Answer) -> bool:
    """Whether a staging's answer already holds a placement: an answer recorded under the
    request's own key before placement had a key of its own held both commits."""
    return staged.revision != staged.staged_revision or bool(staged.placed_tool_call_ids)


def outcome_of(request: pb.StageToolOutcomeRequest) -> Outcome:
    """The domain's value of the request's outcome: the tool's result, or the service's."""
    if request.WhichOneof("outcome") == "executed":
        return Executed(request.executed.result, request.executed.is_error)
    synthetic = request.synthetic
    return Synthetic(synthetic.cause, synthetic.message, synthetic.terminate)
