"""The entry point every service benchmark shares: parse, run, clean up on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence


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
