"""The HTTP port (``LANE_HTTP_LISTEN``): LaneService over Connect and gRPC-Web on hypercorn,
ImportLane as an upload (``service/lane/server/api/http_import.py``), and the web view
(``service/lane/server/web``) at ``/``.

Hypercorn serves HTTP/1.1 and HTTP/2 (cleartext with prior knowledge or an upgrade, and over
TLS by ALPN), which Connect's server streams need on both, plus the ASGI trailers that gRPC-Web
does without. It runs in the service's own event loop, beside the grpc.aio server, on the same
servicer (``service/lane/server/api/connect.py``). The socket is bound here, with ``SO_REUSEPORT``
for the workers of ``lane serve --workers N`` as the gRPC port is, and its connections are
accepted, capped and ended by ``http_connections.py``.

Each request, before the service sees it:

- with auth off, its ``Host`` and ``Origin`` must name this machine (DNS rebinding,
  ``service/lane/server/api/host_check.py``): the web view's files are refused with 403 here,
  the service's methods in the protocol of the call (``connect_admission.py``);
- its body must arrive within ``LANE_HTTP_BODY_TIMEOUT_SECONDS`` of its headers
  (:class:`_RequestBody`), or the call is refused DEADLINE_EXCEEDED ``BODY_TIMEOUT`` and its
  connection closed;
- its response's sends wait for the connection, and one the client takes nothing of closes the
  connection (``service/lane/server/api/response_writes.py``), within a period of the write
  deadline ``LANE_WATCH_WRITE_DEADLINE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import grpc
from connectrpc._protocol import ConnectWireError
from google.rpc import code_pb2
from hypercorn.config import Config
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from lane.server.api import LaneServicer
from lane.server.api.connect import LaneServiceApp
from lane.server.api.connect_errors import refusal_error, status_message
from lane.server.api.errors import rich_status
from lane.server.api.host_check import HostCheck
from lane.server.api.http_import import UPLOAD_PATH, ImportUpload
from lane.server.api.response_writes import ResponseWrites, current_response
from lane.server.app.config import Settings
from lane.server.app.http_connections import HttpConnections
from lane.server.app.probe_paths import PROBE_PATHS, ProbeApp
from lane.server.app.readiness import Readiness
from lane.server.web import WebViewApp

_log = logging.getLogger(__name__)

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
    connections: HttpConnections
    _app: LaneServiceApp

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, give requests in flight ``grace`` seconds (None: none), close."""
        try:
            await self.connections.stop(grace)
        finally:
            self._app.close()


class _HttpApp:
    """The service's methods under ``/lane.v1.LaneService/``, ImportLane's upload
    (``http_import.py``), the probe paths (``probe_paths.py``), the web view everywhere
    else."""

    def __init__(
        self,
        servicer: LaneServicer,
        hosts: HostCheck,
        connections: HttpConnections,
        settings: Settings,
        readiness: Readiness | None,
    ) -> None:
        self.connect = LaneServiceApp(servicer, hosts)
        self._upload = ImportUpload(servicer, hosts)
        self._prefix = f"{self.connect.path}/"
        self._web = WebViewApp()
        self._probes = None if readiness is None else ProbeApp(readiness)
        self._hosts = hosts
        self._connections = connections
        self._stall_seconds = settings.watch_write_deadline_seconds
        self._body_seconds = settings.http_body_timeout_seconds

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.connect(scope, receive, send)
            return
        if self._probes is not None and scope["path"] in PROBE_PATHS:
            # Before the Host check: probes come addressed to the pod's IP, or any name.
            await self._probes(scope, receive, send)
            return
        peer = scope.get("client")
        response = ResponseWrites(send, lambda: self._connections.abort(peer), self._stall_seconds)
        path = scope["path"]
        upload = path == UPLOAD_PATH
        if not upload and not path.startswith(self._prefix):
            headers = dict(scope["headers"])
            refusal = self._hosts.refusal(
                _text(headers.get(b"host")), _text(headers.get(b"origin"))
            )
            if refusal is not None:
                await _forbidden(response, refusal)
            else:
                await self._web(scope, receive, response)
            return
        body = _RequestBody(receive, asyncio.get_running_loop().time() + self._body_seconds)
        token = current_response.set(response)
        try:
            app = self._upload if upload else self.connect
            await app(scope, body, body.draining_before(response))
        finally:
            current_response.reset(token)


class _RequestBody:
    """A request's ``receive`` that knows whether the body was read to its end, and refuses a
    body that has not arrived by its deadline.

    A request refused before its body was read (one over the 4 MiB limit is refused from its
    first bytes) must still have the rest read before the answer goes out: an HTTP/1.1 server
    that answers and closes while the client is still sending makes the client see a reset
    connection (UNAVAILABLE), not the refusal. The rest is read and dropped, up to
    :data:`_DRAIN_MAX_BYTES`, by the deadline; past either, the connection is closed instead.
    """

    def __init__(self, receive: ASGIReceiveCallable, deadline: float) -> None:
        self._receive = receive
        self._deadline = deadline
        self._ended = False
        self._late = False

    async def __call__(self) -> Any:
        if self._ended:
            return await self._receive()  # after the body: only the disconnect comes
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            self._late = True
            raise refusal_error(
                rich_status(
                    code_pb2.DEADLINE_EXCEEDED,
                    "BODY_TIMEOUT",
                    "the request body did not arrive in full within the "
                    "LANE_HTTP_BODY_TIMEOUT_SECONDS of its headers",
                    {},
                )
            ) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._ended = True
        return message

    def draining_before(self, send: ASGISendCallable) -> ASGISendCallable:
        """``send``, reading the rest of the body first when the answer starts before it."""

        async def send_after_body(message: Any) -> None:
            if message["type"] == "http.response.start" and not self._ended:
                dropped = 0
                with contextlib.suppress(Exception):  # late: answered, then closed
                    while not self._ended and not self._late and dropped <= _DRAIN_MAX_BYTES:
                        dropped += len((await self()).get("body", b""))
            await send(message)

        return send_after_body


async def _forbidden(send: Any, refusal: grpc.Status) -> None:
    """Answer a web view request of a host not served: 403, the body a Connect error's JSON."""
    body = ConnectWireError.from_exception(refusal_error(status_message(refusal))).to_json_bytes()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


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


def _config(settings: Settings) -> Config:
    config = Config()
    config.backlog = _BACKLOG
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    # Idle connections (no request, or one whose headers are still coming) are closed after
    # this long; streams are not idle, whatever they send.
    config.keep_alive_timeout = settings.http_idle_timeout_seconds
    config.ssl_handshake_timeout = settings.http_idle_timeout_seconds
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
    (``host:port``; port 0: a free one), with the TLS files and HTTP settings of ``settings``,
    and with ``readiness`` the probe paths; return once it accepts connections."""
    sock = _bind(listen, reuse_port)
    port = sock.getsockname()[1]
    # Listening now, so connections queue in the backlog from the moment this returns.
    sock.listen(_BACKLOG)
    config = _config(settings)
    host = listen.rpartition(":")[0]
    hosts = HostCheck(
        enabled=not settings.auth_tokens, bound_host=host, allowed=settings.http_allowed_hosts
    )
    connections = HttpConnections(config, settings.http_max_connections)
    app = _HttpApp(servicer, hosts, connections, settings, readiness)
    try:
        tls = config.create_ssl_context() if config.ssl_enabled else None
        await connections.start(app, sock, tls)
    except OSError as err:
        sock.close()
        raise HttpStartupError(f"cannot serve HTTP on {listen}: {err}") from None
    return HttpEndpoint(port, f"{host}:{port}", connections, app.connect)
