"""Soak run of the request fuzzer: a live lane service, many random and mutated requests.

Run from the repository root (virtualenv active)::

    python -m tests.outage.soak --requests 100000 [--seed N] [--batch-size 50]

Starts the service in this process on an embedded PostgreSQL in a temporary directory (removed
afterwards), builds lanes in every state, and sends ``--requests`` requests made by the same
hypothesis generator as ``tests/outage/test_fuzz.py`` (:mod:`tests.outage.fuzzing`): templates
with overwritten fields, descriptor-driven random requests, raw invalid UTF-8, wrong wire types,
unknown fields, mutated and random bytes, requests at and over the 4 MiB limit, for every RPC.
Every answer is checked (documented code and ErrorInfo reason only; never UNKNOWN, INTERNAL or
DATA_LOSS), and after every batch each lane a request named is captured again and its new
events folded into its previous capture.

Prints progress, then the counts per status code, per generation mode and per RPC (with the
most frequent reasons), and every violation. Exit status 0 when there was none, 1 otherwise.
The hypothesis example database is off; ``--seed`` fixes the generated choices (the ids the
server mints differ per run, so the bytes do too). It lives beside the suite it extends, not
among the benchmarks: it measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc
from lane.v1 import lane_service_pb2_grpc

from lane.server.app.config import Settings
from lane.server.app.server import start_server
from tests.outage.fuzzing import Fuzzer, Stats, World, drive, populate


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.outage.soak", description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000, help="requests to send")
    parser.add_argument("--seed", type=int, default=8005, help="hypothesis seed")
    parser.add_argument("--batch-size", type=int, default=50, help="requests sent concurrently")
    parser.add_argument(
        "--progress-seconds", type=float, default=5.0, help="how often to print progress"
    )
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace) -> Stats:
    data_dir = Path(tempfile.mkdtemp(prefix="lane-fuzz-"))
    try:
        # The embedded PostgreSQL starts before any gRPC thread exists (see start_server).
        running = await start_server(Settings(database_url=None, data_dir=data_dir))
        try:
            print(f"service on 127.0.0.1:{running.port}, {running.database}", flush=True)
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
            try:
                stub = lane_service_pb2_grpc.LaneServiceStub(channel)
                world = World()
                await populate(stub, world)
                fuzzer = Fuzzer(channel, stub, world)
                await fuzzer.baseline()
                print(f"{len(world.lanes)} lanes built; fuzzing (seed {args.seed})", flush=True)
                last = [time.monotonic()]

                def progress(stats: Stats) -> None:
                    if time.monotonic() - last[0] >= args.progress_seconds:
                        last[0] = time.monotonic()
                        rate = stats.sent / max(stats.seconds, 1e-9)
                        print(
                            f"  {stats.sent} requests, {rate:.0f}/s, "
                            f"{len(stats.violations)} violations",
                            flush=True,
                        )

                await asyncio.to_thread(
                    drive,
                    fuzzer,
                    asyncio.get_running_loop(),
                    requests=args.requests,
                    batch_size=args.batch_size,
                    seed_value=args.seed,
                    on_batch=progress,
                )
                await fuzzer.check_all()
                return fuzzer.stats
            finally:
                await channel.close()
        finally:
            await running.stop(grace=1.0)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    # The service logs every refusal it cannot map (INTERNAL) with a stack trace: keep those,
    # but not the INFO narration.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        stats = asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130
    print()
    print(stats.report())
    return 1 if stats.violations else 0


if __name__ == "__main__":
    sys.exit(main())
