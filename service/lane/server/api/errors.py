"""The one error table: domain refusals → gRPC status + google.rpc.ErrorInfo.

Every refusal reaches the client with its documented code and exactly one ErrorInfo (domain
``lane.v1``) whose ``reason`` is stable and whose ``metadata`` holds the message's values.
Anything unexpected is logged and answered INTERNAL — never UNKNOWN, never a stack trace.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from psycopg import OperationalError
from psycopg.errors import ReadOnlySqlTransaction
from psycopg_pool import PoolTimeout

from lane.server.api.call import Call, Context
from lane.server.domain.errors import Code, LaneError
from lane.server.log_repeats import RepeatLimiter
from lane.server.store.pool import DEFAULT_RECONNECT_SECONDS, DatabaseBusy, DatabaseUnreachable

log = logging.getLogger(__name__)
#: Every call fails alike while the database is away: one line, then a count per 10 s.
_outage_log = RepeatLimiter(log)

ERROR_DOMAIN = "lane.v1"

_CODES: dict[Code, int] = {
    Code.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    Code.NOT_FOUND: code_pb2.NOT_FOUND,
    Code.ALREADY_EXISTS: code_pb2.ALREADY_EXISTS,
    Code.FAILED_PRECONDITION: code_pb2.FAILED_PRECONDITION,
    Code.ABORTED: code_pb2.ABORTED,
    Code.OUT_OF_RANGE: code_pb2.OUT_OF_RANGE,
    Code.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    Code.DATA_LOSS: code_pb2.DATA_LOSS,
}


def rich_status(
    code: int,
    reason: str,
    message: str,
    metadata: dict[str, str],
    retry_after_seconds: float | None = None,
) -> status_pb2.Status:
    """A google.rpc.Status carrying one ErrorInfo (and a RetryInfo when the refusal says how
    long to wait): what a refusal's trailer holds, and what a DriveLane answer's ``error`` is."""
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata))
    details = [info]
    if retry_after_seconds is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromTimedelta(timedelta(seconds=retry_after_seconds))
        details.append(any_pb2.Any())
        details[-1].Pack(retry)
    return status_pb2.Status(code=code, message=message, details=details)


def status_of(code: int, reason: str, message: str, metadata: dict[str, str]) -> grpc.Status:
    """A grpc.Status carrying one ErrorInfo."""
    converted: grpc.Status = rpc_status.to_status(rich_status(code, reason, message, metadata))
    return converted


def lane_error_status(error: LaneError) -> grpc.Status:
    """The status for a domain refusal."""
    converted: grpc.Status = rpc_status.to_status(_refusal(error))
    return converted


def _refusal(error: LaneError) -> status_pb2.Status:
    return rich_status(
        _CODES[error.code], error.reason, error.message, error.metadata, error.retry_after_seconds
    )


T = TypeVar("T")
Handler = Callable[[Any, Any, Call], Awaitable[T]]


def error_answer(exc: Exception) -> tuple[status_pb2.Status, str]:
    """The google.rpc.Status a handler's exception is answered with, and its ErrorInfo reason:
    the error table for both the unary RPCs (:func:`unary`) and DriveLane's commands. A
    failure that is not the request's is logged here."""
    if isinstance(exc, LaneError):
        return _refusal(exc), exc.reason
    if isinstance(exc, DatabaseBusy):
        _outage_log.warning("database busy: %s", exc)
        return (
            rich_status(
                code_pb2.RESOURCE_EXHAUSTED,
                "DATABASE_BUSY",
                f"{exc}; nothing was written, retry after a backoff",
                {"poolSize": str(exc.pool_size), "waitedSeconds": f"{exc.waited:g}"},
            ),
            "DATABASE_BUSY",
        )
    if isinstance(exc, OperationalError | PoolTimeout | ReadOnlySqlTransaction):
        # ReadOnlySqlTransaction: the server turned read-only under an open connection (a
        # primary fenced during a failover); the pool discards that connection.
        _outage_log.warning("database unavailable: %s", exc)
        message = "database unavailable; retry"
        retry = (
            exc.retry_after
            if isinstance(exc, DatabaseUnreachable)
            else DEFAULT_RECONNECT_SECONDS / 2
        )
        status = rich_status(code_pb2.UNAVAILABLE, "UNAVAILABLE", message, {}, retry)
        return status, "UNAVAILABLE"
    log.exception("unexpected error", exc_info=exc)
    internal = rich_status(code_pb2.INTERNAL, "INTERNAL", "internal error; see the service log", {})
    return internal, "INTERNAL"


async def _abort(context: Context, exc: Exception) -> None:
    status, _ = error_answer(exc)
    await context.abort_with_status(rpc_status.to_status(status))


def unary(handler: Handler[T]) -> Handler[T]:
    """Map a handler's exceptions to statuses. The handler itself stays reachable as the
    wrapper's ``__wrapped__`` (:func:`implementation`): DriveLane calls it, and maps its
    exceptions with :func:`error_answer` into the command's answer instead."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, call: Call) -> T:
        try:
            return await handler(self, request, call)
        except grpc.aio.AbortError:
            raise  # the handler already ended the call with its own status
        except Exception as exc:
            await _abort(call.context, exc)
            raise  # unreachable: abort_with_status raises

    return wrapper


def implementation(method: Handler[T]) -> Handler[T]:
    """The handler a :func:`unary` method wraps: validation, then the command; its
    exceptions are the caller's to map (:func:`error_answer`)."""
    inner: Handler[T] | None = getattr(method, "__wrapped__", None)
    if inner is None:
        raise TypeError(f"{method!r} is not a @unary handler")
    return inner
