"""An HTTP response's sends: each waits until its connection took it, and one that never is
taken closes the connection.

hypercorn's ``send`` of a response body returns once the connection took the bytes: written to
the socket, or — the socket full — once it has room again (HTTP/1.1), or once the stream's
flow-control window lets them out (HTTP/2). So a client that stops reading stops its
stream's sends, and a watcher's write waits as on the gRPC port, until its write deadline
cuts it off (``watch.py``). But nothing in ASGI ends a response whose send never returns: the
call, its connection and the bytes buffered for it would stay for as long as the client
sleeps. :class:`ResponseWrites` wraps the ``send`` of one call:

- :meth:`~ResponseWrites.release`, when the call's handler has ended (cut off as too slow,
  or the server is stopping): a send still waiting stops waiting, and the response's end —
  the status — queues behind it, for the client to read when it reads again. It has
  ``stall_seconds`` (at least :data:`MIN_STATUS_SECONDS`) from the release to go out; past
  that the connection is aborted (its buffered bytes dropped at once).
- a send that waits twice ``stall_seconds`` without a release (a method without a write
  deadline of its own, a unary answer) aborts the connection too.

Aborting is all hypercorn offers; on HTTP/2 it ends the connection's other streams as well,
whose client is then not reading that connection either, or is too slow to read one stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

#: The least time a released response's end gets to go out (see the module docstring).
MIN_STATUS_SECONDS = 10.0

#: The response of the HTTP call being served (set by the app layer around each call).
current_response: ContextVar[ResponseWrites | None] = ContextVar("lane_http_response", default=None)


class ResponseWrites:
    """An ASGI ``send`` for one call's response (see the module docstring)."""

    def __init__(self, send: Any, abort: Callable[[], None], stall_seconds: float) -> None:
        self._send = send
        self._abort = abort
        self._stall_seconds = stall_seconds
        self._released_at: float | None = None
        self._gone = False
        self._release: asyncio.Future[None] | None = None
        #: Sends still going after a release (kept so they finish and are not collected).
        self._behind: set[asyncio.Future[None]] = set()

    def release(self) -> None:
        """The call's handler has ended: let a waiting send go, and time the rest."""
        if self._released_at is None:
            self._released_at = asyncio.get_running_loop().time()
            if self._release is not None and not self._release.done():
                self._release.set_result(None)

    async def __call__(self, message: Any) -> None:
        if self._gone:
            return  # the connection was dropped: the call is ending (its client is gone)
        loop = asyncio.get_running_loop()
        sending: asyncio.Future[None] = asyncio.ensure_future(self._send(message))
        try:
            if self._released_at is None:
                if self._release is None:
                    self._release = loop.create_future()
                waits = {sending, self._release}
                await asyncio.wait(
                    waits, timeout=2 * self._stall_seconds, return_when="FIRST_COMPLETED"
                )
                if not sending.done() and self._release.done():
                    # Released while waiting: it goes on behind, the response's end after it.
                    self._behind.add(sending)
                    sending.add_done_callback(self._went)
                    return
            else:
                grace = max(self._stall_seconds, MIN_STATUS_SECONDS)
                left = self._released_at + grace - loop.time()
                await asyncio.wait({sending}, timeout=max(0.0, left))
        except asyncio.CancelledError:
            sending.cancel()
            raise
        if sending.done():
            sending.result()
            return
        # Not taken in time: drop the connection, and with it whatever waits to be sent. The
        # call sees its client leave (ASGI's disconnect) and ends; nothing more is sent.
        self._gone = True
        self._abort()
        with contextlib.suppress(Exception):
            await asyncio.wait({sending, *self._behind}, timeout=self._stall_seconds)
        if not sending.done():
            sending.cancel()

    def _went(self, sending: asyncio.Future[None]) -> None:
        self._behind.discard(sending)
        if not sending.cancelled():
            sending.exception()  # retrieved: the connection may have broken meanwhile
