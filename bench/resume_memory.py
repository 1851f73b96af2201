"""Resumed watchers that never read: the service memory each one holds.

Run from the repository root (virtualenv active)::

    python -m bench.resume_memory [--events 600] [--event-kib 450] [--streams 3]

One service process (``python -m lane.server.app`` on an embedded PostgreSQL in a temp dir, or
``--database-url``). This process fills one lane with ``--events`` progress events of
``--event-kib`` KiB each (UpdateToolCall partial results of one running call) and leaves a
second lane empty. Then, for each lane in turn, it opens ``--streams`` WatchLane streams
resuming after revision 0 and never reads them: the service reads the log for each, writes
until HTTP/2 flow control stops it (the client's window and both sockets' buffers are full),
and holds what it read but could not send yet. After ``--settle`` seconds the service's
resident memory (VmRSS) is read, and its peak (VmHWM) over the window; the streams are
cancelled before the next phase.

- **Baseline (same run):** the empty lane: what gRPC and the service hold per stream with
  nothing to send.
- **Large events:** the figure is the growth over the baseline phase, per stream, beside the
  stream's byte budget (``LANE_WATCH_STREAM_BYTES``, 8 MiB by default): a stream that does not
  read must hold no more than its budget, whatever its lane holds.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from bench.commit_throughput import provision_database, run_service
from bench.entry import add_database_url, open_channels, run_benchmark
from bench.memory import hwm_kib, reset_peak, rss_kib

DEFAULT_STREAM_MIB = 8


@dataclass
class Phase:
    """The service's memory with ``streams`` non-reading resumed streams of one lane."""

    label: str
    rss_before_kib: int
    rss_after_kib: int
    peak_kib: int


async def _fill(stub: lane_service_pb2_grpc.LaneServiceAsyncStub, events: int, kib: int) -> str:
    """A lane whose log holds ``events`` progress events of ``kib`` KiB; returns its id."""
    lane = await LaneScript.create(stub, prefix="resume")
    run = await lane.start_run("go")
    await run.turn(tool_calls=[("big", "big", {})])
    call = await run.call("big").start()
    text = "x" * (kib * 1024)
    for _ in range(events):
        await call.progress(text)
    return lane.lane_id


async def _phase(
    label: str,
    pid: int,
    stubs: Sequence[lane_service_pb2_grpc.LaneServiceAsyncStub],
    lane_id: str,
    settle: float,
) -> Phase:
    before = rss_kib(pid)
    reset_peak(pid)
    calls = [
        stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id, after_revision=0)) for stub in stubs
    ]
    try:
        # Never read: the calls only exist. The service reads and writes until blocked.
        await asyncio.sleep(settle)
        return Phase(label, before, rss_kib(pid), hwm_kib(pid))
    finally:
        for call in calls:
            call.cancel()
        await asyncio.sleep(1)


def report(phases: Sequence[Phase], streams: int, budget_mib: float) -> str:
    base = phases[0]
    lines = [f"{'phase':<28} {'RSS before':>11} {'RSS after':>10} {'peak':>8} {'per stream':>11}"]
    for phase in phases:
        growth = phase.rss_after_kib - phase.rss_before_kib
        lines.append(
            f"{phase.label:<28} {phase.rss_before_kib / 1024:>9.1f} M"
            f" {phase.rss_after_kib / 1024:>8.1f} M {phase.peak_kib / 1024:>6.1f} M"
            f" {growth / 1024 / streams:>9.2f} M"
        )
    large = phases[-1]
    over_base = (large.rss_after_kib - large.rss_before_kib) - (
        base.rss_after_kib - base.rss_before_kib
    )
    peak = (large.peak_kib - large.rss_before_kib) / 1024 / streams
    lines.append(
        f"growth per non-reading stream on large events, over the baseline: "
        f"{over_base / 1024 / streams:.2f} MiB (peak {peak:.2f} MiB) — budget {budget_mib:g} MiB"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.resume_memory", description=__doc__)
    parser.add_argument("--events", type=int, default=600, help="events in the large lane")
    parser.add_argument("--event-kib", type=int, default=450, help="KiB per event")
    parser.add_argument("--streams", type=int, default=3, help="non-reading streams per phase")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before reading RSS")
    parser.add_argument(
        "--stream-mib", type=float, default=DEFAULT_STREAM_MIB, help="LANE_WATCH_STREAM_BYTES, MiB"
    )
    add_database_url(parser)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    budget = {"LANE_WATCH_STREAM_BYTES": str(int(args.stream_mib * 1024 * 1024))}
    async with (
        provision_database(args.database_url) as db,
        run_service(db.url, notify=True, extra_env=budget) as service,
        open_channels(service.address, args.streams) as channels,
    ):
        stubs = [lane_service_pb2_grpc.LaneServiceStub(channel) for channel in channels]
        print(f"filling a lane with {args.events} events of {args.event_kib} KiB ...", flush=True)
        large = await _fill(stubs[0], args.events, args.event_kib)
        empty = f"resume-empty-{uuid.uuid4().hex[:8]}"
        await stubs[0].CreateLane(pb.CreateLaneRequest(lane_id=empty))
        pid = service.pid
        phases = [
            await _phase("baseline: empty lane", pid, stubs, empty, args.settle),
            await _phase(
                f"{args.events} x {args.event_kib} KiB events", pid, stubs, large, args.settle
            ),
        ]
        print(report(phases, args.streams, args.stream_mib))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
