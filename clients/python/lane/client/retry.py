"""The one retry policy of the Python client: capped exponential backoff with jitter.

Everything in :mod:`lane.client` that tries again takes a :class:`RetryPolicy`: a command
refused UNAVAILABLE or ``DATABASE_BUSY`` (:func:`lane.client.commands.call`,
:class:`~lane.client.session.LaneSession`, :class:`~lane.client.lane_client.LaneClient`), a
broken DriveLane stream reopened, a watch resumed (:func:`~lane.client.watch.watch_lane`).
*What* is retried is each caller's decision (a command is retried with its request id, so it
commits once); *how often and how long* is the policy's.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from dataclasses import dataclass, replace

__all__ = ["COMMAND_RETRY", "RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and for how long to try again.

    Attempt ``n`` (1-based, counting consecutive failures) waits
    ``min(max_backoff, initial_backoff * multiplier ** (n - 1))``, reduced by up to ``jitter``
    of itself at random so that many clients failing together do not come back together. The
    caller tries again at most ``max_attempts`` times in a row (the failure that would start
    attempt ``max_attempts + 1`` is raised) and gives up once ``timeout`` seconds passed since
    the first failure (None: no such bound).
    """

    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = None
    timeout: float | None = None

    def delay(self, attempt: int, unit: float | None = None) -> float:
        """Seconds to wait before attempt ``attempt``; ``unit`` in [0, 1) draws the jitter
        (random when None)."""
        exponent = min(max(attempt - 1, 0), 64)  # no float overflow on very long outages
        base = min(self.max_backoff, self.initial_backoff * self.multiplier**exponent)
        draw = random.random() if unit is None else unit
        return base * (1.0 - self.jitter * draw)

    def with_timeout(self, timeout: float | None) -> RetryPolicy:
        """This policy giving up after ``timeout`` seconds instead."""
        return self if timeout == self.timeout else _with_timeout(self, timeout)

    def deadline(self) -> float | None:
        """The ``time.monotonic()`` after which a retry that starts now gives up."""
        return None if self.timeout is None else time.monotonic() + self.timeout

    def gives_up(self, attempt: int, deadline: float | None) -> bool:
        """Whether failure number ``attempt`` (1-based, in a row) is raised instead of retried."""
        if self.max_attempts is not None and attempt > self.max_attempts:
            return True
        return deadline is not None and time.monotonic() >= deadline

    async def backoff(self, attempt: int, deadline: float | None) -> None:
        """Wait before attempt ``attempt + 1``, never past ``deadline``."""
        delay = self.delay(attempt)
        if deadline is not None:
            delay = min(delay, max(0.0, deadline - time.monotonic()))
        await asyncio.sleep(delay)


@functools.lru_cache(maxsize=64)
def _with_timeout(policy: RetryPolicy, timeout: float | None) -> RetryPolicy:
    # Made once per policy and timeout: a session asked for the same timeout on every command
    # (retry_seconds=...) would otherwise copy the policy each time.
    return replace(policy, timeout=timeout)


#: Commands: from 0.05-0.1 s, doubling, up to 1-2 s between attempts, for 30 s in all (long
#: enough to ride out a service restart).
COMMAND_RETRY = RetryPolicy(timeout=30.0)
