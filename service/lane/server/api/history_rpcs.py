"""ReadLaneEvents: a page of a lane's event log, read without following it.

A history view or a view of the lane at an earlier revision (the web console's time travel)
reads the log a page at a time and folds it with the reducer, as a watcher folds its stream.
The page starts where WatchLane's ``after_revision`` may (log_positions.py), holds whole
groups, and is read through the watchers' read queue (watcher_reads.py), so a burst of history
reads queues instead of taking the pool from commands.

The events are stored encoded; the answer is framed from those bytes (framing.py) and parsed
once into the response message, off the event loop when it is large.
"""

from __future__ import annotations

import asyncio

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.api.framing import length_delimited, varint
from lane.server.hub.log_positions import check_start, out_of_range
from lane.server.store import EventGroup, IncarnationGone
from lane.server.store.store_reads import lane_not_found

#: ReadLaneEvents' page_size: the default and the most.
DEFAULT_EVENTS = 1_000
MAX_EVENTS = 10_000
#: About the most bytes of events one answer holds (whole groups; the first whatever its size).
MAX_PAGE_BYTES = 1 << 20
#: Answers larger than this are parsed in a worker thread (a few milliseconds per MiB).
_PARSE_INLINE_BYTES = 64 << 10

_RESPONSE = pb.ReadLaneEventsResponse.DESCRIPTOR
_GROUPS = _RESPONSE.fields_by_name["groups"].number
_HEAD = _RESPONSE.fields_by_name["head_revision"].number
_FLOOR = _RESPONSE.fields_by_name["retention_floor"].number
_INCARNATION = _RESPONSE.fields_by_name["incarnation"].number
_EVENTS = pb.EventGroup.DESCRIPTOR.fields_by_name["events"].number


def page_bytes(groups: list[EventGroup], head: int, floor: int, incarnation: str) -> bytes:
    """The encoded ReadLaneEventsResponse holding ``groups`` (their stored event bodies)."""
    parts = [
        length_delimited(_GROUPS, b"".join(length_delimited(_EVENTS, b) for b in group.bodies))
        for group in groups
    ]
    parts.append(varint(_HEAD << 3) + varint(head))
    parts.append(varint(_FLOOR << 3) + varint(floor))
    parts.append(length_delimited(_INCARNATION, incarnation.encode()))
    return b"".join(parts)


class HistoryRpcs(ServicerBase):
    """ReadLaneEvents (module docstring)."""

    @unary
    async def ReadLaneEvents(
        self, request: pb.ReadLaneEventsRequest, call: Call
    ) -> pb.ReadLaneEventsResponse:
        lane = self.lane(request.lane_id)
        v.require_id(request.incarnation, "incarnation", optional=True)
        v.require(
            0 <= request.page_size <= MAX_EVENTS,
            "INVALID_PAGE_SIZE",
            f"page_size must be between 0 and {MAX_EVENTS}",
            "page_size",
        )
        after = request.after_revision
        reads = self.watcher_reads
        point = await reads.resume_point(lane, after)
        check_start(lane.lane_id, after, request.incarnation, point, verb="read")
        try:
            groups = await reads.read_events(
                lane, after, request.page_size or DEFAULT_EVENTS, MAX_PAGE_BYTES, point.incarnation
            )
        except IncarnationGone:
            raise lane_not_found(lane) from None  # deleted between the two reads
        if groups and groups[0].first_revision != after + 1:
            # Retention removed the events after `after` between the two reads.
            head, floor = await reads.lane_head(lane)
            raise out_of_range(lane.lane_id, after, floor, head, verb="read")
        data = page_bytes(groups, point.head, point.floor, str(point.incarnation))
        del groups
        if len(data) <= _PARSE_INLINE_BYTES:
            return pb.ReadLaneEventsResponse.FromString(data)
        return await asyncio.to_thread(pb.ReadLaneEventsResponse.FromString, data)
