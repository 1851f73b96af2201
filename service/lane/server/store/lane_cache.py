"""The lanes this process commanded lately, kept in memory with the version they were read at.

A command on a cached lane skips the load: it decides on the cached state and commits with one
statement that checks the version (``lane_writes``). The cache is only ever a guess: when
another process, or anyone editing rows by hand, moved the lane on, the statement writes
nothing and the store reloads the lane under its lock. So the cache needs no invalidation
protocol, only a bound on its size.

Commands on one lane in one process also take turns (:meth:`LaneCache.turn`): each then decides
on the state its predecessor left, instead of losing a version race to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator

from lane.server.store.lane_reads import VersionedLane
from lane.server.store.lane_ref import LaneRef

#: Lanes kept per process. A lane's cached state is what one command loads (no transcript);
#: the least recently commanded lane goes first.
DEFAULT_CACHED_LANES = 10_000


class LaneCache:
    """Least recently used lanes with their versions, and a turn per lane."""

    def __init__(self, capacity: int = DEFAULT_CACHED_LANES) -> None:
        self.capacity = capacity
        self._lanes: OrderedDict[LaneRef, VersionedLane] = OrderedDict()
        self._turns: dict[LaneRef, tuple[asyncio.Lock, int]] = {}

    def get(self, lane: LaneRef) -> VersionedLane | None:
        """The lane as last seen, or None."""
        found = self._lanes.get(lane)
        if found is not None:
            self._lanes.move_to_end(lane)
        return found

    def put(self, lane: LaneRef, versioned: VersionedLane) -> None:
        """Remember ``lane`` at ``versioned``."""
        self._lanes[lane] = versioned
        self._lanes.move_to_end(lane)
        while len(self._lanes) > self.capacity:
            self._lanes.popitem(last=False)

    def forget(self, lane: LaneRef) -> None:
        """Drop the lane (its state is unknown)."""
        self._lanes.pop(lane, None)

    @contextlib.asynccontextmanager
    async def turn(self, lane: LaneRef) -> AsyncIterator[None]:
        """Hold the lane's turn among this process's commands for the block."""
        lock, users = self._turns.get(lane, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._turns[lane] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[lane]
            if users == 1:
                del self._turns[lane]
            else:
                self._turns[lane] = (lock, users - 1)
