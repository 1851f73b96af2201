"""The stream write deadline, kept by one sweep per process instead of one timer per write.

A WatchLane write (or a DriveLane answer's) waits while HTTP/2 flow control holds it back,
which happens only when the client has stopped reading. A timeout scope around every write
arms and disarms a timer per watcher and commit — about a tenth of the server's CPU on a lane
with a hundred watchers — for writes that nearly always finish at once. Instead each write
notes when it began, and a sweep that runs while writes are in progress cancels any older than
the deadline: a stuck write is cut off at most a quarter of the deadline late (never more than
a second).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

#: The longest the sweep sleeps between looks (it sleeps a quarter of the deadline if shorter).
MAX_SWEEP_SECONDS = 1.0
#: How long a stream cut off at the deadline waits for its status to go out (see end_cut_off).
STATUS_SEND_SECONDS = 1.0


class DeadlinePassed(Exception):
    """The client took nothing for the deadline: the sweep cut the write off."""


class WriteDeadline:
    """Tracks the writes in progress of one process's WatchLane and DriveLane streams."""

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

    async def write(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        message: object,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """Write ``message`` (None: the stream's headers alone) to the stream of ``context``
        within the deadline; raise :class:`DeadlinePassed` when the sweep cuts it off (anything
        else as the write raised it). ``task``: the current task, when the caller knows it (a
        stream writing once per commit keeps it rather than look it up per write)."""
        if task is None:
            task = asyncio.current_task()
            assert task is not None
        self.begin(task)
        try:
            if message is None:
                await context.send_initial_metadata(())
            else:
                await context.write(message)
        except asyncio.CancelledError:
            if self.end(task):
                raise DeadlinePassed from None
            raise
        except BaseException:
            self.end(task)
            raise
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


async def end_cut_off(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> None:
    """End a stream whose client stopped reading with ``status`` (raises grpc's AbortError, as
    an abort does, when the status went out at once)."""
    try:
        # The status queues behind the writes the client has not taken: it reads it when it
        # reads again. Waiting for that would keep the handler for as long as the client
        # sleeps, so wait briefly; gRPC sends the status either way.
        async with asyncio.timeout(STATUS_SEND_SECONDS):
            await context.abort_with_status(status)
    except grpc.aio.AbortError:
        raise
    except Exception:
        # TimeoutError, or gRPC took no status (the peer left meanwhile): nothing to tell,
        # and no fault of the service's to log.
        return
