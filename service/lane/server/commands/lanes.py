"""Commands on a lane itself: create, configure, enqueue, delete."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.commands.base import Address, command, recording
from lane.server.domain import lanes
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import Store


async def create_lane(
    store: Store, at: Address, request: pb.CreateLaneRequest
) -> pb.CreateLaneResponse:
    """Get-or-create the lane; a new one emits lane_created (created: False when the lane
    existed already, left as it was)."""
    created = lanes.create_lane(at.lane.lane_id, request.configuration, store.clock())

    def answer(inserted: bool, state: LaneState) -> pb.CreateLaneResponse:
        return pb.CreateLaneResponse(created=inserted, revision=state.revision)

    recorded = recording(at.key, pb.CreateLaneResponse)
    return await store.create_lane(at.lane, created, answer, recorded)


@command(pb.UpdateLaneConfigResponse)
def update_lane_config(
    request: pb.UpdateLaneConfigRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.UpdateLaneConfigResponse]:
    """Replace the configuration fields the request names (each absent one left as it is)."""
    names = request.active_tool_names.names if request.HasField("active_tool_names") else None
    t = lanes.update_config(
        state,
        now,
        model=request.model if request.HasField("model") else None,
        thinking_level=request.thinking_level or None,
        active_tool_names=list(names) if names is not None else None,
    )
    configured = t.state.configuration
    return t, pb.UpdateLaneConfigResponse(revision=t.state.revision, configuration=configured)


@command(pb.EnqueueMessageResponse)
def enqueue_message(
    request: pb.EnqueueMessageRequest, state: LaneState, now: datetime
) -> tuple[Transition, pb.EnqueueMessageResponse]:
    """Append an item to the lane's inbox: a WRITE item's custom entry, any other kind's
    message (entry_id: the id the item's entry gets when a run places it)."""
    item = snapshot_pb2.QueuedItem(entry_id=new_id(), kind=request.kind)
    if request.kind == snapshot_pb2.QUEUE_KIND_WRITE:
        item.custom.CopyFrom(request.custom)
    else:
        item.message.CopyFrom(request.message)
    t = lanes.enqueue(state, item, now)
    return t, pb.EnqueueMessageResponse(entry_id=item.entry_id, revision=t.state.revision)


async def delete_lane(
    store: Store, at: Address, request: pb.DeleteLaneRequest
) -> pb.DeleteLaneResponse:
    """Delete the lane and everything of it, in one transaction (refused while an operation is
    open, unless forced: the operation is deleted with the lane, not ended first, since no
    event of its end could outlive the lane). The answer names the lane's revision when it was
    deleted and the open operation deleted with it ('' when none was open)."""

    def answer(state: LaneState) -> pb.DeleteLaneResponse:
        operation = state.operation
        return pb.DeleteLaneResponse(
            revision=state.revision, operation_id=operation.operation_id if operation else ""
        )

    recorded = recording(at.key, pb.DeleteLaneResponse)
    return await store.delete_lane(at.lane, request.force, answer, recorded)
