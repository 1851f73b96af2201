"""What every RPC group shares: the store and hub, and running one command."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from lane.v1 import lane_service_pb2_grpc

from service.api import validation as v
from service.api.auth import Authenticator, caller_namespace
from service.api.watch import WatchSettings
from service.domain.state import LaneState
from service.domain.transition import Transition
from service.hub import Hub
from service.store import LaneRef, Store
from service.store.requests import RequestKey

Context = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R", bound=Message)


def cancel_requested(state: LaneState) -> bool:
    """Whether the lane's open operation was asked to abort (drivers learn it from answers)."""
    return state.operation is not None and state.operation.cancel_requested


class ServicerBase(lane_service_pb2_grpc.LaneServiceServicer):
    """The servicer's state; the RPC groups are mixins over it."""

    def __init__(
        self,
        store: Store,
        hub: Hub,
        watch_settings: WatchSettings,
        authenticator: Authenticator,
    ) -> None:
        self.store = store
        self.hub = hub
        self.watch_settings = watch_settings
        self.authenticator = authenticator

    @staticmethod
    def lane(lane_id: str) -> LaneRef:
        """The caller's lane ``lane_id`` (validated), in the namespace its token admits it to."""
        v.require_id(lane_id, "lane_id")
        return LaneRef(caller_namespace(), lane_id)

    async def command(
        self,
        method: str,
        request: Any,
        decide: Callable[[LaneState, datetime], tuple[Transition, R]],
        answer_type: type[R],
    ) -> R:
        """Validate the lane and request ids, then run ``decide`` as one command (idempotent
        under the request's ``request_id``)."""
        lane = self.lane(request.lane_id)
        request_id = getattr(request, "request_id", "")  # lease renewal/release have none
        v.require_id(request_id, "request_id", optional=True)
        key = RequestKey.of(method, request, request_id)
        return await self.store.command(lane, decide, answer_type, key)
