"""Metrics and log context around every LaneService RPC.

:func:`observed` wraps a method's handler from the first byte: it opens the log request scope
(``service/lane/server/logs.py``) and, for unary methods, counts the answer by status code and times
it (``lane_commands_total``, ``lane_command_duration_seconds``; DriveLane counts each of its
commands the same way, under the command's method, through :func:`method_metrics`).
:func:`binding_ids` wraps the decoded-request handler inside it and binds the caller's
namespace and the request's lane and operation ids to that scope, so every log line of the RPC
names them. WatchLane's own metrics are in watch.py. With traces on, :func:`observed` also
opens the RPC's span (``rpc_spans.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from lane.server import logs, metrics, traces
from lane.server.api import rpc_spans
from lane.server.api.auth import caller_namespace

log = logging.getLogger(__name__)

# Where grpc-status carries a status's details (google.rpc.Status) in the trailing metadata.
_STATUS_DETAILS_KEY = "grpc-status-details-bin"

Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class MethodMetrics:
    """One LaneService method's answers: ``lane_commands_total{method,code}`` and
    ``lane_command_duration_seconds{method}``, and the DEBUG line of each answer. Shared by the
    unary RPC and DriveLane's commands of the method (:func:`method_metrics`)."""

    __slots__ = ("_answered", "_seconds", "method", "source")

    def __init__(self, method: str) -> None:
        self.method = method
        #: The metrics its series belong to (the process's, once the app installed them).
        self.source = metrics.current
        self._seconds = self.source.command_seconds.labels(method)
        # The counter of each status code, looked up once (a labels() call takes a lock).
        self._answered: dict[str, Any] = {}

    def answered(self, code: str, reason: str, elapsed: float) -> None:
        """Count one answer with status ``code`` (its ErrorInfo ``reason``) after ``elapsed`` s."""
        self._seconds.observe(elapsed)
        counter = self._answered.get(code)
        if counter is None:
            counter = self._answered[code] = self.source.commands.labels(self.method, code)
        counter.inc()
        if log.isEnabledFor(logging.DEBUG):
            why = f" {reason}" if reason else ""  # the ErrorInfo reason of a refusal
            log.debug("%s answered %s%s in %.1f ms", self.method, code, why, elapsed * 1000)


_METHOD_METRICS: dict[str, MethodMetrics] = {}


def method_metrics(method: str) -> MethodMetrics:
    """The :class:`MethodMetrics` of ``method`` (one per method and process; made again
    once the app installed the process's metrics)."""
    found = _METHOD_METRICS.get(method)
    if found is None or found.source is not metrics.current:
        found = _METHOD_METRICS[method] = MethodMetrics(method)
    return found


def observed(method: str, streaming: bool, handler: Handler) -> Handler:
    """``handler`` inside a log request scope; a unary one also counted and timed."""

    async def streaming_rpc(data: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        with logs.request_scope(method):
            if traces.tracer is None:
                return await handler(data, context)
            return await _traced_stream(method, handler, data, context)

    if streaming:
        return streaming_rpc
    answers = method_metrics(method)

    async def unary_rpc(data: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        with logs.request_scope(method):
            start = time.perf_counter()
            code = "UNKNOWN"  # an exception grpc turns into UNKNOWN (the error table prevents it)
            reason = ""
            span = (
                None
                if traces.tracer is None
                else rpc_spans.start_rpc(method, context.invocation_metadata())
            )
            try:
                answer = await handler(data, context)
                code = "OK"
                return answer
            except grpc.aio.AbortError:
                code = status_code_name(context)
                reason = error_reason(context)
                raise
            except asyncio.CancelledError:
                code = "CANCELLED"  # the client went away or the server stopped
                raise
            finally:
                answers.answered(code, reason, time.perf_counter() - start)
                if span is not None:
                    span.finish(code, reason)

    return unary_rpc


async def _traced_stream(
    method: str, handler: Handler, data: Any, context: grpc.aio.ServicerContext[Any, Any]
) -> Any:
    """A streaming RPC (WatchLane, DriveLane) inside its span, which ends with the stream."""
    span = rpc_spans.start_rpc(method, context.invocation_metadata())
    code, reason = "UNKNOWN", ""
    try:
        answer = await handler(data, context)
        code = "OK"
        return answer
    except grpc.aio.AbortError:
        code, reason = status_code_name(context), error_reason(context)
        raise
    except asyncio.CancelledError:
        code = "CANCELLED"
        raise
    finally:
        if span is not None:
            span.finish(code, reason)


def binding_ids(implementation: Handler, *, streaming: bool = False) -> Handler:
    """``implementation`` (called with the decoded request) binding the request's ids to the
    log scope; a unary answer's operation id too, when the request had none (StartRun)."""
    if streaming:
        # No answer to bind: hand the stream's awaitable through, with no frame of our own.
        def bound_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            bind_request(request)
            return implementation(request, context)

        return bound_stream

    async def bound(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        bind_request(request)
        answer = await implementation(request, context)
        if answer is not None:
            bind_answer(answer)
        return answer

    return bound


def bind_request(request: Any) -> None:
    """Bind the caller's namespace and the request's lane and operation ids to the log scope."""
    logs.bind(
        namespace=_namespace(),
        lane_id=_text(request, "lane_id"),
        operation_id=_text(request, "operation_id"),
    )


def bind_answer(answer: Any) -> None:
    """Bind an answer's operation id to the log scope (when the request had none: StartRun)."""
    logs.bind(operation_id=_text(answer, "operation_id"))


def status_code_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The name of the status code an aborted call ended with (``UNKNOWN`` if none is set)."""
    code: Any = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    for status in grpc.StatusCode:  # grpc.aio reports the code as its integer value
        if status.value[0] == code:
            return status.name
    return "UNKNOWN"


def error_reason(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The ErrorInfo reason of the status an aborted call ended with ("" if it has none)."""
    for key, value in context.trailing_metadata() or ():
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    reason: str = info.reason
                    return reason
    return ""


def _namespace() -> str:
    try:
        return caller_namespace()  # set once the call is authenticated
    except LookupError:
        return ""


def _text(message: Any, name: str) -> str:
    value = getattr(message, name, "")
    return value if isinstance(value, str) else ""
