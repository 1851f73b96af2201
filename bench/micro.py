"""Timing loops for the micro-benchmarks (``traces_off``, ``write_deadline``): microseconds
per call, the best of three rounds, so a busy machine inflates the figure less."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

ROUNDS = 100_000


def per_call(run: Callable[[], None], rounds: int = ROUNDS) -> float:
    """Microseconds per call of ``run`` (best of three)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            run()
        best = min(best, time.perf_counter() - start)
    return best / rounds * 1e6


async def per_await(run: Callable[[], Awaitable[Any]], rounds: int = ROUNDS) -> float:
    """Microseconds per awaited call of ``run`` (best of three)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            await run()
        best = min(best, time.perf_counter() - start)
    return best / rounds * 1e6
