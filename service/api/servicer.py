"""The LaneService servicer."""

from __future__ import annotations

import grpc
from lane.v1 import lane_service_pb2_grpc

from service.store import Store


class LaneServicer(lane_service_pb2_grpc.LaneServiceServicer):
    """Implements lane.v1.LaneService on a :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store


def add_lane_service(server: grpc.aio.Server, store: Store) -> None:
    """Register the LaneService on ``server``."""
    lane_service_pb2_grpc.add_LaneServiceServicer_to_server(LaneServicer(store), server)
