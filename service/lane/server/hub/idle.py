"""Idle wake-ups: the heartbeat of waiting watchers, kept by one sweep per process instead of a
timer per wait; and :class:`Bell`, what a stream waits on (rung by a change, or its heartbeat
due).

A watcher waits for its lane's next commit at most a heartbeat interval, then sends a
heartbeat. With a timer per wait, every watcher armed and cancelled one per commit — on uvloop
a timer handle made and closed each time, the largest single cost of a watcher's turn besides
the write itself. Here each wait notes when it is due (read off the sweep's clock, which the
sweep moves once per tick: no clock read per wait), and one sweep, running while anything waits,
ends the waits that are due. A wait ends a little early rather than late: between its interval
less two ticks and its interval (a tick is a quarter of the shortest interval asked, at most a
second), so a heartbeat still comes at least once per interval.
"""

from __future__ import annotations

import asyncio
import contextlib

#: The longest the sweep sleeps between looks.
MAX_TICK_SECONDS = 1.0


class IdleWakeups:
    """Futures that resolve once their interval has passed, unless resolved before."""

    __slots__ = ("_loop", "_now", "_sweep", "_tick", "_waiting")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The loop's clock as of the sweep's last look.
        self._now = 0.0
        self._tick = MAX_TICK_SECONDS
        #: Each waiting future, and when it is due (loop time).
        self._waiting: dict[asyncio.Future[None], float] = {}
        self._sweep: asyncio.Task[None] | None = None

    def wait(self, within: float) -> asyncio.Future[None]:
        """A future the sweep resolves at most ``within`` seconds from now (see the module
        docstring); resolve it to wake its waiter earlier, and call :meth:`done` after."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        tick = min(MAX_TICK_SECONDS, within / 4)
        if tick < self._tick:
            self._tick = tick
        if self._sweep is None:
            self._now = loop.time()
            self._sweep = loop.create_task(self._run(), name="hub-idle-wakeups")
        future = loop.create_future()
        self._waiting[future] = self._now + within - self._tick
        return future

    def done(self, future: asyncio.Future[None]) -> None:
        """``future``'s wait is over (it resolved, or its waiter left)."""
        self._waiting.pop(future, None)

    async def stop(self) -> None:
        """Stop the sweep (the hub stops)."""
        sweep, self._sweep = self._sweep, None
        if sweep is not None:
            sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweep

    async def _run(self) -> None:
        assert self._loop is not None
        try:
            while self._waiting:
                await asyncio.sleep(self._tick)
                now = self._now = self._loop.time()
                due = [future for future, at in self._waiting.items() if at <= now]
                for future in due:
                    del self._waiting[future]
                    if not future.done():
                        future.set_result(None)
        finally:
            if self._sweep is asyncio.current_task():
                self._sweep = None


class Bell:
    """What one stream waits on: rung by a change (:meth:`ring`) or by shutdown
    (:meth:`close`), or its wait ends at its heartbeat interval (``idle``). A ring while the
    stream writes is kept for its next wait."""

    # Slots and a bare future rather than an asyncio.Event (whose deque of waiters alone is
    # ~600 B): an idle watcher is mostly its bell, and a process holds thousands.
    __slots__ = ("_closed", "_idle", "_rung", "_waiter")

    def __init__(self, idle: IdleWakeups, *, closed: bool) -> None:
        self._idle = idle
        #: Rung since the last wait returned.
        self._rung = False
        #: What the stream awaits while it waits (None while it is not waiting).
        self._waiter: asyncio.Future[None] | None = None
        self._closed = closed

    @property
    def closed(self) -> bool:
        """Whether the server is shutting down (the stream must end)."""
        return self._closed

    def ring(self) -> None:
        """Wake the stream."""
        self._rung = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        """Ask the stream to end (server shutdown)."""
        self._closed = True
        self.ring()

    async def wait(self, within: float) -> bool:
        """Wait until rung, at most ``within`` seconds (a little less, see the module
        docstring); True when rung."""
        if not self._rung:
            # A future, not a task nor a timer, per wait (one per watcher per commit).
            idle = self._idle
            waiter = self._waiter = idle.wait(within)
            try:
                await waiter
            finally:
                idle.done(waiter)
                self._waiter = None
        rung, self._rung = self._rung, False
        return rung
