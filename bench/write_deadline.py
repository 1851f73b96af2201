"""What the watch write deadline costs per write, beside a bare write and a timeout scope.

Every WatchLane write is bounded by the write deadline; a process with a hundred watchers on a
busy lane makes a hundred writes per commit. Times, per awaited write (a write stands in as an
await that finishes on the next turn of the loop, as a write into an open HTTP/2 window does),
on uvloop as the service runs: the bare write (the baseline), the same write inside
``asyncio.timeout`` (what each write paid before), and inside the process-wide sweep's
bookkeeping (``lane.server.api.write_deadline``). Prints; asserts nothing. A few seconds::

    python -m bench.write_deadline
"""

from __future__ import annotations

import asyncio

import uvloop

from bench.micro import ROUNDS, per_await
from lane.server.api.write_deadline import WriteDeadline

DEADLINE_SECONDS = 30.0


async def _write() -> None:
    await asyncio.sleep(0)


async def _in_timeout_scope() -> None:
    async with asyncio.timeout(DEADLINE_SECONDS):
        await _write()


async def main() -> None:
    deadline = WriteDeadline(DEADLINE_SECONDS)
    task = asyncio.current_task()
    assert task is not None

    async def swept() -> None:
        deadline.begin(task)
        try:
            await _write()
        finally:
            deadline.end(task)

    bare = await per_await(_write)
    scoped = await per_await(_in_timeout_scope)
    sweep = await per_await(swept)
    print(f"per write, best of 3 x {ROUNDS:,} (uvloop):")
    print(f"  bare write (baseline)          {bare:6.2f} µs")
    print(f"  inside asyncio.timeout         {scoped:6.2f} µs  (+{scoped - bare:.2f})")
    print(f"  with the sweep's bookkeeping   {sweep:6.2f} µs  (+{sweep - bare:.2f})")


if __name__ == "__main__":
    uvloop.run(main())
