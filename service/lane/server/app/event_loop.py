"""The service's event loop: uvloop where it installs, else asyncio's own.

uvloop runs the same asyncio code with less CPU per I/O wake-up (the figures measured here are
in ``bench/README.md``). ``LANE_EVENT_LOOP=asyncio`` keeps the standard loop, to compare or
should uvloop misbehave on some platform.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: The values of ``LANE_EVENT_LOOP``.
EVENT_LOOPS = ("uvloop", "asyncio")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The constructor of loop ``name`` (None: asyncio's default loop)."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # not built for this platform: the standard loop does the same work
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], name: str = "uvloop") -> T:
    """Run ``main`` to completion on event loop ``name``."""
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(main)
