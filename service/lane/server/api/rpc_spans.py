"""The spans of LaneService RPCs and of DriveLane's commands (traces:
``service/lane/server/traces.py``).

:func:`start_rpc` opens the SERVER span of one RPC as a child of the caller's trace: the W3C
``traceparent`` (and ``tracestate``, ``baggage``: the configured propagators) in the call's
metadata. :func:`~lane.server.api.instrument.observed`, which wraps every handler the gRPC port
registers, calls it; the Connect port runs those same handlers with its request headers as the
context's metadata, so its calls get the same spans. Any other transport does the same: hand
the handlers a context whose ``invocation_metadata()`` holds the request's headers.

A DriveLane stream is one SERVER span; each command on it gets a span of its own
(:func:`start_command`), a child of the stream's span: the commands of a stream carry no
trace context of their own, so they join the trace of the call that opened the stream.

Both are named ``lane.v1.LaneService/<Method>`` and carry ``rpc.system`` (``grpc``),
``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``, and, once known, ``lane.namespace``,
``lane.id``, ``lane.operation_id`` (from the request's log scope, ``service/lane/server/logs.py``)
and the ``lane.reason`` of a refusal. As OpenTelemetry's RPC conventions say for servers, the status
is ERROR only for the codes that are the server's fault (UNKNOWN, DEADLINE_EXCEEDED,
UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS); a refusal is an answer, not an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from lane.v1 import lane_service_pb2 as pb
from opentelemetry import context, propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from lane.server import logs, traces

SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"].full_name

#: Status codes that mark a server span as failed (OpenTelemetry's RPC conventions).
_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
_CODE_NUMBERS = {code.name: code.value[0] for code in grpc.StatusCode}


class _MetadataGetter(Getter[Iterable[tuple[str, Any]]]):
    """Reads gRPC metadata, a sequence of (key, value) pairs with lower-case keys."""

    def get(self, carrier: Iterable[tuple[str, Any]], key: str) -> list[str] | None:
        found = [value for name, value in carrier if name == key and isinstance(value, str)]
        return found or None

    def keys(self, carrier: Iterable[tuple[str, Any]]) -> list[str]:
        return [name for name, _ in carrier]


_METADATA = _MetadataGetter()


class RpcSpan:
    """An open RPC or command span, current until :meth:`finish`."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token = context.attach(trace.set_span_in_context(span))

    def finish(self, code: str, reason: str) -> None:
        """End the span with the answer's status ``code`` (its name) and ErrorInfo ``reason``;
        called inside the request's log scope, whose ids it records."""
        span = self._span
        try:
            if span.is_recording():
                request = logs.current()
                if request is not None:
                    for key, value in (
                        ("lane.namespace", request.namespace),
                        ("lane.id", request.lane_id),
                        ("lane.operation_id", request.operation_id),
                    ):
                        if value:
                            span.set_attribute(key, value)
                span.set_attribute("rpc.grpc.status_code", _CODE_NUMBERS.get(code, 2))
                if reason:
                    span.set_attribute("lane.reason", reason)
                if code in _SERVER_ERRORS:
                    span.set_status(Status(StatusCode.ERROR, reason or code))
        finally:
            span.end()
            context.detach(self._token)


def start_rpc(method: str, metadata: Iterable[tuple[str, Any]] | None) -> RpcSpan | None:
    """The SERVER span of one call of ``method``, continuing the trace in its ``metadata``;
    None while traces are off."""
    tracer = traces.tracer
    if tracer is None:
        return None
    parent = propagate.extract(metadata or (), getter=_METADATA)
    span = tracer.start_span(
        f"{SERVICE}/{method}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method},
    )
    return RpcSpan(span)


def start_command(method: str, sequence: int) -> RpcSpan | None:
    """The span of one DriveLane command of ``method`` (a child of the stream's span, the
    current one); None while traces are off."""
    tracer = traces.tracer
    if tracer is None:
        return None
    span = tracer.start_span(
        f"{SERVICE}/{method}",
        kind=SpanKind.INTERNAL,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": SERVICE,
            "rpc.method": method,
            "lane.drive.sequence": sequence,
        },
    )
    return RpcSpan(span)
