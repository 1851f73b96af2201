"""What every service benchmark shares: the database option, the entry point (parse, run,
clean up on Ctrl-C or SIGTERM), and stopping the server processes it started."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Sequence


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """``--database-url``: a PostgreSQL server to use instead of an embedded one."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get("LANE_BENCH_DATABASE_URL") or None,
        help="PostgreSQL server URL, role with CREATEDB (default: $LANE_BENCH_DATABASE_URL,"
        " else an embedded pgserver in a temp dir)",
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
        return asyncio.run(until_signalled())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: every process and directory this run started is cleaned up")
        return 130
