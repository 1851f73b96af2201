"""Attach storms: many WatchLane streams opened at once, as after a restart or a network blip.

Run from the repository root (virtualenv active)::

    python -m bench.attach_storm [--bursts 1000,2000,4000,8000,12000] [--lanes 50] [--channels 20]

One service process (``python -m lane.server.app`` on an embedded PostgreSQL in a temp dir, or
``--database-url``) with its default watcher limits (``--max-watchers`` to change the
process's; the lanes hold the per-lane limit far off). For each burst
size B, this process opens B WatchLane streams in one go, spread over ``--lanes`` lanes and
``--channels`` channels (each its own TCP connection, like B clients behind a few proxies),
waits until each has its snapshot or has ended, and sorts the outcomes:

- **admitted**: the snapshot arrived;
- **refused**: ended with a status carrying a ``google.rpc.ErrorInfo`` reason (the service
  turned it away and said why, e.g. ``WATCHERS_ATTACHING`` with a ``RetryInfo`` delay);
- **reset**: ended with no ErrorInfo (CANCELLED, UNAVAILABLE, DEADLINE_EXCEEDED... from the
  transport, before or outside the handler): what a storm must not produce.

The baseline in the same run is the smallest burst (``--bursts``' first), which nothing
should refuse. The report prints, per burst, the counts, the time to the last snapshot, and
the retry delays the refusals asked for; the largest burst with no reset is the figure
docs/deploying.md quotes. The streams of one burst are cancelled before the next starts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from bench.commit_throughput import provision_database, run_service
from bench.entry import add_database_url, open_channels, run_benchmark

#: How long one stream may take to get its snapshot before it counts as reset.
STREAM_DEADLINE_SECONDS = 60.0


@dataclass
class Burst:
    """The outcomes of one burst of ``size`` streams."""

    size: int
    admitted: int = 0
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    reset: collections.Counter[str] = field(default_factory=collections.Counter)
    retry_delays: list[float] = field(default_factory=list)
    seconds_to_last_snapshot: float = 0.0


def _error_details(error: grpc.aio.AioRpcError) -> tuple[str, float | None]:
    """The ErrorInfo reason ('' when none) and the RetryInfo delay (None when none)."""
    reason, delay = "", None
    status = rpc_status.from_call(error)
    for detail in status.details if status else ():
        info = error_details_pb2.ErrorInfo()
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            reason = info.reason
        elif detail.Unpack(retry):
            delay = retry.retry_delay.ToTimedelta().total_seconds()
    return reason, delay


async def _attach(
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub, lane_id: str, burst: Burst, started: float
) -> Any:
    """One stream: the call once its snapshot arrived (to cancel later), else None."""
    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id), timeout=STREAM_DEADLINE_SECONDS)
    try:
        response = await call.read()
    except grpc.aio.AioRpcError as error:
        reason, delay = _error_details(error)
        if reason:
            burst.refused[f"{error.code().name} {reason}"] += 1
            if delay is not None:
                burst.retry_delays.append(delay)
        else:
            burst.reset[f"{error.code().name}: {error.details()}"[:100]] += 1
        return None
    if not isinstance(response, pb.WatchLaneResponse) or response.WhichOneof("item") != "snapshot":
        burst.reset["no snapshot first"] += 1
        return None
    burst.admitted += 1
    burst.seconds_to_last_snapshot = max(burst.seconds_to_last_snapshot, time.monotonic() - started)
    return call


async def run_burst(
    stubs: Sequence[lane_service_pb2_grpc.LaneServiceAsyncStub], lanes: Sequence[str], size: int
) -> Burst:
    """Open ``size`` streams at once; cancel them once every outcome is in."""
    burst = Burst(size)
    started = time.monotonic()
    calls = await asyncio.gather(
        *(
            _attach(stubs[i % len(stubs)], lanes[i % len(lanes)], burst, started)
            for i in range(size)
        )
    )
    for call in calls:
        if call is not None:
            call.cancel()
    return burst


def report(bursts: Sequence[Burst]) -> str:
    lines = [
        f"{'burst':>6} {'admitted':>9} {'refused':>8} {'reset':>6} {'last snapshot':>14}"
        f"  retry delays asked",
    ]
    for burst in bursts:
        delays = (
            f"{min(burst.retry_delays):.2f}-{max(burst.retry_delays):.2f} s"
            if burst.retry_delays
            else "-"
        )
        lines.append(
            f"{burst.size:>6} {burst.admitted:>9} {sum(burst.refused.values()):>8}"
            f" {sum(burst.reset.values()):>6} {burst.seconds_to_last_snapshot:>12.2f} s  {delays}"
        )
        for outcome, count in (burst.refused + burst.reset).most_common(4):
            lines.append(f"{'':>8}{count:>6} x {outcome}")
    clean = [burst.size for burst in bursts if not burst.reset]
    lines.append(
        "largest burst with no transport reset: "
        + (str(max(clean)) if clean else "none (even the baseline burst was reset)")
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.attach_storm", description=__doc__)
    parser.add_argument(
        "--bursts", default="1000,2000,4000,8000,12000", help="burst sizes, in order"
    )
    parser.add_argument("--lanes", type=int, default=50, help="lanes the streams spread over")
    parser.add_argument("--channels", type=int, default=20, help="client TCP connections")
    parser.add_argument(
        "--max-watchers",
        type=int,
        default=None,
        help="LANE_MAX_WATCHERS of the service (default: its own default, 10,000)",
    )
    add_database_url(parser)
    args = parser.parse_args(argv)
    args.burst_sizes = [int(size) for size in args.bursts.split(",")]
    return args


async def run(args: argparse.Namespace) -> int:
    limits = {} if args.max_watchers is None else {"LANE_MAX_WATCHERS": str(args.max_watchers)}
    async with (
        provision_database(args.database_url) as db,
        run_service(db.url, notify=True, extra_env=limits) as service,
        open_channels(service.address, args.channels) as channels,
    ):
        stubs = [lane_service_pb2_grpc.LaneServiceStub(channel) for channel in channels]
        lanes = [f"storm-{uuid.uuid4().hex[:8]}-{i}" for i in range(args.lanes)]
        for lane_id in lanes:
            await stubs[0].CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        bursts = []
        for size in args.burst_sizes:
            bursts.append(await run_burst(stubs, lanes, size))
            await asyncio.sleep(2)  # let the service see the cancels
        print(report(bursts))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
