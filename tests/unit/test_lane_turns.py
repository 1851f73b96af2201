"""A lane's turn (LaneCache.turn): one command at a time per lane, in the order they asked,
and a command cancelled while waiting, or just as it was handed the turn, never keeps it."""

from __future__ import annotations

import asyncio

import pytest

from lane.server.store.lane_cache import LaneCache
from lane.server.store.lane_ref import LaneRef

LANE = LaneRef("default", "turns")
OTHER = LaneRef("default", "other")


async def _hold(
    cache: LaneCache, lane: LaneRef, name: str, log: list[str], gate: asyncio.Event
) -> None:
    async with cache.turn(lane):
        log.append(f"{name} in")
        await gate.wait()
        log.append(f"{name} out")


def test_commands_of_one_lane_take_turns_in_order_and_other_lanes_do_not_wait() -> None:
    async def main() -> list[str]:
        cache, gate = LaneCache(), asyncio.Event()
        log: list[str] = []
        tasks = [asyncio.create_task(_hold(cache, LANE, n, log, gate)) for n in "abc"]
        other = asyncio.create_task(_hold(cache, OTHER, "x", log, asyncio.Event()))
        await asyncio.sleep(0.01)
        assert log == ["a in", "x in"], log  # b and c wait; the other lane does not
        gate.set()
        await asyncio.gather(*tasks)
        other.cancel()
        return log

    log = asyncio.run(main())
    assert [e for e in log if e[0] != "x"] == ["a in", "a out", "b in", "b out", "c in", "c out"]


@pytest.mark.parametrize("when", ["waiting", "handed"])
def test_a_cancelled_waiter_never_keeps_the_turn(when: str) -> None:
    async def main() -> list[str]:
        cache, gate = LaneCache(), asyncio.Event()
        log: list[str] = []
        first = asyncio.create_task(_hold(cache, LANE, "a", log, gate))
        await asyncio.sleep(0)
        second = asyncio.create_task(_hold(cache, LANE, "b", log, gate))
        third = asyncio.create_task(_hold(cache, LANE, "c", log, gate))
        await asyncio.sleep(0.01)
        if when == "waiting":
            second.cancel()
            gate.set()
        else:
            gate.set()
            await asyncio.sleep(0)  # a leaves and hands b the turn; b has not run yet
            second.cancel()
        await asyncio.gather(first, third, second, return_exceptions=True)
        # Nothing holds the lane's turn any more: a new command gets it at once.
        async with asyncio.timeout(1):
            async with cache.turn(LANE):
                log.append("d in")
        return log

    log = asyncio.run(main())
    assert "b in" not in log
    assert log == ["a in", "a out", "c in", "c out", "d in"]
