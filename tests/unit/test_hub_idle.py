"""The idle wake-ups of waiting watchers (service/lane/server/hub/idle.py): one sweep ends the
waits that are due, a wait resolved earlier leaves it, and the sweep stops when nothing waits."""

from __future__ import annotations

import asyncio

from lane.server.hub.idle import IdleWakeups


async def test_a_wait_ends_on_its_own_and_one_resolved_first_is_left_alone() -> None:
    idle = IdleWakeups()
    slow = idle.wait(0.2)
    rung = idle.wait(60.0)
    rung.set_result(None)  # a commit rang this one
    idle.done(rung)
    async with asyncio.timeout(10):
        await slow
    idle.done(slow)
    # Nothing waits any more: the sweep ends; a later wait starts it again.
    async with asyncio.timeout(10):
        while idle._sweep is not None:  # noqa: ASYNC110 (no event for it)
            await asyncio.sleep(0.01)
    again = idle.wait(0.2)
    async with asyncio.timeout(10):
        await again
    idle.done(again)
    await idle.stop()


async def test_stop_ends_the_sweep() -> None:
    idle = IdleWakeups()
    waiting = idle.wait(60.0)
    await idle.stop()
    assert idle._sweep is None and not waiting.done()
