"""Open a ``grpc.aio`` channel to the lane service with settings suited to long watches.

The service permits client keepalive pings every 10 s or more slowly (faster pingers get
GOAWAY "too_many_pings", which ends every stream on the connection), and sends messages up to
4 MiB, gRPC's default receive limit. The channel's own reconnect backoff is capped low so a
watcher resumes soon after a restarted server is back, instead of waiting out gRPC's default
two-minute backoff::

    async with open_channel("127.0.0.1:50051") as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)

A service with auth on needs a bearer token on every call: ``open_channel(target,
token=...)`` sends ``authorization: Bearer <token>`` with each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

__all__ = ["CHANNEL_OPTIONS", "open_channel"]

#: Options of :func:`open_channel`; later entries of ``extra_options`` override these.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # Ping while calls (watches) are open, every 20 s: notices a dead server or a dropped NAT
    # mapping. At least 10 s, the service's minimum ping interval.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # The service sends messages up to 4 MiB.
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    # Reconnect quickly after the server comes back (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)


def open_channel(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    extra_options: Sequence[tuple[str, str | int]] = (),
) -> grpc.aio.Channel:
    """A channel to ``target`` (``host:port``): TLS with ``credentials``, else plaintext;
    every call carries the bearer ``token`` when one is given.

    Close it with ``await channel.close()`` or use it as an async context manager.
    """
    options: dict[str, str | int] = dict(CHANNEL_OPTIONS)
    options.update(extra_options)
    pairs = list(options.items())
    # An interceptor rather than call credentials: gRPC refuses those on plaintext channels,
    # and a service on loopback may well run without TLS.
    interceptors = _bearer(token) if token else None
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=pairs, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=pairs, interceptors=interceptors)


def _bearer(token: str) -> list[grpc.aio.ClientInterceptor]:
    header = ("authorization", f"Bearer {token}")

    def with_token(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(
            self, continuation: Any, client_call_details: Any, request: Any
        ) -> Any:
            return await continuation(with_token(client_call_details), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(
            self, continuation: Any, client_call_details: Any, request: Any
        ) -> Any:
            return await continuation(with_token(client_call_details), request)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(
            self, continuation: Any, client_call_details: Any, request_iterator: Any
        ) -> Any:
            return await continuation(with_token(client_call_details), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamStream()]
