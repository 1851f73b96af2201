"""The gRPC face: proto ↔ domain, request validation, the one error table."""

from service.api.servicer import add_lane_service

__all__ = ["add_lane_service"]
