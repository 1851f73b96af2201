"""Lane-level commands: create, configure, enqueue."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import events_pb2, messages_pb2, snapshot_pb2

from lane.server.domain.errors import ResourceExhausted
from lane.server.domain.event_log import EventLog
from lane.server.domain.limits import MAX_INBOX_BYTES
from lane.server.domain.state import LaneState, evolve
from lane.server.domain.transition import Transition


def create_lane(
    lane_id: str, configuration: snapshot_pb2.LaneConfiguration, now: datetime
) -> Transition:
    """A new, empty lane; emits lane_created."""
    state = LaneState(
        lane_id=lane_id,
        revision=0,
        tip_id="",
        configuration=configuration,
        message_count=0,
        usage_totals=messages_pb2.Usage(),
    )
    log = EventLog(lane_id, 0, now)
    log.emit("lane_created", events_pb2.LaneCreatedEvent())
    return Transition.of(evolve(state, revision=log.revision), log)


def update_config(
    state: LaneState,
    now: datetime,
    *,
    model: snapshot_pb2.ModelRef | None = None,
    thinking_level: snapshot_pb2.ThinkingLevel.ValueType | None = None,
    active_tool_names: list[str] | None = None,
) -> Transition:
    """Replace the given configuration fields; emits one config_update naming what changed."""
    old = state.configuration
    new = snapshot_pb2.LaneConfiguration()
    new.CopyFrom(old)
    change = events_pb2.ConfigUpdateEvent()
    changed = False
    if model is not None and model != old.model:
        new.model.CopyFrom(model)
        change.model.value.CopyFrom(model)
        change.model.previous.CopyFrom(old.model)
        changed = True
    if thinking_level is not None and thinking_level != old.thinking_level:
        new.thinking_level = thinking_level
        change.thinking_level.value = thinking_level
        change.thinking_level.previous = old.thinking_level
        changed = True
    if active_tool_names is not None and list(active_tool_names) != list(old.active_tool_names):
        del new.active_tool_names[:]
        new.active_tool_names.extend(active_tool_names)
        change.active_tools.value.extend(active_tool_names)
        change.active_tools.previous.extend(old.active_tool_names)
        changed = True
    log = EventLog(state.lane_id, state.revision, now)
    if changed:
        log.emit("config_update", change)
    return Transition.of(evolve(state, configuration=new, revision=log.revision), log)


#: The inbox's budget (limits.py): queue_update carries the whole queue.
MAX_QUEUE_BYTES = MAX_INBOX_BYTES


def enqueue(state: LaneState, item: snapshot_pb2.QueuedItem, now: datetime) -> Transition:
    """Append ``item`` to the inbox; emits queue_update with the whole queue."""
    inbox = (*state.inbox, item)
    size = sum(queued.ByteSize() for queued in inbox)
    if size > MAX_QUEUE_BYTES:
        raise ResourceExhausted(
            "QUEUE_FULL",
            f"lane {state.lane_id}'s inbox would hold {size} bytes; the limit is {MAX_QUEUE_BYTES}",
            laneId=state.lane_id,
            bytes=size,
            limit=MAX_QUEUE_BYTES,
        )
    log = EventLog(state.lane_id, state.revision, now)
    log.emit("queue_update", events_pb2.QueueUpdateEvent(queues=inbox))
    return Transition.of(evolve(state, inbox=inbox, revision=log.revision), log)
