"""The HTTP port's connections: accepted up to a cap, each served by hypercorn's protocol, all
ended at shutdown without a traceback.

hypercorn's own ``serve`` counts no connections, gives a request whose client stopped reading
no end (its send waits for the socket for as long as the client sleeps, and shutdown with it),
and at shutdown cancels what is still open, each cancelled connection logging a
``CancelledError`` traceback at ERROR. So the service accepts connections itself and serves
each with hypercorn's ``TCPServer`` (HTTP/1.1, HTTP/2 by upgrade, prior knowledge or ALPN):

- at most ``LANE_HTTP_MAX_CONNECTIONS`` are open at once; one more is closed as soon as it is
  accepted (logged, rate-limited), so a flood of idle or slow connections cannot take every
  file descriptor of the process;
- each connection can be aborted by its client address (``scope["client"]``): a response the
  client takes nothing of does so (``service/lane/server/api/response_writes.py``);
- :meth:`HttpConnections.stop` stops accepting, lets idle connections close and calls in
  flight end within the grace period, then aborts the connections left, quietly.

An idle connection (no request, or a request whose headers have not all arrived) is closed
after ``LANE_HTTP_IDLE_TIMEOUT_SECONDS`` by hypercorn itself (its keep-alive timeout runs from
the connection's start and from each response's end until the next request's headers are in).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Any

from hypercorn.asyncio.tcp_server import MAX_RECV, TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.typing import AppWrapper, ASGIFramework
from hypercorn.utils import parse_socket_addr, wrap_app

from lane.server.log_repeats import RepeatLimiter

_log = logging.getLogger(__name__)
_refusals = RepeatLimiter(_log)

#: How long connections aborted at shutdown get to unwind before their tasks are cancelled.
_UNWIND_SECONDS = 1.0

Peer = tuple[str, int] | None


class HttpConnections:
    """Serves ``app`` on the connections accepted from a socket (see the module docstring)."""

    def __init__(self, config: Config, max_connections: int) -> None:
        self._app: AppWrapper | None = None
        self._config = config
        self._max = max_connections
        self._context = WorkerContext(None)
        self._open: dict[Peer, asyncio.StreamWriter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def open(self) -> int:
        """How many connections are open now."""
        return len(self._open)

    async def start(
        self, app: ASGIFramework, sock: socket.socket, tls: ssl.SSLContext | None
    ) -> None:
        """Serve ``app`` on the connections of the listening ``sock`` (TLS with ``tls``)."""
        self._app = wrap_app(app, self._config.wsgi_max_body_size, "asgi")
        self._server = await asyncio.start_server(
            self._serve,
            sock=sock,
            backlog=self._config.backlog,
            ssl=tls,
            ssl_handshake_timeout=self._config.ssl_handshake_timeout if tls else None,
        )

    def abort(self, peer: Peer) -> None:
        """Drop the connection of client address ``peer`` now, with what it has buffered."""
        writer = self._open.get(peer)
        if writer is not None:
            writer.transport.abort()

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; give calls in flight ``grace`` seconds (None: none), then abort."""
        if self._server is not None:
            self._server.close()
        # Idle keep-alive connections close now, and busy ones once their calls end.
        await self._context.terminated.set()
        if self._tasks and grace:
            await asyncio.wait(set(self._tasks), timeout=grace)
        for writer in list(self._open.values()):
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=_UNWIND_SECONDS)
        left = set(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if peer is None or peer in self._open:  # gone already (or an address in use twice)
            writer.transport.abort()
            return
        if len(self._open) >= self._max:
            _refusals.warning(
                "HTTP connection refused: %d connections are open, LANE_HTTP_MAX_CONNECTIONS",
                len(self._open),
            )
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._open[peer] = writer
        self._tasks.add(task)
        try:
            loop = asyncio.get_running_loop()
            assert self._app is not None
            await _Connection(self._app, loop, self._config, self._context, {}, reader, writer)
        except asyncio.CancelledError:
            # Cancelled by stop() after the grace period: the connection is aborted already.
            # Ending quietly here keeps asyncio from logging the cancellation as an error.
            pass
        finally:
            del self._open[peer]
            self._tasks.discard(task)
            if not writer.transport.is_closing():
                writer.transport.abort()


class _Connection(TCPServer):
    """hypercorn's connection, with three of its ends mended:

    - a connection that turns to HTTP/2 by prior knowledge gets its idle timer back (hypercorn
      stops it on the preface, read as an HTTP/1.1 request, and never starts it again: an idle
      h2c connection stayed open for good);
    - it ends as soon as its client has gone (hypercorn's own lingers until its idle timer has
      run out);
    - its close does not wait forever for a client that stopped reading to take the last
      bytes: they are dropped after the idle timeout.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._idle = True  # run() starts the idle timer

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            self._idle = event.idle
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        # hypercorn's loop, plus the idle timer of an HTTP/2 connection without streams.
        while not self.reader.at_eof():
            try:
                data = await asyncio.wait_for(self.reader.read(MAX_RECV), self.config.read_timeout)
            except (ConnectionError, OSError, TimeoutError, ssl.SSLError):
                break
            await self.protocol.handle(RawData(data))
            inner = self.protocol.protocol
            if isinstance(inner, H2Protocol) and inner.idle and not self._idle:
                self._idle = True
                await self.idle_task.restart(self._task_group, self._idle_timeout)
        await self.protocol.handle(Closed())
        # The client is gone: the idle timer would otherwise hold the connection till it ends.
        await self.idle_task.stop()

    async def _initiate_server_close(self) -> None:
        self.loop.call_later(self.config.keep_alive_timeout, self.writer.transport.abort)
        await super()._initiate_server_close()

    async def _close(self) -> None:
        self.loop.call_later(self.config.keep_alive_timeout, self.writer.transport.abort)
        await super()._close()


def _peer(writer: asyncio.StreamWriter) -> Peer:
    """The client address as hypercorn puts it in ``scope["client"]``."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        return parse_socket_addr(sock.family, sock.getpeername())
    return None
