"""The HTTP port (``LANE_HTTP_LISTEN``): LaneService over Connect and gRPC-Web on hypercorn, and
the web view (``service/lane/server/web``) at ``/``.

Hypercorn serves HTTP/1.1 and HTTP/2 (cleartext with prior knowledge or an upgrade, and over
TLS by ALPN), which Connect's server streams need on both, plus the ASGI trailers that gRPC-Web
does without. It runs in the service's own event loop, beside the grpc.aio server, on the same
servicer (``service/lane/server/api/connect.py``). The socket is bound here, with ``SO_REUSEPORT``
for the workers of ``lane serve --workers N`` as the gRPC port is, and handed to hypercorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from lane.server.api import LaneServicer
from lane.server.api.connect import LaneServiceApp
from lane.server.app.config import Settings
from lane.server.app.probe_paths import PROBE_PATHS, ProbeApp
from lane.server.app.readiness import Readiness
from lane.server.web import WebViewApp

_log = logging.getLogger(__name__)

#: Idle keep-alive connections are closed after this long (hypercorn's default is 5 s, which
#: only costs browsers a reconnect; streams are not idle: they carry heartbeats every 10 s).
_KEEP_ALIVE_SECONDS = 75.0
_BACKLOG = 1024
#: The most of a refused request's body read and dropped before answering (see _RequestBody).
_DRAIN_MAX_BYTES = 16 * 1024 * 1024


class HttpStartupError(RuntimeError):
    """The HTTP port could not be bound."""


@dataclass
class HttpEndpoint:
    """The running HTTP port. Stop it with :meth:`stop`."""

    port: int
    address: str
    _task: asyncio.Task[None]
    _shutdown: asyncio.Event

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, give requests in flight ``grace`` seconds (None: none), close."""
        self._shutdown.set()
        try:
            async with asyncio.timeout(grace or 0):
                await asyncio.shield(self._task)
        except TimeoutError:
            pass
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class _HttpApp:
    """The service's methods under ``/lane.v1.LaneService/``, the probe paths
    (``probe_paths.py``), the web view everywhere else."""

    def __init__(self, servicer: LaneServicer, readiness: Readiness | None) -> None:
        self._connect = LaneServiceApp(servicer)
        self._prefix = f"{self._connect.path}/"
        self._web = WebViewApp()
        self._probes = None if readiness is None else ProbeApp(readiness)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "http" and self._probes and scope["path"] in PROBE_PATHS:
            await self._probes(scope, receive, send)
        elif scope["type"] == "http" and not scope["path"].startswith(self._prefix):
            await self._web(scope, receive, send)
        elif scope["type"] == "http":
            body = _RequestBody(receive)
            await self._connect(scope, body, body.draining_before(send))
        else:
            await self._connect(scope, receive, send)


class _RequestBody:
    """A request's ``receive`` that knows whether the body was read to its end.

    A request refused before its body was read (one over the 4 MiB limit is refused from its
    first bytes) must still have the rest read before the answer goes out: an HTTP/1.1 server
    that answers and closes while the client is still sending makes the client see a reset
    connection (UNAVAILABLE), not the refusal. The rest is read and dropped, up to
    :data:`_DRAIN_MAX_BYTES`; past that the connection is closed as before.
    """

    def __init__(self, receive: ASGIReceiveCallable) -> None:
        self._receive = receive
        self._ended = False

    async def __call__(self) -> Any:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._ended = True
        return message

    def draining_before(self, send: ASGISendCallable) -> ASGISendCallable:
        """``send``, reading the rest of the body first when the answer starts before it."""

        async def send_after_body(message: Any) -> None:
            if message["type"] == "http.response.start" and not self._ended:
                dropped = 0
                while not self._ended and dropped <= _DRAIN_MAX_BYTES:
                    dropped += len((await self()).get("body", b""))
            await send(message)

        return send_after_body


def _bind(listen: str, reuse_port: bool) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            # The workers of `lane serve --workers N` share the port; the kernel spreads
            # connections over them (the supervisor checked that nothing else listens there).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, int(port)))
    except OSError as err:
        sock.close()
        raise HttpStartupError(f"cannot listen on {listen}: {err}") from None
    return sock


def _config(settings: Settings, fd: int, grace: float) -> Config:
    config = Config()
    config.bind = [f"fd://{fd}"]
    config.backlog = _BACKLOG
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = grace
    config.keep_alive_timeout = _KEEP_ALIVE_SECONDS
    config.include_server_header = False
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        config.certfile = str(settings.tls_cert_file)
        config.keyfile = str(settings.tls_key_file)
        if settings.tls_client_ca_file is not None:
            config.ca_certs = str(settings.tls_client_ca_file)
            config.verify_mode = ssl.CERT_REQUIRED
    return config


async def start_http(
    settings: Settings,
    listen: str,
    servicer: LaneServicer,
    *,
    reuse_port: bool = False,
    readiness: Readiness | None = None,
) -> HttpEndpoint:
    """Serve ``servicer`` over Connect and gRPC-Web, and the web view, on ``listen``
    (``host:port``; port 0: a free one), with the TLS files of ``settings``, and with
    ``readiness`` the probe paths; return once it accepts connections."""
    sock = _bind(listen, reuse_port)
    port = sock.getsockname()[1]
    # Listening now, so connections queue in the backlog from the moment this returns, even
    # before hypercorn (which listens again on the same socket) takes them up.
    sock.listen(_BACKLOG)
    config = _config(settings, sock.detach(), settings.grace_seconds)
    shutdown = asyncio.Event()
    task = asyncio.create_task(
        serve(_HttpApp(servicer, readiness), config, shutdown_trigger=shutdown.wait),
        name="http",
    )
    await asyncio.sleep(0)  # let it start: a failure to start shows at once
    if task.done():
        task.result()  # raises what stopped it
        raise HttpStartupError(f"the HTTP server on {listen} stopped at start-up")
    host = listen.rpartition(":")[0]
    return HttpEndpoint(port, f"{host}:{port}", task, shutdown)
