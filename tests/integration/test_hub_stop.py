"""Hub.stop ends every task of the hub, also when a doorbell rings just as it cancels them.

Python 3.11's ``asyncio.wait_for`` swallows a cancel that lands once the awaited event is set:
the doorbell task then outlived ``Hub.stop`` and server shutdown hung. The rings here land
0-3 loop turns before the cancel, which covers the window where that happened."""

from __future__ import annotations

import asyncio

import pytest

from lane.server.hub import Hub
from lane.server.store import Store

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_stop_ends_the_doorbell_task_when_a_ring_lands_with_the_cancel(
    store: Store, turns: int
) -> None:
    for _ in range(10):
        hub = Hub(store, notify=True)
        await hub.start()
        await asyncio.sleep(0.02)  # the doorbell task is waiting for a ring
        hub._dirty_event.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        # Stop swallows the cancels of the tasks it waits for, so a bound on it would not end
        # a hang: wait beside it instead.
        stopping = asyncio.create_task(hub.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        assert stopping in done, "Hub.stop did not return: a hub task outlived its cancel"
