"""The service's event loop: uvloop where it installs, else asyncio's own.

uvloop runs the same asyncio code with less CPU per I/O wake-up; the service makes one or two
database round trips per command, so it costs noticeably less server CPU per commit (figures
in ``bench/README.md``). ``LANE_EVENT_LOOP=asyncio`` keeps the standard loop (to compare, or
should uvloop misbehave on some platform).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default loop."""
    if os.environ.get("LANE_EVENT_LOOP", "") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # not built for this platform: the standard loop does the same work
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: what :func:`run` runs on."""
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on the service's event loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
