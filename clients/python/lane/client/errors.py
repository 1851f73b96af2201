"""Errors of the Python lane client.

The service answers every refusal with a gRPC status carrying one ``google.rpc.ErrorInfo``
(domain ``lane.v1``) whose ``reason`` is stable and whose ``metadata`` holds the values of the
message (docs/contract.md). :func:`lane_error` turns a failed call into a :class:`LaneError` that
exposes them directly::

    try:
        await stub.GetLaneSnapshot(request)
    except grpc.aio.AioRpcError as err:
        raise lane_error(err) from err

A status without rich details (a transport failure such as UNAVAILABLE "connection refused")
gives an empty ``reason`` and empty ``metadata``.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = ["LaneError", "WatchProtocolError", "lane_error", "status_error"]

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class LaneError(Exception):
    """A failed lane service call: its status code, ErrorInfo reason and metadata, message."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str = "",
        message: str = "",
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(code, reason, message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        reason = f" {self.reason}" if self.reason else ""
        return f"{self.code.name}{reason}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"LaneError(code={self.code.name}, reason={self.reason!r}, "
            f"message={self.message!r}, metadata={self.metadata!r})"
        )


class WatchProtocolError(Exception):
    """The WatchLane stream broke its contract (a revision gap or duplicate, a misplaced
    message). The watch stops rather than fold a history it cannot trust."""


def lane_error(err: grpc.aio.AioRpcError) -> LaneError:
    """The :class:`LaneError` of a failed call: code, message, and the ErrorInfo if any."""
    code = err.code()
    message = err.details() or ""
    reason = ""
    metadata: dict[str, str] = {}
    try:
        status = rpc_status.from_call(err)
    except ValueError:
        # The rich status disagrees with the call's own code or message: trust the call.
        status = None
    if status is not None:
        message = status.message or message
        reason, metadata = _error_info(status)
    return LaneError(code, reason, message, metadata)


def status_error(status: status_pb2.Status) -> LaneError:
    """The :class:`LaneError` of a ``google.rpc.Status`` (a DriveLane answer's ``error``): the
    same error :func:`lane_error` gives for the unary call refused with that status."""
    reason, metadata = _error_info(status)
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return LaneError(code, reason, status.message, metadata)


def _error_info(status: status_pb2.Status) -> tuple[str, dict[str, str]]:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason, dict(info.metadata)
    return "", {}
