"""Fixtures for end-to-end terminal tests: a private tmux server, and the ``lane`` processes a
test starts. Everything is killed when the test ends, whatever happened.

tmux is required (CI machines have it): without it these tests fail with a message saying so,
they are not skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

#: Size of every tmux window these tests open.
WIDTH, HEIGHT = 120, 40


def lane_command(*args: str) -> list[str]:
    """The ``lane`` command line run with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "lane.client", *args]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NO_COLOR", None)
    env["LANG"] = env["LC_ALL"] = "C.UTF-8"
    env["PYTHONUNBUFFERED"] = "1"
    env["GRPC_ENABLE_FORK_SUPPORT"] = "0"
    return env


async def run(*command: str) -> str:
    """Run a command to completion (without blocking the event loop the service runs on)."""
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env()
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise AssertionError(f"{shlex.join(command)} failed ({process.returncode}): {err.decode()}")
    return out.decode("utf-8", errors="replace")


class Tmux:
    """A private tmux server (its own socket), its sessions and their screens."""

    def __init__(self, config: Path) -> None:
        self.tmux = shutil.which("tmux") or "tmux"
        self.socket = f"lane-test-{uuid.uuid4().hex[:10]}"
        self.config = config

    async def cmd(self, *args: str) -> str:
        return await run(self.tmux, "-u", "-L", self.socket, "-f", str(self.config), *args)

    async def start(
        self, session: str, command: Sequence[str], *, width: int = WIDTH, height: int = HEIGHT
    ) -> None:
        """Open ``session`` (``width`` x ``height``, default WIDTH x HEIGHT) running
        ``command``."""
        await self.cmd(
            "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height),
            shlex.join(command),
        )  # fmt: skip

    async def split(self, session: str, command: Sequence[str]) -> None:
        """Split ``session``'s window side by side; the new right pane (``session:0.1``) runs
        ``command``, the first one is ``session:0.0``."""
        await self.cmd("split-window", "-h", "-t", session, shlex.join(command))

    async def resize(self, session: str, width: int, height: int) -> None:
        await self.cmd("resize-window", "-t", session, "-x", str(width), "-y", str(height))

    async def screen(self, session: str, *, escapes: bool = False) -> str:
        """The visible pane; with ``escapes`` its raw ANSI styling too (capture-pane -e)."""
        return await self.cmd("capture-pane", "-p", *(["-e"] if escapes else []), "-t", session)

    async def send_keys(self, session: str, *keys: str) -> None:
        await self.cmd("send-keys", "-t", session, *keys)

    async def wait_for(
        self, session: str, found: Callable[[str], object], what: str, seconds: float = 15.0
    ) -> str:
        """Poll the screen until ``found(screen)`` is truthy; return that screen."""
        deadline = time.monotonic() + seconds
        screen = ""
        while time.monotonic() < deadline:
            screen = await self.screen(session)
            if found(screen):
                return screen
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; the screen shows:\n{screen}")

    async def kill(self) -> None:
        """Kill the server (and so every pane's process); remove its socket file."""
        with contextlib.suppress(AssertionError, OSError):
            await self.cmd("kill-server")
        directory = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
        (directory / self.socket).unlink(missing_ok=True)


@pytest_asyncio.fixture(loop_scope="session")
async def tmux(tmp_path: Path) -> AsyncIterator[Tmux]:
    """A private tmux server, killed (with every pane's process) after the test."""
    if shutil.which("tmux") is None:
        pytest.fail(
            "tmux is required by tests/terminal (the end-to-end terminal tests); "
            "install it, e.g. `apt-get install tmux`"
        )
    config = tmp_path / "tmux.conf"
    # Keep a pane whose program exited (its last screen explains a failure); no status line.
    config.write_text("set -g remain-on-exit on\nset -g status off\nset -g history-limit 100\n")
    server = Tmux(config)
    try:
        yield server
    finally:
        await server.kill()


class Processes:
    """Processes a test started; each is stopped (SIGTERM, then SIGKILL) when the test ends."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[tuple[asyncio.subprocess.Process, Path]] = []

    async def start(self, *command: str) -> asyncio.subprocess.Process:
        log = self.directory / f"process-{len(self.started)}.log"
        with log.open("wb") as sink:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=sink, stderr=asyncio.subprocess.STDOUT, env=child_env()
            )
        self.started.append((process, log))
        return process

    def output(self, process: asyncio.subprocess.Process) -> str:
        for started, log in self.started:
            if started is process:
                return log.read_text(errors="replace")
        return ""

    async def wait(self, process: asyncio.subprocess.Process, seconds: float) -> int:
        try:
            return await asyncio.wait_for(process.wait(), seconds)
        except TimeoutError:
            raise AssertionError(
                f"process {process.pid} still running after {seconds}s; its output:\n"
                + self.output(process)
            ) from None

    async def stop_all(self) -> None:
        for process, _ in self.started:
            if process.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()


@pytest_asyncio.fixture(loop_scope="session")
async def processes(tmp_path: Path) -> AsyncIterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        await started.stop_all()


def visible_lines(screen: str) -> list[str]:
    """The screen's lines without trailing blanks, and without the blank lines below them."""
    lines = [line.rstrip() for line in screen.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def lines_matching(screen: str, pattern: str) -> list[int]:
    """Indexes of the screen lines matching ``pattern``."""
    return [i for i, line in enumerate(screen.splitlines()) if re.search(pattern, line)]
