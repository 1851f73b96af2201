"""Commands of a run's life: start, abort, end, turns, assistant settlement, usage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.commands.base import Command, Result, cancel_requested, run
from lane.server.commands.operation_state import lease_of
from lane.server.domain import runs
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store
from lane.server.store.run_settings import settings_of


@dataclass(frozen=True)
class StartRun(Command):
    #: None: the service mints one.
    operation_id: str | None
    prompt: Sequence[messages_pb2.AgentMessage]
    settings: pb.RunSettings
    #: (driver id, seconds) to lease the run to; None: an unleased run.
    lease: tuple[str, int] | None


@dataclass(frozen=True)
class RunStarted(Result[pb.StartRunResponse]):
    response = pb.StartRunResponse
    operation_id: str
    revision: int
    lease: pb.Lease | None


async def start_run(store: Store, command: StartRun) -> RunStarted:
    """Open a run: captured inbox items, then the prompt."""
    operation_id = command.operation_id or new_id()

    def step(state: LaneState, now: datetime) -> tuple[Transition, RunStarted]:
        t = runs.start_run(
            state,
            operation_id,
            command.prompt,
            settings_of(command.settings),
            now,
            new_id,
            command.lease,
        )
        started = RunStarted(
            operation_id=operation_id, revision=t.state.revision, lease=lease_of(t.operation)
        )
        return t, started

    return await run(store, command.lane, command.request, step, RunStarted)


@dataclass(frozen=True)
class AbortOperation(Command):
    operation_id: str


@dataclass(frozen=True)
class AbortRequested(Result[pb.AbortOperationResponse]):
    response = pb.AbortOperationResponse
    revision: int
    #: False when the abort had been requested before.
    newly_requested: bool


async def abort_operation(store: Store, command: AbortOperation) -> AbortRequested:
    """Ask the lane's open operation to abort."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, AbortRequested]:
        t = runs.abort_operation(state, command.operation_id, now)
        return t, AbortRequested(revision=t.state.revision, newly_requested=t.newly_requested)

    return await run(store, command.lane, command.request, step, AbortRequested)


@dataclass(frozen=True)
class EndRun(Command):
    operation_id: str
    status: snapshot_pb2.OperationResultStatus.ValueType
    #: With status FAILED only.
    error: snapshot_pb2.OperationError | None
    lease_token: int


@dataclass(frozen=True)
class RunEnded(Result[pb.EndRunResponse]):
    response = pb.EndRunResponse
    result: snapshot_pb2.OperationResult
    revision: int


async def end_run(store: Store, command: EndRun) -> RunEnded:
    """End the run: settle what is unfinished, record its result."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, RunEnded]:
        t = runs.end_run(
            state,
            command.operation_id,
            command.status,
            command.error,
            now,
            new_id,
            lease_token=command.lease_token,
        )
        return t, RunEnded(result=t.result, revision=t.state.revision)

    return await run(store, command.lane, command.request, step, RunEnded)


@dataclass(frozen=True)
class StartTurn(Command):
    operation_id: str
    #: None: the service mints one.
    turn_id: str | None
    lease_token: int


@dataclass(frozen=True)
class TurnStarted(Result[pb.StartTurnResponse]):
    response = pb.StartTurnResponse
    turn_id: str
    revision: int


async def start_turn(store: Store, command: StartTurn) -> TurnStarted:
    """Begin a turn (after the steering or follow-up messages it places)."""
    turn_id = command.turn_id or new_id()

    def step(state: LaneState, now: datetime) -> tuple[Transition, TurnStarted]:
        t = runs.start_turn(state, command.operation_id, turn_id, now, command.lease_token)
        return t, TurnStarted(turn_id=turn_id, revision=t.state.revision)

    return await run(store, command.lane, command.request, step, TurnStarted)


@dataclass(frozen=True)
class SettleAssistantMessage(Command):
    operation_id: str
    turn_id: str
    message: messages_pb2.AssistantMessage
    lease_token: int


@dataclass(frozen=True)
class AssistantSettled(Result[pb.SettleAssistantMessageResponse]):
    response = pb.SettleAssistantMessageResponse
    entry_id: str
    revision: int
    #: The calls the message planned, in source order.
    tool_calls: tuple[pb.PlannedToolCall, ...]
    cancel_requested: bool


async def settle_assistant_message(
    store: Store, command: SettleAssistantMessage
) -> AssistantSettled:
    """Place the settled assistant message; its tool calls become the planned batch."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, AssistantSettled]:
        t = runs.settle_assistant(
            state,
            command.operation_id,
            command.turn_id,
            command.message,
            now,
            new_id,
            command.lease_token,
        )
        planned = tuple(
            pb.PlannedToolCall(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                source_index=call.source_index,
                result_entry_id=call.result_entry_id,
            )
            for call in t.planned
        )
        settled = AssistantSettled(
            entry_id=t.entry_id,
            revision=t.state.revision,
            tool_calls=planned,
            cancel_requested=cancel_requested(t.state),
        )
        return t, settled

    return await run(store, command.lane, command.request, step, AssistantSettled)


@dataclass(frozen=True)
class RecordUsage(Command):
    usage: messages_pb2.Usage
    #: The entry the usage belongs to, if any.
    entry_id: str | None
    adjustment: bool


@dataclass(frozen=True)
class UsageRecorded(Result[pb.RecordUsageResponse]):
    response = pb.RecordUsageResponse
    usage_id: str
    revision: int


async def record_usage(store: Store, command: RecordUsage) -> UsageRecorded:
    """Add a row to the lane's usage ledger."""
    usage_id = new_id()

    def step(state: LaneState, now: datetime) -> tuple[Transition, UsageRecorded]:
        t = runs.record_usage(
            state, usage_id, command.usage, command.entry_id, command.adjustment, now
        )
        return t, UsageRecorded(usage_id=usage_id, revision=t.state.revision)

    return await run(store, command.lane, command.request, step, UsageRecorded)
