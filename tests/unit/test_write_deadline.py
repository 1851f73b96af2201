"""The stream write deadline's sweep: it cuts off only writes older than the deadline, a cancel
from elsewhere stays a cancel, and a write that fails raises its own error."""

from __future__ import annotations

import asyncio

import pytest

from lane.server.api.write_deadline import DeadlinePassed, WriteDeadline


class _Stream:
    """A stream whose writes wait for ``stuck`` (a write the client has not taken yet)."""

    def __init__(self, stuck: asyncio.Future[None]) -> None:
        self.stuck = stuck

    async def write(self, message: object) -> None:
        await self.stuck

    async def abort_with_status(self, status: object) -> None:
        raise AssertionError("not ended here")


async def _write(deadline: WriteDeadline, stuck: asyncio.Future[None]) -> str:
    """A stream's write through the deadline (as WatchLane and ExportLane write)."""
    try:
        await deadline.write(_Stream(stuck), b"message")  # type: ignore[arg-type]
    except DeadlinePassed:
        return "cut off"
    return "written"


async def test_a_write_the_client_never_takes_is_cut_off() -> None:
    deadline = WriteDeadline(0.2)
    stuck: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert await asyncio.wait_for(_write(deadline, stuck), 5) == "cut off"


async def test_writes_that_finish_are_never_cut_off() -> None:
    deadline = WriteDeadline(0.2)
    loop = asyncio.get_running_loop()
    # Many short writes over several deadlines: each finishes well inside its own.
    for _ in range(20):
        done: asyncio.Future[None] = loop.create_future()
        loop.call_later(0.03, done.set_result, None)
        assert await _write(deadline, done) == "written"


async def test_a_cancel_from_elsewhere_is_not_taken_for_the_deadline() -> None:
    deadline = WriteDeadline(10.0)
    stuck: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    writer = asyncio.create_task(_write(deadline, stuck))
    await asyncio.sleep(0.05)
    writer.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await writer


async def test_a_cancel_that_comes_with_the_deadline_still_cancels() -> None:
    deadline = WriteDeadline(0.2)
    stuck: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    writers: list[asyncio.Task[str]] = []
    # Registered before the writer awaits ``stuck``, so it runs first when the sweep cuts the
    # write off: a cancel as shutdown would send it, landing before the writer runs again.
    stuck.add_done_callback(lambda _: writers[0].cancel())
    writers.append(asyncio.create_task(_write(deadline, stuck)))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(writers[0], 5)


async def test_a_write_that_fails_raises_its_own_error() -> None:
    deadline = WriteDeadline(10.0)
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("the peer is gone"))  # as grpcio's ExecuteBatchError
    with pytest.raises(RuntimeError):
        await _write(deadline, failed)
