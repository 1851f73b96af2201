"""What following many lanes costs the server: one WatchLanes stream against one WatchLane
stream per lane, and against no watcher at all, in the same run.

Run from the repository root (virtualenv active)::

    python -m bench.lane_list [--lanes 1000 --rate 500 --seconds 10]

Three phases, each on a fresh service process (``python -m lane.server.app``, a subprocess, see
:func:`bench.commit_throughput.run_service`) and ``--lanes`` fresh lanes of the same database:

1. **none**: no watcher;
2. **lanes**: one ``WatchLanes`` stream following all the lanes (by their common prefix), read
   in this process as fast as it comes;
3. **lane**: ``--lanes`` ``WatchLane`` streams, one per lane, in a process of their own
   (:mod:`bench.watchers`), spread over 8 channels.

In each, ``--senders`` tasks commit ``SetLaneValue`` (one ``value_update`` event) round-robin
over the lanes at ``--rate`` commits/s (open loop, :func:`bench.watch_delivery._send_paced`),
for ``--warmup`` seconds and then the ``--seconds`` window. The server's CPU over the window,
per commit completed in it, is the figure; the ratios of the watched phases to ``none`` are
printed beside it (CPU time per commit varies less than rates on a shared machine).
``--py-spy FILE`` profiles the server in each phase's window (FILE-none, FILE-lanes, ...).

Checks (a failure sets the exit status to 1): every commit sent reaches its watchers — the
WatchLanes stream's latest summary of every lane, and every WatchLane stream, at its lane's
last revision — and nothing fails. For the WatchLanes stream the messages (writes) and lane
entries it received in the window are printed: with coalescing, far fewer writes than commits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from bench.commit_throughput import (
    CpuUse,
    Database,
    cpu_sample,
    cpu_use,
    finish_profiler,
    provision_database,
    start_profiler,
)
from bench.commit_throughput import run_service as service_process
from bench.entry import add_database_url, add_server_options, run_benchmark
from bench.watch_delivery import SendStats, _create_lanes, _send_paced, _sleep_until
from bench.watchers import start_fleet

PHASES = ("none", "lanes", "lane")
DRAIN_SECONDS = 60.0


@dataclass(frozen=True)
class Phase:
    name: str
    commits: int
    seconds: float
    cpu: CpuUse
    errors: int
    #: What the watchers had of each lane at the end does not match the last commits.
    behind: list[str]
    #: The WatchLanes stream in the window: messages (writes) and lane entries received.
    messages: int = 0
    entries: int = 0

    @property
    def server_per_commit(self) -> float:
        return self.cpu.processes["server"] / max(self.commits / self.seconds, 1e-9)


class LaneList:
    """One WatchLanes stream read in the background: each lane's latest revision."""

    def __init__(self, stub: Any, prefix: str) -> None:
        self.call = stub.WatchLanes(pb.WatchLanesRequest(lane_id_prefix=prefix))
        self.revisions: dict[str, int] = {}
        self.listed = asyncio.Event()
        self.counting = False
        self.messages = self.entries = 0
        self.error: grpc.aio.AioRpcError | None = None
        self.moved = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                for line in response.lanes:
                    self.revisions[line.lane_id] = line.revision
                if response.listing_complete:
                    self.listed.set()
                elif self.counting and not response.heartbeat:
                    self.messages += 1
                    self.entries += len(response.lanes)
                self.moved.set()
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        self.moved.set()

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def reach(self, expect: dict[str, int], seconds: float) -> list[str]:
        """Wait until every lane of ``expect`` is at its revision; those that are not."""
        deadline = time.monotonic() + seconds
        while True:
            behind = [lane for lane, rev in expect.items() if self.revisions.get(lane, 0) < rev]
            if not behind or self.task.done() or time.monotonic() >= deadline:
                return behind
            self.moved.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self.moved.wait()
            except TimeoutError:
                pass


