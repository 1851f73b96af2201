"""Open a ``grpc.aio`` channel to the lane service with settings suited to long watches.

The service permits client keepalive pings every 10 s or more slowly (faster pingers get
GOAWAY "too_many_pings", which ends every stream on the connection), and sends messages up to
4 MiB, gRPC's default receive limit. The channel's own reconnect backoff is capped low so a
watcher resumes soon after a restarted server is back, instead of waiting out gRPC's default
two-minute backoff::

    async with open_channel("127.0.0.1:50051") as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)

A service with auth on needs a bearer token on every call: ``open_channel(target,
token=...)`` sends ``authorization: Bearer <token>`` with each one. A service serving TLS needs
``credentials``: :func:`tls_credentials` makes them from PEM files (a CA bundle to trust,
a client certificate and key for mutual TLS).

A target without a port means the service's default port, 50051. :func:`open_channel` connects
lazily, on the first call; :func:`connect` also checks within :data:`CONNECT_TIMEOUT_SECONDS`
that the service answers, and raises :class:`~lane.client.reach.Unreachable` (naming the
target, the cause and the fix) when it does not::

    channel = await connect("127.0.0.1", credentials=tls_credentials(ca_file="ca.pem"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from lane.client.reach import normalize_target, probe
from lane.client.tracing import Tracing, client_interceptors, wanted
from lane.limits import MAX_MESSAGE_BYTES, MIN_CLIENT_PING_INTERVAL_MS

__all__ = [
    "CHANNEL_OPTIONS",
    "CONNECT_TIMEOUT_SECONDS",
    "INTERACTIVE_OPTIONS",
    "connect",
    "open_channel",
    "tls_credentials",
]

#: How long :func:`connect` (and so every ``lane`` client command) waits for the service to
#: answer before it gives up and says why. Long enough for a TLS handshake across the world,
#: short enough that a wrong target is reported while the person still looks.
CONNECT_TIMEOUT_SECONDS = 5.0

#: Options of :func:`open_channel`; later entries of ``extra_options`` override these.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # Ping while calls (watches) are open, every 20 s: notices a dead server or a dropped NAT
    # mapping. Twice the service's minimum ping interval, so never too fast for it.
    ("grpc.keepalive_time_ms", 2 * MIN_CLIENT_PING_INTERVAL_MS),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # The service sends messages up to 4 MiB.
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly after the server comes back (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)

#: ``extra_options`` for a person watching (``lane watch``): reconnect attempts at most half a
#: second apart, so the view is live again within a second of the service answering. Library
#: users keep the gentler :data:`CHANNEL_OPTIONS`.
INTERACTIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 500),
)


def tls_credentials(
    *,
    ca_file: str | Path | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
) -> grpc.ChannelCredentials:
    """TLS credentials from PEM files: trust ``ca_file`` (None: the system's roots), and
    present ``cert_file`` with ``key_file`` (both or neither) for mutual TLS."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("a client certificate needs both cert_file and key_file")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca_file).read_bytes() if ca_file else None,
        private_key=Path(key_file).read_bytes() if key_file else None,
        certificate_chain=Path(cert_file).read_bytes() if cert_file else None,
    )


async def connect(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    extra_options: Sequence[tuple[str, str | int]] = (),
    tracing: Tracing = None,
) -> grpc.aio.Channel:
    """:func:`open_channel`, then wait up to ``connect_timeout`` seconds for the service to answer.

    Raises :class:`~lane.client.reach.Unreachable` (the channel closed) when it does not."""
    channel = open_channel(
        target, credentials=credentials, token=token, extra_options=extra_options, tracing=tracing
    )
    try:
        await probe(
            channel, normalize_target(target), within=connect_timeout, tls=credentials is not None
        )
    except BaseException:
        await channel.close()
        raise
    return channel


def open_channel(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    extra_options: Sequence[tuple[str, str | int]] = (),
    tracing: Tracing = None,
) -> grpc.aio.Channel:
    """A channel to ``target`` (``host:port``; no port: 50051): TLS with ``credentials``, else
    plaintext; every call carries the bearer ``token`` when one is given. Calls carry the
    current OpenTelemetry trace when the application set a global tracer provider (``tracing``:
    True or False decides instead, or names the tracer provider; see tracing.py).

    Close it with ``await channel.close()`` or use it as an async context manager.
    """
    options: dict[str, str | int] = dict(CHANNEL_OPTIONS)
    options.update(extra_options)
    pairs = list(options.items())
    # An interceptor rather than call credentials: gRPC refuses those on plaintext channels,
    # and a service on loopback may well run without TLS.
    interceptors = _bearer(token) if token else []
    provider = wanted(tracing)
    if provider is not None:
        interceptors += client_interceptors(provider)
    target = normalize_target(target)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=pairs, interceptors=interceptors or None)
    return grpc.aio.secure_channel(
        target, credentials, options=pairs, interceptors=interceptors or None
    )


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

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(
            self, continuation: Any, client_call_details: Any, request_iterator: Any
        ) -> Any:
            return await continuation(with_token(client_call_details), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
