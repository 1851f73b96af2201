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

from dataclasses import dataclass, replace
from datetime import datetime

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

from lane.server.commands.base import Command, Result, cancel_requested, run
from lane.server.domain import placement, tools
from lane.server.domain.ids import new_id
from lane.server.domain.run_inputs import Outcome
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store


@dataclass(frozen=True)
class StartToolCall(Command):
    operation_id: str
    tool_call_id: str
    #: The effective arguments (after hooks), a JSON object.
    arguments_json: str
    replay: pb.ReplayPolicy.ValueType
    lease_token: int


@dataclass(frozen=True)
class ToolCallStarted(Result[pb.StartToolCallResponse]):
    response = pb.StartToolCallResponse
    revision: int
    cancel_requested: bool


async def start_tool_call(store: Store, command: StartToolCall) -> ToolCallStarted:
    """The call's intent: it is about to run with these arguments."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, ToolCallStarted]:
        t = tools.start_tool_call(
            state,
            command.operation_id,
            command.tool_call_id,
            command.arguments_json,
            command.replay,
            now,
            command.lease_token,
        )
        started = ToolCallStarted(
            revision=t.state.revision, cancel_requested=cancel_requested(t.state)
        )
        return t, started

    return await run(store, command.lane, command.request, step, ToolCallStarted)


@dataclass(frozen=True)
class UpdateToolCall(Command):
    operation_id: str
    tool_call_id: str
    partial_result: messages_pb2.ToolResult
    #: Also the call's recovery point.
    checkpoint: bool
    lease_token: int


@dataclass(frozen=True)
class ToolCallUpdated(Result[pb.UpdateToolCallResponse]):
    response = pb.UpdateToolCallResponse
    revision: int
    cancel_requested: bool


async def update_tool_call(store: Store, command: UpdateToolCall) -> ToolCallUpdated:
    """Progress of a running call."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, ToolCallUpdated]:
        t = tools.update_tool_call(
            state,
            command.operation_id,
            command.tool_call_id,
            command.partial_result,
            command.checkpoint,
            now,
            command.lease_token,
        )
        updated = ToolCallUpdated(
            revision=t.state.revision, cancel_requested=cancel_requested(t.state)
        )
        return t, updated

    return await run(store, command.lane, command.request, step, ToolCallUpdated)


@dataclass(frozen=True)
class StageToolOutcome(Command):
    operation_id: str
    tool_call_id: str
    outcome: Outcome
    lease_token: int


@dataclass(frozen=True)
class OutcomeStaged(Result[pb.StageToolOutcomeResponse]):
    """StageToolOutcome's answer; also the staging step's (nothing placed yet)."""

    response = pb.StageToolOutcomeResponse
    #: The staging commit's revision.
    staged_revision: int
    #: The placement commit's revision (the staging's when it placed nothing).
    revision: int
    placed_tool_call_ids: tuple[str, ...]
    batch_complete: bool
    cancel_requested: bool
    #: The call's result message as staged.
    staged: messages_pb2.ToolResultMessage

    @property
    def placement_included(self) -> bool:
        """Whether this answer already holds a placement: an answer recorded under the
        request's own key before placement had a key of its own held both commits."""
        return self.revision != self.staged_revision or bool(self.placed_tool_call_ids)


@dataclass(frozen=True)
class ReadyPlaced(Result[pb.StageToolOutcomeResponse]):
    """The placement step's answer: only the fields placement sets (``revision`` is the
    lane's when nothing was placed, and then not part of the command's answer)."""

    response = pb.StageToolOutcomeResponse
    revision: int
    placed_tool_call_ids: tuple[str, ...]
    batch_complete: bool


async def stage_tool_outcome(store: Store, command: StageToolOutcome) -> OutcomeStaged:
    """Stage the call's outcome, then place the ready prefix: two commits (module docstring)."""

    def stage(state: LaneState, now: datetime) -> tuple[Transition, OutcomeStaged]:
        t = tools.stage_tool_outcome(
            state,
            command.operation_id,
            command.tool_call_id,
            command.outcome,
            now,
            command.lease_token,
        )
        staged = OutcomeStaged(
            staged_revision=t.state.revision,
            revision=t.state.revision,
            placed_tool_call_ids=(),
            batch_complete=False,
            cancel_requested=cancel_requested(t.state),
            staged=t.staged,
        )
        return t, staged

    def place(state: LaneState, now: datetime) -> tuple[Transition, ReadyPlaced]:
        t = placement.place_ready(state, now, new_id)
        placed = ReadyPlaced(
            revision=t.state.revision,
            placed_tool_call_ids=t.placed_tool_call_ids,
            batch_complete=t.batch_complete,
        )
        return t, placed

    request = command.request
    staged = await run(store, command.lane, request, stage, OutcomeStaged)
    if staged.placement_included:
        return staged
    step_key = request.step("place") if request is not None else None
    placed = await run(store, command.lane, step_key, place, ReadyPlaced)
    if not placed.placed_tool_call_ids:
        return staged  # the placement committed nothing: the answer is the staging's
    return replace(
        staged,
        revision=placed.revision,
        placed_tool_call_ids=placed.placed_tool_call_ids,
        batch_complete=placed.batch_complete,
    )