async def run_phase(db: Database, args: argparse.Namespace, name: str) -> Phase:
    tag = f"ll-{name}-{uuid.uuid4().hex[:8]}-"
    lanes = [f"{tag}{i:05d}" for i in range(args.lanes)]
    extra_env = {"LANE_MAX_WATCHERS": str(max(10_000, args.lanes + 10))}
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(
            service_process(db.url, args.notify == "on", extra_env)
        )
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(service.address))
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        await _create_lanes(stub, lanes, args.senders)
        processes = {"server": service.pid, "senders": os.getpid()}
        watching: LaneList | None = None
        fleet = None
        if name == "lanes":
            watching = LaneList(stub, tag)
            stack.push_async_callback(watching.close)
            async with asyncio.timeout(60):
                await watching.listed.wait()
        elif name == "lane":
            fleet = await stack.enter_async_context(
                start_fleet(service.address, lanes, channels=8, records=False)
            )
            processes["watchers"] = fleet.pid
        print(f"{name}: committing at {args.rate:g}/s over {len(lanes):,} lanes ...", flush=True)
        stats = SendStats()
        start = time.monotonic() + 0.2
        sending = asyncio.create_task(_send_paced(stub, lanes, args, start, stats))
        await _sleep_until(start + args.warmup, sending)
        before = cpu_sample(processes, db.postmaster)
        window_start = time.monotonic()
        if watching is not None:
            watching.counting = True
        profiler = None
        if args.py_spy is not None:
            output = args.py_spy.with_name(f"{args.py_spy.stem}-{name}{args.py_spy.suffix}")
            profiler = await start_profiler(output, service.pid, args.seconds)
        await _sleep_until(start + args.warmup + args.seconds, sending)
        after = cpu_sample(processes, db.postmaster)
        window_end = time.monotonic()
        await finish_profiler(profiler)
        if watching is not None:
            watching.counting = False
        await sending
        expect: dict[str, int] = {}
        for sent in stats.sent:
            lane = lanes[sent.lane]
            expect[lane] = max(expect.get(lane, 0), sent.revision)
        behind: list[str] = []
        if watching is not None:
            behind = await watching.reach(expect, DRAIN_SECONDS)
            if watching.error is not None:
                behind.append(f"the WatchLanes stream failed: {watching.error}")
        elif fleet is not None:
            result = await fleet.finish(expect, DRAIN_SECONDS)
            behind = [w.lane_id for w in result.behind] + result.errors
    commits = sum(1 for s in stats.sent if window_start <= s.returned_mono <= window_end)
    return Phase(
        name=name,
        commits=commits,
        seconds=window_end - window_start,
        cpu=cpu_use(before, after),
        errors=sum(stats.errors.values()),
        behind=behind,
        messages=watching.messages if watching is not None else 0,
        entries=watching.entries if watching is not None else 0,
    )


def report(args: argparse.Namespace, db: Database, phases: dict[str, Phase]) -> tuple[str, bool]:
    none = phases["none"]
    labels = {
        "none": "no watcher",
        "lanes": "1 WatchLanes stream, all lanes",
        "lane": f"{args.lanes:,} WatchLane streams, 1 per lane",
    }
    lines = [
        f"lane list: {args.lanes:,} lanes, {args.rate:g} commits/s offered (SetLaneValue),"
        f" {args.seconds:g} s window; PostgreSQL {db.version} ({db.description})",
        "",
        f"  {'':<36} {'commits/s':>10} {'server CPU/commit':>18} {'÷ none':>8}"
        f" {'PostgreSQL/commit':>18}",
    ]
    ok = True
    for name, phase in phases.items():
        rate = phase.commits / phase.seconds
        postgres = phase.cpu.processes.get("PostgreSQL")
        pg = f"{postgres / rate * 1e6:,.0f} µs" if postgres is not None and rate else "-"
        lines.append(
            f"  {labels[name]:<36} {rate:>10,.0f} {phase.server_per_commit * 1e6:>15,.0f} µs"
            f" {phase.server_per_commit / none.server_per_commit:>8.2f} {pg:>18}"
        )
    lines.append("")
    for phase in phases.values():
        lines.append(f"  {phase.name}: {phase.cpu.describe()}")
        if phase.name == "lanes":
            lines.append(
                f"  lanes: the WatchLanes stream received {phase.messages:,} messages"
                f" ({phase.messages / phase.seconds:,.0f}/s) carrying {phase.entries:,} lane"
                f" summaries for {phase.commits:,} commits in the window"
            )
        if phase.errors or phase.behind:
            ok = False
            lines.append(
                f"  {phase.name}: FAILED: {phase.errors} commit errors; behind: {phase.behind[:5]}"
            )
    lines.append(f"  checks: {'OK' if ok else 'FAILED'} (every watcher reached every commit)")
    return "\n".join(lines), ok


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lane_list",
        description="Server CPU per commit: one WatchLanes stream vs a WatchLane per lane vs none.",
    )
    parser.add_argument("--lanes", type=int, default=1000, help="lanes (1000)")
    parser.add_argument("--rate", type=float, default=500.0, help="commits/s offered (500)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window (10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="load before the window (2)")
    parser.add_argument("--senders", type=int, default=32, help="concurrent commits at most (32)")
    add_database_url(parser)
    add_server_options(parser)
    args = parser.parse_args(argv)
    if args.lanes < 1 or args.senders < 1 or args.rate <= 0 or args.seconds <= 0:
        parser.error("--lanes, --senders, --rate and --seconds must be positive")
    return args


async def run(args: argparse.Namespace) -> int:
    async with provision_database(args.database_url) as db:
        print(f"PostgreSQL {db.version} ready ({db.description})", flush=True)
        phases = {name: await run_phase(db, args, name) for name in PHASES}
        text, ok = report(args, db, phases)
        print()
        print(text)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
