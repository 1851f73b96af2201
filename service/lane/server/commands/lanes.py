"""Commands on a lane itself: create, configure, enqueue, delete."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import Command, Result, recording, run
from lane.server.domain import lanes
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store


@dataclass(frozen=True)
class CreateLane(Command):
    configuration: snapshot_pb2.LaneConfiguration


@dataclass(frozen=True)
class LaneCreated(Result[pb.CreateLaneResponse]):
    response = pb.CreateLaneResponse
    #: False when the lane existed already (left as it was).
    created: bool
    revision: int


async def create_lane(store: Store, command: CreateLane) -> LaneCreated:
    """Get-or-create the lane; a new one emits lane_created."""
    created = lanes.create_lane(command.lane.lane_id, command.configuration, store.clock())

    def answer(inserted: bool, state: LaneState) -> LaneCreated:
        return LaneCreated(created=inserted, revision=state.revision)

    return await store.create_lane(
        command.lane, created, answer, recording(command.request, LaneCreated)
    )


@dataclass(frozen=True)
class UpdateLaneConfig(Command):
    #: None: left as it is (each field).
    model: snapshot_pb2.ModelRef | None
    thinking_level: snapshot_pb2.ThinkingLevel.ValueType | None
    active_tool_names: tuple[str, ...] | None


@dataclass(frozen=True)
class LaneConfigured(Result[pb.UpdateLaneConfigResponse]):
    response = pb.UpdateLaneConfigResponse
    revision: int
    configuration: snapshot_pb2.LaneConfiguration


async def update_lane_config(store: Store, command: UpdateLaneConfig) -> LaneConfigured:
    """Replace the given configuration fields."""
    names = command.active_tool_names

    def step(state: LaneState, now: datetime) -> tuple[Transition, LaneConfigured]:
        t = lanes.update_config(
            state,
            now,
            model=command.model,
            thinking_level=command.thinking_level,
            active_tool_names=list(names) if names is not None else None,
        )
        return t, LaneConfigured(revision=t.state.revision, configuration=t.state.configuration)

    return await run(store, command.lane, command.request, step, LaneConfigured)


#: What a queued item holds: a WRITE item's custom entry, any other kind's message.
QueuedContent = entries_pb2.CustomEntry | messages_pb2.AgentMessage


@dataclass(frozen=True)
class EnqueueMessage(Command):
    kind: snapshot_pb2.QueueKind.ValueType
    item: QueuedContent


@dataclass(frozen=True)
class MessageQueued(Result[pb.EnqueueMessageResponse]):
    response = pb.EnqueueMessageResponse
    #: The id the item's entry gets when a run places it.
    entry_id: str
    revision: int


async def enqueue_message(store: Store, command: EnqueueMessage) -> MessageQueued:
    """Append an item to the lane's inbox."""
    item = snapshot_pb2.QueuedItem(entry_id=new_id(), kind=command.kind)
    if isinstance(command.item, entries_pb2.CustomEntry):
        item.custom.CopyFrom(command.item)
    else:
        item.message.CopyFrom(command.item)

    def step(state: LaneState, now: datetime) -> tuple[Transition, MessageQueued]:
        t = lanes.enqueue(state, item, now)
        return t, MessageQueued(entry_id=item.entry_id, revision=t.state.revision)

    return await run(store, command.lane, command.request, step, MessageQueued)


@dataclass(frozen=True)
class DeleteLane(Command):
    #: Delete the lane even with an operation open (the operation goes with it).
    force: bool


@dataclass(frozen=True)
class LaneDeleted(Result[pb.DeleteLaneResponse]):
    response = pb.DeleteLaneResponse
    #: The lane's revision when it was deleted.
    revision: int
    #: The open operation deleted with the lane ('' when none was open).
    operation_id: str


async def delete_lane(store: Store, command: DeleteLane) -> LaneDeleted:
    """Delete the lane and everything of it, in one transaction (refused while an operation is
    open, unless forced: the operation is deleted with the lane, not ended first, since no
    event of its end could outlive the lane)."""

    def answer(state: LaneState) -> LaneDeleted:
        operation = state.operation
        return LaneDeleted(
            revision=state.revision, operation_id=operation.operation_id if operation else ""
        )

    return await store.delete_lane(
        command.lane, command.force, answer, recording(command.request, LaneDeleted)
    )
