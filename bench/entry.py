"""What every service benchmark shares: the database option (and the server options of those
that time a window, the run's shape of those that run the drivers' lifecycle), the entry point
(parse, run, clean up on Ctrl-C or SIGTERM), where a checkout keeps its server package, and
stopping the server processes it started."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """``--database-url``: a PostgreSQL server to use instead of an embedded one."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get("LANE_BENCH_DATABASE_URL") or None,
        help="PostgreSQL server URL, role with CREATEDB (default: $LANE_BENCH_DATABASE_URL,"
        " else an embedded pgserver in a temp dir)",
    )


def add_run_shape(parser: argparse.ArgumentParser) -> None:
    """``--calls`` and ``--turns``: the shape of the drivers' lifecycle run
    (:mod:`bench.replay`), for a benchmark that runs or records it."""
    parser.add_argument("--calls", type=int, default=4, help="tool calls per turn (default 4)")
    parser.add_argument("--turns", type=int, default=5, help="tool turns per run (default 5)")


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--notify`` and ``--py-spy``, for a benchmark that times the service over a window."""
    parser.add_argument(
        "--notify", choices=("on", "off"), default="on", help="the service's LANE_NOTIFY"
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="profile the server with py-spy during the window (FILE.svg: flame graph,"
        " FILE.json: speedscope, else collapsed stacks); profiling slows the server",
    )


@dataclass(frozen=True)
class ServerTree:
    """Where a checkout keeps its server package, and how to start that checkout's server:
    ``python -m {package}.app`` with ``cwd`` as the working directory, which ``-m`` puts first
    on ``sys.path``, so the checkout's own server package wins over the one installed in the
    virtualenv. The ``lane`` client packages (``lane.v1``, ``lane.client``, ``lane.limits``)
    still come from the virtualenv (this working tree)."""

    package: str  # the import name: "lane.server", or "service" before the rename
    directory: Path  # the package's directory
    cwd: Path  # the directory holding the package's top-level name

    @property
    def app(self) -> str:
        """The module ``python -m`` runs."""
        return f"{self.package}.app"


def server_tree(root: Path) -> ServerTree:
    """The server package of the checkout at ``root``: ``lane.server`` in
    ``service/lane/server`` (started from ``service/``, the directory holding that checkout's
    ``lane`` portion), or, in a checkout from before the rename, the top-level package
    ``service`` in ``service/`` (started from ``root``). Which one is decided by which
    directory holds ``app/__main__.py``."""
    current = root / "service" / "lane" / "server"
    if (current / "app" / "__main__.py").is_file():
        return ServerTree("lane.server", current, root / "service")
    before = root / "service"
    if (before / "app" / "__main__.py").is_file():
        return ServerTree("service", before, root)
    raise RuntimeError(
        f"{root} has neither service/lane/server/app/__main__.py nor service/app/__main__.py"
    )


async def stop_process(process: asyncio.subprocess.Process, grace: float = 15.0) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it after ``grace`` seconds."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


def run_benchmark(
    parse_args: Callable[[Sequence[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace], Awaitable[int]],
    argv: Sequence[str] | None = None,
) -> int:
    """Run ``run(parse_args(argv))``; its exit status, or 130 when interrupted. SIGTERM cancels
    it as Ctrl-C does, so the processes and directories it started are cleaned up either way."""
    args = parse_args(argv)

    async def until_signalled() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await run(args)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        if getattr(args, "driver_loop", "asyncio") == "uvloop":
            # The bench process's loop (its drivers'): uvloop, as the service runs.
            import uvloop

            return uvloop.run(until_signalled())
        return asyncio.run(until_signalled())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: every process and directory this run started is cleaned up")
        return 130


@contextlib.asynccontextmanager
async def open_channels(
    address: str, count: int, *, ready_within: float | None = None
) -> AsyncIterator[list[grpc.aio.Channel]]:
    """``count`` channels to ``address``, each its own TCP connection (a local subchannel
    pool: otherwise channels with equal arguments share one), as that many clients would
    have, and so that with workers the kernel can hand them to different processes.
    ``ready_within``: wait that long at most for every one to connect first."""
    options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", 4 * 1024 * 1024)]
    if count > 1:
        options.append(("grpc.use_local_subchannel_pool", 1))
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(count)]
    try:
        if ready_within is not None:
            async with asyncio.timeout(ready_within):
                await asyncio.gather(*(channel.channel_ready() for channel in channels))
        yield channels
    finally:
        await asyncio.gather(*(channel.close(None) for channel in channels))
