"""RPCs about lanes themselves: create, read, list, configure, enqueue."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from service.api import validation as v
from service.api.auth import caller_namespace
from service.api.base import Context, ServicerBase
from service.api.errors import unary
from service.domain import lanes, limits
from service.domain.errors import InvalidArgument
from service.domain.ids import new_id
from service.domain.state import LaneState
from service.domain.transition import Transition
from service.store.requests import RequestKey


class LaneRpcs(ServicerBase):
    """RPCs about lanes themselves: create, read, list, configure, enqueue."""

    @unary
    async def CreateLane(
        self, request: pb.CreateLaneRequest, context: Context
    ) -> pb.CreateLaneResponse:
        lane = self.lane(request.lane_id)
        v.require_id(request.request_id, "request_id", optional=True)
        v.check_message(request.configuration, "configuration")
        key = RequestKey.of("CreateLane", request, request.request_id)
        return await self.store.create_lane(lane, request.configuration, key)

    @unary
    async def GetLaneSnapshot(
        self, request: pb.GetLaneSnapshotRequest, context: Context
    ) -> pb.GetLaneSnapshotResponse:
        lane = self.lane(request.lane_id)
        outline = await self.store.snapshot_outline(lane)
        # Refused before the transcript is read: its size is known from the outline.
        transcript = sum(limits.transcript_entry_bytes(size) for _, size in outline.transcript)
        answer_bytes = limits.snapshot_answer_bytes(outline.snapshot.ByteSize() + transcript)
        limits.check_snapshot_message(lane.lane_id, answer_bytes)
        snapshot = await self.store.complete_snapshot(lane, outline)
        return pb.GetLaneSnapshotResponse(snapshot=snapshot)

    @unary
    async def ListLanes(
        self, request: pb.ListLanesRequest, context: Context
    ) -> pb.ListLanesResponse:
        v.require(
            0 <= request.page_size <= v.MAX_PAGE_SIZE,
            "INVALID_PAGE_SIZE",
            f"page_size must be between 0 and {v.MAX_PAGE_SIZE}",
            "page_size",
        )
        after = ""
        if request.page_token:
            try:
                after = base64.urlsafe_b64decode(request.page_token.encode()).decode()
                if not after.isprintable():
                    raise ValueError(after)
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise InvalidArgument(
                    "INVALID_PAGE_TOKEN",
                    "page_token is not a token ListLanes gave",
                    field="page_token",
                ) from None
        found, last = await self.store.list_lanes(
            caller_namespace(), request.page_size or v.DEFAULT_PAGE_SIZE, after
        )
        token = base64.urlsafe_b64encode(last.encode()).decode() if last else ""
        return pb.ListLanesResponse(lanes=found, next_page_token=token)

    @unary
    async def UpdateLaneConfig(
        self, request: pb.UpdateLaneConfigRequest, context: Context
    ) -> pb.UpdateLaneConfigResponse:
        v.check_message(request, "")
        model = request.model if request.HasField("model") else None
        level = request.thinking_level or None
        tools_ = (
            list(request.active_tool_names.names) if request.HasField("active_tool_names") else None
        )

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.UpdateLaneConfigResponse]:
            t = lanes.update_config(
                state, now, model=model, thinking_level=level, active_tool_names=tools_
            )
            return t, pb.UpdateLaneConfigResponse(
                revision=t.state.revision, configuration=t.state.configuration
            )

        return await self.command("UpdateLaneConfig", request, decide, pb.UpdateLaneConfigResponse)

    @unary
    async def EnqueueMessage(
        self, request: pb.EnqueueMessageRequest, context: Context
    ) -> pb.EnqueueMessageResponse:
        v.check_message(request, "")
        v.require(
            request.kind != snapshot_pb2.QUEUE_KIND_UNSPECIFIED,
            "MISSING_FIELD",
            "kind is required",
            "kind",
        )
        item = snapshot_pb2.QueuedItem(entry_id=new_id(), kind=request.kind)
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
            item.custom.CopyFrom(request.custom)
        else:
            v.require(
                request.HasField("message"),
                "INVALID_MESSAGE",
                "a queued message needs message",
                "message",
            )
            v.require_kind(request.message, "message", "user", "custom")
            item.message.CopyFrom(request.message)

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.EnqueueMessageResponse]:
            t = lanes.enqueue(state, item, now)
            return t, pb.EnqueueMessageResponse(entry_id=item.entry_id, revision=t.state.revision)

        return await self.command("EnqueueMessage", request, decide, pb.EnqueueMessageResponse)
