"""The stream write deadline, kept by one sweep per process instead of one timer per write.

The server streams whose client may stop reading — WatchLane and ExportLane — write through
:meth:`WriteDeadline.write`. A write waits while HTTP/2 flow control holds it back, which
happens only when the client has stopped reading. A timeout scope around every write arms and
disarms a timer per watcher and commit — about a tenth of the server's CPU on a lane with a
hundred watchers — for writes that nearly always finish at once. Instead each write notes when
it began, and a sweep that runs while writes are in progress cancels any older than the
deadline: a stuck write is cut off at most a quarter of the deadline late (never more than a
second).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import grpc

#: The longest the sweep sleeps between looks (it sleeps a quarter of the deadline if shorter).
MAX_SWEEP_SECONDS = 1.0
#: How long a stream let go waits for its status to go out (see :func:`let_go`).
STATUS_SEND_SECONDS = 1.0


class Stream(Protocol):
    """What a stream's handler writes to: a gRPC servicer context, or the HTTP port's."""

    async def write(self, message: Any) -> None: ...

    async def abort_with_status(self, status: grpc.Status) -> None: ...


class ClientGone(Exception):
    """The client cancelled or the connection dropped: stop quietly."""


class TooSlow(Exception):
    """The client took nothing for the write deadline."""


class WriteDeadline:
    """Tracks the writes in progress of one process's streams (WatchLane, ExportLane)."""

    __slots__ = ("_cut", "_interval", "_seconds", "_sweep", "_writing")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._interval = min(MAX_SWEEP_SECONDS, seconds / 4)
        # Each writing task: when its write began (loop time) and its cancel count then.
        self._writing: dict[asyncio.Task[object], tuple[float, int]] = {}
        self._cut: set[asyncio.Task[object]] = set()
        self._sweep: asyncio.Task[None] | None = None

    def begin(self, task: asyncio.Task[object]) -> None:
        """Note that ``task`` starts a write now."""
        loop = task.get_loop()
        self._writing[task] = (loop.time(), task.cancelling())
        if self._sweep is None:
            self._sweep = loop.create_task(self._run(), name="lane-watch-write-deadline")

    def end(self, task: asyncio.Task[object]) -> bool:
        """Note that ``task``'s write is over; True when the sweep cut it off — the task's
        CancelledError is then the deadline's (taken back here), not a cancel from elsewhere."""
        began = self._writing.pop(task, None)
        if task not in self._cut:
            return False
        self._cut.discard(task)
        cancelling = 0 if began is None else began[1]
        # Another cancel (the client left, shutdown) that came as well still counts as one.
        return task.uncancel() <= cancelling

    async def write(self, stream: Stream, message: Any) -> None:
        """``stream.write(message)`` within the deadline: :class:`TooSlow` when the client took
        nothing for it, :class:`ClientGone` when the client is gone."""
        task = asyncio.current_task()
        assert task is not None
        self.begin(task)
        try:
            await stream.write(message)
        except asyncio.CancelledError:
            if self.end(task):
                # HTTP/2 flow control: the client's window and the sockets are full, it is not
                # reading.
                raise TooSlow from None
            raise
        except Exception as exc:
            self.end(task)
            # grpcio raises an internal error type when the peer is already gone.
            raise ClientGone from exc
        else:
            self.end(task)

    async def _run(self) -> None:
        try:
            while self._writing:
                await asyncio.sleep(self._interval)
                oldest = asyncio.get_running_loop().time() - self._seconds
                for task, (began, _) in list(self._writing.items()):
                    if began <= oldest and task not in self._cut:
                        self._cut.add(task)
                        task.cancel()
        finally:
            self._sweep = None


async def end_stream(stream: Stream, status: grpc.Status) -> None:
    """End the stream with ``status`` (raises grpc's AbortError, as an abort does)."""
    try:
        await stream.abort_with_status(status)
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        # The status cannot be sent: the peer is gone or a write is still stuck.
        raise ClientGone from exc


async def let_go(stream: Stream, status: grpc.Status) -> None:
    """End a stream whose client stopped reading with ``status``, its resources already freed
    by the caller."""
    try:
        # The status queues behind the writes the client has not taken: it reads it when it
        # reads again. Waiting for that would keep this handler for as long as the client
        # sleeps, so wait briefly; gRPC sends the status either way.
        async with asyncio.timeout(STATUS_SEND_SECONDS):
            await end_stream(stream, status)
    except TimeoutError:
        return
