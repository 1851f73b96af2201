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
from lane.client.keys import ESCAPE, parse_keys
from lane.client.reach import cause_of, explained
from lane.client.view import Frame, ToolClock, render_frame
from lane.client.watch import RetryPolicy, watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

__all__ = ["VIEW_RETRY", "WatchScreen", "watch_terminal"]

#: The interactive view's resume backoff: a person is looking, so retry at most 0.5 s apart.
VIEW_RETRY = RetryPolicy(initial_backoff=0.2, max_backoff=0.5)
_FRAME_SECONDS = 0.1
#: The service heartbeats an idle watch at least every 10 s; silence beyond this is shown.
_QUIET_SECONDS = 12.0
_NOTICE_SECONDS = 10.0


class WatchScreen:
    """The state of a ``lane watch`` session and its drawing."""

    def __init__(
        self,
        stub: Any,
        lane_id: str,
        *,
        out: TextIO,
        color: bool = True,
        target: str = "",
        tls: bool = False,
    ) -> None:
        self.stub = stub
        self.lane_id = lane_id
        self.out = out
        self.color = color
        self.target = target
        self.tls = tls
        self.snapshot: snapshot_pb2.LaneSnapshot | None = None
        self.clock = ToolClock()
        self.status = "loading…"
        #: Scrolled: the first content row shown; None follows the tail.
        self.top: int | None = None
        self._frame: Frame | None = None
        self._retries = 0
        self._reconnecting = asyncio.Event()
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
                async for view in watch_lane(
                    self.stub,
                    self.lane_id,
                    include_heartbeats=True,
                    retry=VIEW_RETRY,
                    on_retry=self.on_retry,
                    connect_timeout=None,  # the command checked the service; ride outages out
                ):
                    self.snapshot = view.snapshot
                    self.clock.observe(view.snapshot, view.events)
                    self.last_heard = time.monotonic()
                    self.status = "live"
                    self._reconnecting.clear()
            except LaneError as err:
                if err.code == grpc.StatusCode.NOT_FOUND:
                    self.status = f"waiting for lane {self.lane_id} to be created"
                else:
                    self.status = f"watch failed: {explained(err, self.target, tls=self.tls)}"
            except WatchProtocolError as err:
                self.status = f"watch broke its contract: {err}; starting over"
            await asyncio.sleep(1.0)

    def on_retry(self, attempt: int, error: LaneError) -> None:
        """The stream broke: say so at once, with the attempt and its cause."""
        self.status = f"reconnecting · attempt {attempt} · {cause_of(error, tls=self.tls)}"
        self._retries += 1
        self._reconnecting.set()
        self.draw()

    async def confirm_live(self) -> None:
        """While reconnecting, ask the service a cheap question until it answers; once the
        watch has then gone a backoff without failing again, say ``live``. A resumed stream
        sends nothing until the next commit or heartbeat (up to 10 s), so its silence alone
        cannot tell that the service is back."""
        while True:
            await self._reconnecting.wait()
            seen = self._retries
            try:
                await self.stub.ListLanes(pb.ListLanesRequest(page_size=1), timeout=1.0)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
                continue
            await asyncio.sleep(VIEW_RETRY.max_backoff + 0.1)  # the watch's next try is due
            if self._retries == seen:
                self._reconnecting.clear()
                self.status = "live"
                self.last_heard = time.monotonic()
                self.draw()

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
        for key in parse_keys(data):
            if key == ESCAPE:
                task = asyncio.get_running_loop().create_task(self.abort())
                self._aborts.add(task)
                task.add_done_callback(self._aborts.discard)
            elif key in ("q", "\x03"):
                self.quit.set()
            else:
                self.scroll(key)
        self.draw()

    def scroll(self, key: str) -> None:
        """Move the window for a scrolling key; reaching the bottom follows the tail again."""
        frame = self._frame
        if frame is None:
            return
        page = max(1, frame.room - 1)  # a page keeps one row of the last for context
        current = frame.top
        moves = {"up": -1, "k": -1, "down": 1, "j": 1, "pageup": -page, "pagedown": page}
        if key in moves:
            wanted = current + moves[key]
        elif key in ("home", "g"):
            wanted = 0
        elif key in ("end", "G"):
            wanted = frame.bottom
        else:
            return
        self.top = None if wanted >= frame.bottom else max(0, wanted)

    def lines(self, width: int, height: int) -> list[str]:
        quiet = time.monotonic() - self.last_heard
        status = self.status
        if status == "live" and quiet > _QUIET_SECONDS:
            status = f"no word from the service for {quiet:.0f}s; reconnecting"
        footer = " · ".join(part for part in (status, self.notice, "Esc abort · q quit") if part)
        if self.snapshot is None:
            return [f"lane {self.lane_id}", footer][:height]
        self._frame = render_frame(
            self.snapshot,
            clock=self.clock,
            width=width,
            height=height,
            frame=self.frame,
            status=footer,
            color=self.color,
            top=self.top,
        )
        return self._frame.lines

    def size(self) -> tuple[int, int]:
        """The terminal's columns and lines, read afresh (it may have been resized)."""
        try:
            size = os.get_terminal_size(self.out.fileno())
        except (OSError, ValueError, AttributeError):
            size = shutil.get_terminal_size((120, 40))
        return size.columns, size.lines

    def draw(self) -> None:
        columns, rows = self.size()
        # One column short of the edge: some terminals wrap a line that fills the last one.
        width, height = max(10, columns - 1), max(3, rows)
        lines = self.lines(width, height)[:height]
        self.frame += 1
        self.out.write("\x1b[H" + "\x1b[K\r\n".join(lines) + "\x1b[K\x1b[J")
        self.out.flush()

    async def animate(self) -> None:
        while True:
            self.draw()
            await asyncio.sleep(_FRAME_SECONDS)


async def watch_terminal(
    stub: Any,
    lane_id: str,
    *,
    out: TextIO | None = None,
    inp: TextIO | None = None,
    target: str = "",
    tls: bool = False,
) -> int:
    """Run the live view until the user quits; return the exit status. ``target`` and
    ``tls`` describe the connection in messages about it."""
    out = out or sys.stdout
    inp = inp or sys.stdin
    color = out.isatty() and not os.environ.get("NO_COLOR")
    screen = WatchScreen(stub, lane_id, out=out, color=color, target=target, tls=tls)
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
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGWINCH, screen.draw)
    tasks = [
        asyncio.create_task(screen.follow()),
        asyncio.create_task(screen.animate()),
        asyncio.create_task(screen.confirm_live()),
    ]
    try:
        await screen.quit.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGWINCH):
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
