"""RPCs about lanes themselves: create, read, list, configure, enqueue, delete."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.api import lane_lists as lists
from lane.server.api import validation as v
from lane.server.api.answer_size import check_snapshot_message
from lane.server.api.auth import caller_namespace
from lane.server.api.base import ServicerBase, command_rpc
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.api.framing import snapshot_answer_bytes
from lane.server.commands import lanes
from lane.server.commands.base import Address
from lane.server.store import ActivityPosition


def _update_lane_config(request: pb.UpdateLaneConfigRequest) -> None:
    v.check_message(request, "")


def _enqueue_message(request: pb.EnqueueMessageRequest) -> None:
    v.check_message(request, "")
    v.require(
        request.kind != snapshot_pb2.QUEUE_KIND_UNSPECIFIED,
        "MISSING_FIELD",
        "kind is required",
        "kind",
    )
    if request.kind == snapshot_pb2.QUEUE_KIND_WRITE:
        v.require(
            request.HasField("custom"), "INVALID_MESSAGE", "a WRITE item needs custom", "custom"
        )
        v.require(
            bool(request.custom.custom_type),
            "MISSING_FIELD",
            "custom.custom_type is required",
            "custom.custom_type",
        )
    else:
        v.require(
            request.HasField("message"),
            "INVALID_MESSAGE",
            "a queued message needs message",
            "message",
        )
        v.require_kind(request.message, "message", "user", "custom")


class LaneRpcs(ServicerBase):
    """RPCs about lanes themselves: create, read, list, configure, enqueue, delete."""

    @unary
    async def CreateLane(self, request: pb.CreateLaneRequest, call: Call) -> pb.CreateLaneResponse:
        lane, key = self.addressed(call, request)  # checked before the configuration
        v.check_message(request.configuration, "configuration")
        return await lanes.create_lane(self.store, Address(lane, key), request)

    @unary
    async def GetLaneSnapshot(
        self, request: pb.GetLaneSnapshotRequest, call: Call
    ) -> pb.GetLaneSnapshotResponse:
        lane = self.lane(request.lane_id)
        outline = await self.store.snapshot_outline(lane)
        if not call.framed:
            # One message carries the unary answer: refused before the transcript is read
            # (its size is known from the outline). DriveLane sends a larger one in parts.
            sizes = [size for _, size in outline.transcript]
            check_snapshot_message(
                lane.lane_id, snapshot_answer_bytes(outline.snapshot.ByteSize(), sizes)
            )
        snapshot = await self.store.complete_snapshot(lane, outline)
        return pb.GetLaneSnapshotResponse(snapshot=snapshot)

    @unary
    async def ListLanes(self, request: pb.ListLanesRequest, call: Call) -> pb.ListLanesResponse:
        v.require(
            0 <= request.page_size <= v.MAX_PAGE_SIZE,
            "INVALID_PAGE_SIZE",
            f"page_size must be between 0 and {v.MAX_PAGE_SIZE}",
            "page_size",
        )
        v.check_message(request, "")  # unknown statuses and orders
        lanes = lists.lane_filter(request.lane_id_prefix, request.statuses)
        size = request.page_size or v.DEFAULT_PAGE_SIZE
        by_activity = request.order == pb.LANE_ORDER_LAST_ACTIVITY
        if by_activity:
            after_activity, after_id = lists.after_activity(request.page_token), ""
        else:
            after_activity, after_id = None, lists.after_id(request.page_token)
        # One more than the page: whether another page follows.
        rows = await self.store.lane_summaries(
            caller_namespace(),
            lanes,
            size + 1,
            after_id=after_id,
            after_activity=after_activity,
            by_activity=by_activity,
        )
        token = ""
        if len(rows) > size:
            del rows[size:]
            last = rows[-1]
            token = (
                lists.activity_token(ActivityPosition(last.last_activity, last.lane_id))
                if by_activity
                else lists.id_token(last.lane_id)
            )
        return pb.ListLanesResponse(lanes=[row.line() for row in rows], next_page_token=token)

    UpdateLaneConfig = command_rpc(lanes.update_lane_config, _update_lane_config)
    EnqueueMessage = command_rpc(lanes.enqueue_message, _enqueue_message)
    DeleteLane = command_rpc(lanes.delete_lane)
