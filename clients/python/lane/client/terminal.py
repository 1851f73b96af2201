"""``lane watch``: a live terminal view of one lane.

Follows the lane with :func:`lane.client.watch.watch_lane` (one snapshot, then every commit
folded in; resumed transparently when the connection drops or the server restarts) and redraws
the screen (:mod:`lane.client.view`) ten times a second, so spinners turn and elapsed times
count while nothing is committed. Keys: Escape sends ``AbortOperation`` for the open operation;
``q`` (or Ctrl-C) quits. A lane that does not exist yet is waited for.

On a terminal the view uses the alternate screen and hides the cursor, and puts the input in
cbreak mode (keys arrive at once, unechoed); everything is restored on exit. Colours are drawn
on a terminal unless ``NO_COLOR`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import termios
import time
import tty
from typing import Any, TextIO

import grpc
from lane.client.commands import call
from lane.client.errors import LaneError, WatchProtocolError
from lane.client.view import ToolClock, render
from lane.client.watch import watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

__all__ = ["WatchScreen", "watch_terminal"]

ESCAPE = b"\x1b"
_FRAME_SECONDS = 0.1
#: The service heartbeats an idle watch at least every 10 s; silence beyond this is shown.
_QUIET_SECONDS = 12.0
_NOTICE_SECONDS = 10.0


class WatchScreen:
    """The state of a ``lane watch`` session and its drawing."""

    def __init__(self, stub: Any, lane_id: str, *, out: TextIO, color: bool = True) -> None:
        self.stub = stub
        self.lane_id = lane_id
        self.out = out
        self.color = color
        self.snapshot: snapshot_pb2.LaneSnapshot | None = None
        self.clock = ToolClock()
        self.status = "connecting…"
        self._notice = ""
        self._notice_until = 0.0
        self.last_heard = time.monotonic()
        self.frame = 0
        self.quit = asyncio.Event()
        self._aborts: set[asyncio.Task[None]] = set()

    @property
    def notice(self) -> str:
        """A message about the last key's effect, shown for a while."""
        return self._notice if time.monotonic() < self._notice_until else ""

    @notice.setter
    def notice(self, text: str) -> None:
        self._notice = text
        self._notice_until = time.monotonic() + _NOTICE_SECONDS

    async def follow(self) -> None:
        """Keep the snapshot current for ever (until cancelled)."""
        while True:
            try:
                async for view in watch_lane(self.stub, self.lane_id, include_heartbeats=True):
                    self.snapshot = view.snapshot
                    self.clock.observe(view.snapshot, view.events)
                    self.last_heard = time.monotonic()
                    self.status = "live"
            except LaneError as err:
                if err.code == grpc.StatusCode.NOT_FOUND:
                    self.status = f"waiting for lane {self.lane_id} to be created"
                else:
                    self.status = f"watch failed: {err}; retrying"
            except WatchProtocolError as err:
                self.status = f"watch broke its contract: {err}; starting over"
            await asyncio.sleep(1.0)

    async def abort(self) -> None:
        """Escape: ask the service to abort the open operation."""
        snapshot = self.snapshot
        if snapshot is None or not snapshot.HasField("operation"):
            self.notice = "no open operation to abort"
            return
        operation_id = snapshot.operation.id
        self.notice = f"aborting {operation_id}…"
        try:
            answer = await call(
                self.stub.AbortOperation,
                pb.AbortOperationRequest(lane_id=self.lane_id, operation_id=operation_id),
                retry_seconds=10.0,
            )
        except LaneError as err:
            self.notice = f"abort failed: {err}"
            return
        self.notice = (
            f"abort requested for {operation_id}"
            if answer.newly_requested
            else f"{operation_id} was already aborting"
        )

    def on_keys(self, data: bytes) -> None:
        """Handle one read of keyboard input."""
        if data == ESCAPE:  # a lone ESC; escape sequences (arrows, ...) arrive in one read
            task = asyncio.get_running_loop().create_task(self.abort())
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)
        elif b"q" in data or b"\x03" in data:
            self.quit.set()

    def lines(self, width: int, height: int) -> list[str]:
        quiet = time.monotonic() - self.last_heard
        status = self.status
        if status == "live" and quiet > _QUIET_SECONDS:
            status = f"no word from the service for {quiet:.0f}s; reconnecting"
        footer = " · ".join(part for part in (status, self.notice, "Esc abort · q quit") if part)
        if self.snapshot is None:
            return [f"lane {self.lane_id}", footer]
        return render(
            self.snapshot,
            clock=self.clock,
            width=width,
            height=height,
            frame=self.frame,
            status=footer,
            color=self.color,
        )

    def draw(self) -> None:
        size = shutil.get_terminal_size((120, 40))
        width, height = max(20, size.columns - 1), max(3, size.lines)
        lines = self.lines(width, height)[:height]
        self.frame += 1
        self.out.write("\x1b[H" + "\x1b[K\r\n".join(lines) + "\x1b[K\x1b[J")
        self.out.flush()

    async def animate(self) -> None:
        while True:
            self.draw()
            await asyncio.sleep(_FRAME_SECONDS)


async def watch_terminal(
    stub: Any, lane_id: str, *, out: TextIO | None = None, inp: TextIO | None = None
) -> int:
    """Run the live view until the user quits; return the exit status."""
    out = out or sys.stdout
    inp = inp or sys.stdin
    color = out.isatty() and not os.environ.get("NO_COLOR")
    screen = WatchScreen(stub, lane_id, out=out, color=color)
    loop = asyncio.get_running_loop()
    in_fd = inp.fileno() if inp.isatty() else None
    saved = termios.tcgetattr(in_fd) if in_fd is not None else None
    if out.isatty():
        out.write("\x1b[?1049h\x1b[?25l\x1b[2J")
    if in_fd is not None:
        tty.setcbreak(in_fd)
        loop.add_reader(in_fd, lambda: screen.on_keys(os.read(in_fd, 1024)))
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, screen.quit.set)
    tasks = [asyncio.create_task(screen.follow()), asyncio.create_task(screen.animate())]
    try:
        await screen.quit.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        if in_fd is not None:
            loop.remove_reader(in_fd)
            if saved is not None:
                termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
        if out.isatty():
            out.write("\x1b[?25h\x1b[?1049l")
            out.flush()
    return 0
