"""gRPC statuses as Connect errors, for the HTTP port: the same code, message and details (the
google.rpc.ErrorInfo, and RetryInfo when there is one) as the gRPC port's trailer carries."""

from __future__ import annotations

import time
from typing import Any

import grpc
from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError, ErrorDetail
from google.rpc import code_pb2, error_details_pb2, status_pb2
from protobuf.wkt import Any as ConnectAny

from lane.server.api.instrument import method_metrics

STATUS_DETAILS_KEY = "grpc-status-details-bin"


def connect_error(code: Any, message: str, details_bin: Any) -> ConnectError:
    """A Connect error of gRPC status ``code`` (a grpc.StatusCode or its number) carrying the
    details of the serialized google.rpc.Status ``details_bin``."""
    number = code.value[0] if isinstance(code, grpc.StatusCode) else int(code)
    name = code_pb2.Code.Name(number) if number in code_pb2.Code.values() else "UNKNOWN"
    connect_code = ConnectCode.CANCELED if name == "CANCELLED" else ConnectCode(name.lower())
    details: list[ErrorDetail] = []
    if isinstance(details_bin, bytes):
        for detail in status_pb2.Status.FromString(details_bin).details:
            details.append(ErrorDetail(ConnectAny(type_url=detail.type_url, value=detail.value)))
    return ConnectError(connect_code, message, details)


def refusal_error(status: status_pb2.Status) -> ConnectError:
    """The Connect error of a google.rpc.Status."""
    return connect_error(status.code, status.message, status.SerializeToString())


def status_message(status: grpc.Status) -> status_pb2.Status:
    """The google.rpc.Status a grpc.Status carries in its trailing metadata."""
    for key, value in status.trailing_metadata or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return status_pb2.Status(code=status.code.value[0], message=status.details or "")


def refused_before_handler(
    method: str, unary: bool, status: status_pb2.Status, started: float
) -> ConnectError:
    """Count a unary call refused before its handler ran (``lane_commands_total``, as the gRPC
    port counts it) and return its Connect error."""
    if unary:
        method_metrics(method).answered(
            code_pb2.Code.Name(status.code), _reason_of(status), time.perf_counter() - started
        )
    return refusal_error(status)


def _reason_of(status: status_pb2.Status) -> str:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""
