"""Taking a lane out as an export file and bringing one in as a new lane."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from lane.v1 import lane_service_pb2 as pb

from lane.server.commands.base import Result
from lane.server.domain.export_format import LaneExport, export_lines, renamed
from lane.server.store import LaneRef, Store


async def export_lane(store: Store, lane: LaneRef) -> Iterator[bytes]:
    """The idle lane's export file, line by line (read in one transaction first)."""
    export = await store.export_lane(lane)
    return export_lines(export, store.clock())


@dataclass(frozen=True)
class LaneImported(Result[pb.ImportLaneResponse]):
    response = pb.ImportLaneResponse
    lane_id: str
    revision: int
    entry_count: int
    event_count: int


async def import_lane(store: Store, lane: LaneRef, export: LaneExport) -> LaneImported:
    """Create ``lane`` holding what ``export`` (already checked) holds: its events and lane
    record now name the new lane; its last result is not kept (operation ids belong to the
    exported lane)."""
    renamed(export.event_groups, lane.lane_id)
    export.lane.lane_id = lane.lane_id
    export.lane.ClearField("last_result")
    await store.import_lane(lane, export)
    return LaneImported(
        lane_id=lane.lane_id,
        revision=export.lane.revision,
        entry_count=len(export.entries),
        event_count=sum(len(group) for group in export.event_groups),
    )
