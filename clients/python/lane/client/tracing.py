"""Trace context on a channel's calls: the application's OpenTelemetry trace, continued by the
service.

:func:`client_interceptors` makes the ``grpc.aio`` interceptors that give each call a CLIENT
span, a child of the span current where the call is made, and send its context in the call's
metadata (W3C ``traceparent``, and whatever else the configured propagators write: by default
``tracestate`` and ``baggage``). The service continues that trace: its span of the RPC is the
client span's child. :func:`~lane.client.connect.open_channel` adds them by itself when the
application has set a global tracer provider (an OpenTelemetry SDK configured before the
channel is opened), or when told to (``tracing=``); a channel of one's own takes them as
``grpc.aio.insecure_channel(target, interceptors=client_interceptors())``.

A DriveLane stream (:class:`~lane.client.session.LaneSession`) is one call: its commands join
the trace current when the stream was opened, each a span of its own on the service's side.

The spans are named ``lane.v1.LaneService/<Method>`` and carry ``rpc.system`` (``grpc``),
``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``. Only the OpenTelemetry API is
needed here; without an SDK the spans record nothing and no context is sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Setter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

__all__ = ["Tracing", "client_interceptors", "wanted"]

#: What ``open_channel(tracing=...)`` takes: None (trace when the application set a global
#: tracer provider), True or False, or the tracer provider to use.
Tracing = TracerProvider | bool | None

_SCOPE = "lane.client"
_CODE_NUMBERS = {code: code.value[0] for code in grpc.StatusCode}
# Codes that mark a client span as failed: every code but OK (OpenTelemetry's RPC conventions).
_OK = grpc.StatusCode.OK


def wanted(tracing: Tracing) -> TracerProvider | None:
    """The tracer provider a channel opened with ``tracing`` traces with, or None."""
    if tracing is False:
        return None
    if tracing is None or tracing is True:
        provider = trace.get_tracer_provider()
        if tracing is None and isinstance(provider, trace.ProxyTracerProvider):
            return None  # the application set no tracer provider: nothing to add to
        return provider
    return tracing


def client_interceptors(provider: TracerProvider | None = None) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors tracing every kind of call (``provider``: the global one when None)."""
    tracer = (provider or trace.get_tracer_provider()).get_tracer(_SCOPE)
    return [
        _UnaryUnary(tracer),
        _UnaryStream(tracer),
        _StreamUnary(tracer),
        _StreamStream(tracer),
    ]


class _Traced:
    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def _start(self, details: grpc.aio.ClientCallDetails) -> tuple[Span, Any]:
        method = details.method
        path = method.decode() if isinstance(method, bytes) else str(method)
        service, _, name = path.lstrip("/").partition("/")
        span = self._tracer.start_span(
            path.lstrip("/"),
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        propagate.inject(metadata, context=trace.set_span_in_context(span), setter=_SETTER)
        traced = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return span, traced

    async def _unary(self, continuation: Any, details: Any, request: Any) -> Any:
        span, traced = self._start(details)
        try:
            call = await continuation(traced, request)
            _end(span, await call.code())
        except BaseException as exc:
            code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else grpc.StatusCode.UNKNOWN
            _end(span, code)
            raise
        return call

    async def _stream(self, continuation: Any, details: Any, request: Any) -> Any:
        span, traced = self._start(details)
        try:
            call = await continuation(traced, request)
        except BaseException:
            _end(span, grpc.StatusCode.UNKNOWN)
            raise
        # The span ends with the stream; its status code comes with the call's end, read in a
        # task (a done callback cannot await it).
        call.add_done_callback(lambda done: _keep(asyncio.ensure_future(_ended(span, done))))
        return call


_ending: set[asyncio.Future[None]] = set()


def _keep(task: asyncio.Future[None]) -> None:
    _ending.add(task)  # held until done: the loop keeps only weak references to tasks
    task.add_done_callback(_ending.discard)


async def _ended(span: Span, call: Any) -> None:
    try:
        code = await call.code()
    except Exception:
        code = grpc.StatusCode.UNKNOWN
    _end(span, code)


def _end(span: Span, code: grpc.StatusCode) -> None:
    span.set_attribute("rpc.grpc.status_code", _CODE_NUMBERS.get(code, 2))
    if code != _OK:
        span.set_status(Status(StatusCode.ERROR, code.name))
    span.end()


class _MetadataSetter(Setter[grpc.aio.Metadata]):
    def set(self, carrier: grpc.aio.Metadata, key: str, value: str) -> None:
        carrier[key] = value


_SETTER = _MetadataSetter()


class _UnaryUnary(_Traced, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await self._unary(continuation, client_call_details, request)


class _StreamUnary(_Traced, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await self._unary(continuation, client_call_details, request_iterator)


class _UnaryStream(_Traced, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await self._stream(continuation, client_call_details, request)


class _StreamStream(_Traced, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await self._stream(continuation, client_call_details, request_iterator)
