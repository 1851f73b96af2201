"""The gRPC face: proto ↔ domain, request validation, the one error table."""

from lane.server.api.servicer import SERVICE_NAME, LaneServicer, add_lane_service
from lane.server.api.watch import WatchSettings

__all__ = ["SERVICE_NAME", "LaneServicer", "WatchSettings", "add_lane_service"]
