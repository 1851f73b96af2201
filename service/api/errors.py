"""The one error table: domain refusals → gRPC status + google.rpc.ErrorInfo.

Every refusal reaches the client with its documented code and exactly one ErrorInfo (domain
``lane.v1``) whose ``reason`` is stable and whose ``metadata`` holds the message's values.
Anything unexpected is logged and answered INTERNAL — never UNKNOWN, never a stack trace.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from psycopg import OperationalError
from psycopg_pool import PoolTimeout

from service.api.call import Call, Context
from service.domain.errors import Code, LaneError
from service.store.pool import DatabaseBusy

log = logging.getLogger(__name__)

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


def status_of(code: int, reason: str, message: str, metadata: dict[str, str]) -> grpc.Status:
    """A grpc.Status carrying one ErrorInfo."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata))
    status = status_pb2.Status(code=code, message=message, details=[detail])
    converted: grpc.Status = rpc_status.to_status(status)
    return converted


def lane_error_status(error: LaneError) -> grpc.Status:
    """The status for a domain refusal."""
    return status_of(_CODES[error.code], error.reason, error.message, error.metadata)


def internal_status() -> grpc.Status:
    """The status for a failure that is the service's fault, not the request's."""
    return status_of(code_pb2.INTERNAL, "INTERNAL", "internal error; see the service log", {})


def unavailable_status(message: str) -> grpc.Status:
    """The status for a transient failure (database unreachable, shutting down)."""
    return status_of(code_pb2.UNAVAILABLE, "UNAVAILABLE", message, {})


def database_busy_status(busy: DatabaseBusy) -> grpc.Status:
    """The status for a command that found every database connection busy: the database is
    reachable, this server has more work than connections (see service/store/pool.py)."""
    return status_of(
        code_pb2.RESOURCE_EXHAUSTED,
        "DATABASE_BUSY",
        f"{busy}; nothing was written, retry after a backoff",
        {"poolSize": str(busy.pool_size), "waitedSeconds": f"{busy.waited:g}"},
    )


T = TypeVar("T")
Handler = Callable[[Any, Any, Call], Awaitable[T]]


async def _abort(context: Context, exc: BaseException) -> None:
    if isinstance(exc, LaneError):
        await context.abort_with_status(lane_error_status(exc))
    if isinstance(exc, DatabaseBusy):
        log.warning("database busy: %s", exc)
        await context.abort_with_status(database_busy_status(exc))
    if isinstance(exc, OperationalError | PoolTimeout):
        log.warning("database unavailable: %s", exc)
        await context.abort_with_status(unavailable_status("database unavailable; retry"))
    log.exception("unexpected error", exc_info=exc)
    await context.abort_with_status(internal_status())


def unary(handler: Handler[T]) -> Handler[T]:
    """Map a handler's exceptions to statuses."""

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
