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
from collections import OrderedDict, deque

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
        self._turns: dict[LaneRef, _Turn] = {}

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

    def turn(self, lane: LaneRef) -> _Taking:
        """Hold the lane's turn among this process's commands for the block (``async with``):
        the commands waiting for it get it one after the other, in the order they asked."""
        return _Taking(self._turns, lane)


class _Turn:
    """A lane's turn, held by one command: those waiting for it, in order."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: deque[asyncio.Future[None]] = deque()


class _Taking:
    """``async with`` a lane's turn. A class rather than a generator context manager around an
    ``asyncio.Lock``: it runs around every command, and a lane nobody else is commanding costs
    one dictionary entry, no lock and no future (a fifth of the cost)."""

    __slots__ = ("_lane", "_turns")

    def __init__(self, turns: dict[LaneRef, _Turn], lane: LaneRef) -> None:
        self._turns = turns
        self._lane = lane

    async def __aenter__(self) -> None:
        turn = self._turns.get(self._lane)
        if turn is None:
            self._turns[self._lane] = _Turn()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn.waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with contextlib.suppress(ValueError):  # (passed over already)
                    turn.waiting.remove(waiter)
            else:
                self._pass_on()  # handed the turn as it was cancelled: the next one gets it
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._pass_on()

    def _pass_on(self) -> None:
        """Hand the turn to the first command still waiting, or free it."""
        turn = self._turns[self._lane]
        while turn.waiting:
            waiter = turn.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        del self._turns[self._lane]
