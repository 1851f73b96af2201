"""Repeated log lines, rate-limited with a count.

During a database outage every failing call logs the same warning: a 13 s outage wrote over a
thousand lines. :class:`RepeatLimiter` writes the first line of a kind (its level and message
template), counts the repeats for ``window`` seconds, then writes one line for them all::

    WARNING database unavailable: connection refused
    WARNING … 1,160 more in the last 10 s: database unavailable: connection refused

A cross-cutting module like ``logs.py``: it imports nothing of the service.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: ``schedule(delay, callback)``: call ``callback`` after ``delay`` seconds.
Schedule = Callable[[float, Callable[[], None]], object]


def _on_running_loop(delay: float, callback: Callable[[], None]) -> object:
    """Schedule on the running event loop; outside one, no timer (the count is written with
    the next line of its kind, or by :meth:`RepeatLimiter.flush`)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop.call_later(delay, callback)


@dataclass
class _Window:
    start: float
    repeats: int = 0
    last_args: tuple[object, ...] = ()
    timer: object = None


class RepeatLimiter:
    """Logs through ``logger`` at most one line per kind per ``window`` seconds, and then the
    count of the repeats it held back (module docstring). ``clock`` and ``schedule`` are
    injectable so tests need not wait."""

    def __init__(
        self,
        logger: logging.Logger,
        window: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule = _on_running_loop,
    ) -> None:
        self.logger = logger
        self.window = window
        self._clock = clock
        self._schedule = schedule
        self._windows: dict[tuple[int, str], _Window] = {}
        self._lock = threading.Lock()

    def warning(self, msg: str, *args: object) -> None:
        """:meth:`log` at WARNING."""
        self.log(logging.WARNING, msg, *args)

    def log(self, level: int, msg: str, *args: object) -> None:
        """Log ``msg % args`` unless a line of this kind (``level``, ``msg``) was written less
        than ``window`` seconds ago; then count it."""
        if not self.logger.isEnabledFor(level):
            return
        key = (level, msg)
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window.start < self.window:
                window.repeats += 1
                window.last_args = args
                if window.timer is None:
                    delay = window.start + self.window - now
                    window.timer = self._schedule(delay, lambda: self._end(key, window))
                return
            ended = self._windows.pop(key, None)
            self._windows[key] = _Window(start=now)
        if ended is not None:
            self._summary(key, ended)
        self.logger.log(level, msg, *args)

    def flush(self) -> None:
        """Write the count of every kind's held-back repeats now and start afresh."""
        with self._lock:
            ended = list(self._windows.items())
            self._windows.clear()
        for key, window in ended:
            self._summary(key, window)

    def _end(self, key: tuple[int, str], window: _Window) -> None:
        """The window's timer: write its count, unless a newer window replaced it."""
        with self._lock:
            if self._windows.get(key) is not window:
                return
            del self._windows[key]
        self._summary(key, window)

    def _summary(self, key: tuple[int, str], window: _Window) -> None:
        if not window.repeats:
            return
        level, msg = key
        self.logger.log(
            level,
            "… %s more in the last %s s: " + msg,
            f"{window.repeats:,}",
            f"{self.window:g}",
            *window.last_args,
        )
