"""Load mix: many drivers and watchers at once against one service; command latency, and the
check that nothing acknowledged was lost.

Run from the repository root (virtualenv active)::

    python -m bench.load_mix [--drivers 200] [--watchers 500] [--seconds 20] [--workers K]

One service subprocess (``python -m lane.server.app``, ``LANE_WORKERS=K``: with K > 1 a supervisor
and K workers on one port) on a scratch database. Then, in order:

1. **Baseline: the no-database floor.** As many callers as there are drivers call
   ``grpc.health.v1.Health/Check`` in a loop for ``--health-seconds``: RPCs/s and latency of
   calls that touch no database, on the same channels the drivers use.
2. **Lanes and watchers.** Every driver's lane is created, then ``--watchers`` WatchLane streams
   are attached, spread evenly over those lanes, in a process of their own
   (:mod:`bench.watchers`: it checks that every event group continues exactly from the last
   revision, and times delivery).
3. **Load.** ``--drivers`` drivers (``grpc.aio`` tasks in this process, over ``--channels``
   channels), each on its own lane, walk the same lifecycle as ``bench.commit_throughput``'s
   drivers (StartRun; turns of StartTurn, SettleAssistantMessage with tool calls,
   StartToolCall, UpdateToolCall x 2, StageToolOutcome per call; EndRun) with unary RPCs, every
   command with a request id. A command refused with UNAVAILABLE, RESOURCE_EXHAUSTED or
   DEADLINE_EXCEEDED is sent again, the same request with the same request id, with capped
   exponential backoff, for at most ``--give-up-seconds``; the retries and every error code
   seen are counted. A command's latency runs from its first attempt to its acknowledgement
   (retries included). With ``--sessions`` each driver sends its commands over one DriveLane
   stream of its own (``LaneSession``, the Python SDK's default) instead, and nothing refused
   is sent again; with ``--batched`` the drivers share one session per channel (as an agent
   process driving many lanes would), so the commands they issue in one event-loop turn go
   in one message. After ``--warmup`` seconds the window of ``--seconds`` is measured; then the
   drivers finish their turn and stop.
4. **Nothing acknowledged lost.** For every lane, the revision the last acknowledged command
   returned must be <= the lane's revision in ``GetLaneSnapshot`` (a lane ahead of its driver
   is only possible after a command that was never acknowledged), and every watcher must reach
   its lane's final (snapshot) revision without a gap.

It prints acknowledged commands/s, p50/p90/p99/max command latency per RPC and overall, the
floor beside them, retries and error codes, CPU per command, and the target line (p99 command
latency <= 250 ms, nothing acknowledged lost). It never asserts timing. Exit status: 1 when
something acknowledged was lost (or a watcher failed, or a driver hit an error that is not
retried), 130 when interrupted, else 0.
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

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.errors import lane_error
from lane.client.session import LaneSession
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from bench.commit_throughput import (
    RPC_TIMEOUT_SECONDS,
    CpuUse,
    Database,
    Driver,
    Retries,
    ServiceProcess,
    Stats,
    connections_per_worker,
    cpu_sample,
    cpu_use,
    describe_service,
    provision_database,
    run_service,
    watcher_limits,
)
from bench.entry import add_database_url, add_run_shape, open_channels, run_benchmark
from bench.watchers import FleetResult, percentiles, start_fleet

#: The target: p99 command latency at most this, nothing acknowledged lost.
TARGET_P99_SECONDS = 0.250


@dataclass(frozen=True)
class Floor:
    """Health/Check in a loop: the no-database floor."""

    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


async def health_floor(channels: Sequence[grpc.aio.Channel], callers: int, seconds: float) -> Floor:
    """``callers`` loops of Health/Check (caller i on channel i) for ``seconds``."""
    stubs = [health_pb2_grpc.HealthStub(channel) for channel in channels]
    request = health_pb2.HealthCheckRequest(service="")
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def caller(stub: health_pb2_grpc.HealthStub) -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await stub.Check(request, timeout=RPC_TIMEOUT_SECONDS)
            latencies.append(time.perf_counter() - started)

    started = time.monotonic()
    await asyncio.gather(*(caller(stubs[i % len(stubs)]) for i in range(callers)))
    return Floor(time.monotonic() - started, latencies)


@dataclass(frozen=True)
class LaneCheck:
    lane_id: str
    acknowledged: int
    snapshot: int


@dataclass(frozen=True)
class MixResult:
    floor: Floor
    seconds: float
    commands: int
    commits: int
    tool_calls: int
    latencies: dict[str, list[float]]
    retries: Retries
    driver_errors: list[str]
    lanes: list[LaneCheck]
    fleet: FleetResult
    fleet_ready_seconds: float
    cpu: CpuUse
    connections: list[int]

    @property
    def lost(self) -> list[LaneCheck]:
        """Lanes whose snapshot is behind an acknowledged command."""
        return [lane for lane in self.lanes if lane.snapshot < lane.acknowledged]

    @property
    def watchers_ok(self) -> bool:
        return not self.fleet.errors and not self.fleet.behind

    @property
    def all_latencies(self) -> list[float]:
        return [value for values in self.latencies.values() for value in values]


async def run_mix(args: argparse.Namespace, db: Database, service: ServiceProcess) -> MixResult:
    stats = Stats()
    stop = asyncio.Event()
    retries = Retries(give_up_seconds=args.give_up_seconds)
    processes = {"drivers": os.getpid()}
    trees = {"server": service.pid}
    async with (
        open_channels(service.address, args.channels) as channels,
        contextlib.AsyncExitStack() as watching,
    ):
        print(f"floor: {args.drivers} callers of Health/Check ...", flush=True)
        floor = await health_floor(channels, args.drivers, args.health_seconds)
        stubs = [lane_service_pb2_grpc.LaneServiceStub(channel) for channel in channels]
        shared = [LaneSession(stub, request_ids=True) for stub in stubs] if args.batched else []
        for session in shared:
            watching.push_async_callback(session.aclose)
        drivers = [
            Driver(
                stub=stubs[i % len(stubs)],
                lane_id=f"mix-{uuid.uuid4().hex[:12]}",
                stats=stats,
                stop=stop,
                calls_per_turn=args.calls,
                turns_per_run=args.turns,
                request_ids=True,
                retries=retries,
                session=(
                    shared[i % len(shared)]
                    if shared
                    else LaneSession(stubs[i % len(stubs)], request_ids=True)
                    if args.sessions
                    else None
                ),
            )
            for i in range(args.drivers)
        ]
        for driver in drivers if not shared else ():
            if driver.session is not None:
                watching.push_async_callback(driver.session.aclose)
        print(f"creating {len(drivers)} lanes ...", flush=True)
        creating = asyncio.Semaphore(16)

        async def create(driver: Driver) -> None:
            async with creating:
                request = pb.CreateLaneRequest(
                    lane_id=driver.lane_id, request_id=f"{driver.lane_id}-create"
                )
                await retries.call(driver.stub.CreateLane, request)

        await asyncio.gather(*(create(d) for d in drivers))
        print(f"attaching {args.watchers:,} watchers ...", flush=True)
        fleet = await watching.enter_async_context(
            start_fleet(
                service.address,
                [drivers[i % len(drivers)].lane_id for i in range(args.watchers)],
                channels=args.watcher_channels,
                records=False,
            )
        )
        print(f"{args.watchers:,} watchers attached in {fleet.ready_seconds:.1f} s", flush=True)
        processes["watchers"] = fleet.pid
        errors: list[str] = []

        async def drive(driver: Driver) -> None:
            # A driver that fails stops; the others go on, and the error is reported.
            try:
                await driver.run()
            except grpc.aio.AioRpcError as err:
                errors.append(f"{driver.lane_id}: {lane_error(err)}")
            except Exception as err:
                errors.append(f"{driver.lane_id}: {type(err).__name__}: {err}")

        print(
            f"{len(drivers)} drivers: {args.warmup:g} s warm-up, {args.seconds:g} s window ...",
            flush=True,
        )
        tasks = [asyncio.create_task(drive(d), name=d.lane_id) for d in drivers]
        try:
            await asyncio.sleep(args.warmup)
            first, t0 = stats.counters.copy(), time.monotonic()
            cpu_before = cpu_sample(processes, db.postmaster, trees)
            stats.recording = True
            await fleet.window_start()
            await asyncio.sleep(args.seconds)
            last, t1 = stats.counters.copy(), time.monotonic()
            cpu_after = cpu_sample(processes, db.postmaster, trees)
            stats.recording = False
            await fleet.window_end()
            connections = connections_per_worker(service)
            stop.set()
            print("window over; the drivers finish their turn ...", flush=True)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        lanes = []
        for driver in drivers:
            response = await retries.call(
                driver.stub.GetLaneSnapshot, pb.GetLaneSnapshotRequest(lane_id=driver.lane_id)
            )
            lanes.append(LaneCheck(driver.lane_id, driver.revision, response.snapshot.revision))
        print("waiting for every watcher to reach its lane's final revision ...", flush=True)
        watched = await fleet.finish(
            {lane.lane_id: lane.snapshot for lane in lanes}, args.drain_seconds
        )
    return MixResult(
        floor=floor,
        seconds=t1 - t0,
        commands=last.rpcs - first.rpcs,
        commits=last.commits - first.commits,
        tool_calls=last.tool_calls - first.tool_calls,
        latencies=stats.latencies,
        retries=retries,
        driver_errors=errors,
        lanes=lanes,
        fleet=watched,
        fleet_ready_seconds=fleet.ready_seconds,
        cpu=cpu_use(cpu_before, cpu_after),
        connections=connections,
    )


# -- report -----------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value * 1e3:,.1f}"


def _latency_row(label: str, values: Sequence[float]) -> str:
    p = percentiles(values)
    if not p["count"]:
        return f"    {label:<28} {0:>9,}"
    return (
        f"    {label:<28} {p['count']:>9,} {_ms(p['p50']):>8} {_ms(p['p90']):>8}"
        f" {_ms(p['p99']):>8} {_ms(p['max']):>9}"
    )


def report(
    args: argparse.Namespace, db: Database, service: ServiceProcess, result: MixResult
) -> str:
    overall = percentiles(result.all_latencies)
    p99 = overall["p99"]
    latency_met = "met" if overall["count"] and p99 <= TARGET_P99_SECONDS else "NOT met"
    lost = result.lost
    fleet = result.fleet
    nothing_lost = not lost and result.watchers_ok
    ahead = [lane for lane in result.lanes if lane.snapshot > lane.acknowledged]
    floor = percentiles(result.floor.latencies)
    rate = result.commands / result.seconds
    width = 52
    rows = [
        ("acknowledged commands/s", f"{rate:,.0f}", f"{result.floor.rate:,.0f}"),
        ("latency p50 (ms)", _ms(overall["p50"]), _ms(floor["p50"])),
        ("latency p90 (ms)", _ms(overall["p90"]), _ms(floor["p90"])),
        ("latency p99 (ms)", _ms(p99), _ms(floor["p99"])),
        ("latency max (ms)", _ms(overall["max"]), _ms(floor["max"])),
    ]
    codes = ", ".join(f"{code} x {n:,}" for code, n in result.retries.codes.most_common())
    per_command = (
        ", ".join(
            f"{name} {cores / rate * 1e6:,.0f} µs"
            for name, cores in result.cpu.processes.items()
            if rate > 0
        )
        or "-"
    )
    transport = (
        f"sharing one DriveLane session per channel ({args.channels})"
        if args.batched
        else "each over a DriveLane session"
        if args.sessions
        else "unary RPCs, retries"
    )
    lines = [
        f"load mix: {args.drivers} drivers (one lane each, request ids, {transport}) and"
        f" {args.watchers:,} watchers on their lanes; window {result.seconds:.1f} s after"
        f" {args.warmup:g} s warm-up; {args.turns} turns x {args.calls} tool calls per run;"
        f" NOTIFY {args.notify}; drivers on {args.channels} channels",
        f"PostgreSQL {db.version} ({db.description}); fsync={db.fsync},"
        f" synchronous_commit={db.synchronous_commit}; {os.cpu_count()} CPUs;"
        f" {describe_service(service)}",
        "",
        f"  {'':<{width}} {'commands':>12} {'Health/Check':>14}",
        *(f"  {label:<{width}} {a:>12} {b:>14}" for label, a, b in rows),
        f"  {f'target: p99 command latency <= {TARGET_P99_SECONDS * 1e3:.0f} ms':<{width}}"
        f" {latency_met:>12}",
        f"  {'target: nothing acknowledged lost':<{width}} {'OK' if nothing_lost else 'LOST':>12}",
        "",
        f"commands in the window: {result.commands:,} acknowledged ({result.commits:,} commits,"
        f" {result.tool_calls:,} tool calls, {result.commits / result.seconds:,.0f} commits/s);"
        f" floor: {len(result.floor.latencies):,} Health/Check in"
        f" {result.floor.seconds:.1f} s by {args.drivers} callers, service idle",
        f"retries: {result.retries.count:,} over the whole run; error codes seen:"
        f" {codes or 'none'}",
        f"drivers failed: {len(result.driver_errors)}",
        *(f"    {error}" for error in result.driver_errors[:10]),
        f"  {result.cpu.describe()}",
        f"  CPU per acknowledged command: {per_command}",
    ]
    if service.workers > 1:
        spread = ", ".join(str(n) for n in result.connections)
        lines.append(f"  client connections per worker at the window's end: {spread}")
    lines += [
        "",
        "  command latency in the window (ms),",
        "  first attempt to acknowledgement:   count      p50      p90      p99       max",
        *(_latency_row(method, values) for method, values in sorted(result.latencies.items())),
        _latency_row("all commands", result.all_latencies),
        _latency_row("floor: Health/Check", result.floor.latencies),
        "",
        f"nothing acknowledged lost: {len(result.lanes)} lanes; the last acknowledged revision"
        f" <= the snapshot revision on {len(result.lanes) - len(lost)} of them: "
        + ("OK" if not lost else "LOST"),
        *(
            f"    {lane.lane_id}: snapshot revision {lane.snapshot}, acknowledged"
            f" {lane.acknowledged}"
            for lane in lost[:10]
        ),
        f"  lanes ahead of their driver's last acknowledgement (a command that failed): "
        f"{len(ahead)}",
        f"  watchers: {len(fleet.watchers) - len(fleet.behind) - len(fleet.errors):,} of"
        f" {len(fleet.watchers):,} reached their lane's final revision, gap-free"
        f" ({fleet.drain_seconds:.1f} s after the drivers stopped; attached in"
        f" {result.fleet_ready_seconds:.1f} s); {len(fleet.errors)} failed: "
        + ("OK" if result.watchers_ok else "FAILED"),
        *(f"    {error}" for error in fleet.errors[:10]),
        *(
            f"    {w.lane_id}: at revision {w.revision}, expected {w.expect}"
            for w in fleet.behind[:10]
        ),
        "  fold = capture: not checked (bench/watchers.py follows revisions; it does not fold)",
        "  delivery in the window, commit_time -> receive (ms): "
        + (
            f"p50 {_ms(fleet.latency['p50'])}, p90 {_ms(fleet.latency['p90'])},"
            f" p99 {_ms(fleet.latency['p99'])}, max {_ms(fleet.latency['max'])}"
            f" ({fleet.window_groups:,} groups)"
            if fleet.latency["count"]
            else "nothing was received"
        ),
    ]
    return "\n".join(lines)


# -- entry point ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load_mix",
        description="Many drivers and watchers against one service: command latency, and"
        " nothing acknowledged lost.",
    )
    parser.add_argument("--drivers", type=int, default=200, help="drivers, one lane each")
    parser.add_argument(
        "--watchers", type=int, default=500, help="WatchLane streams over the drivers' lanes"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=2.0, help="load before the window")
    parser.add_argument(
        "--workers", type=int, default=1, metavar="K", help="server processes (LANE_WORKERS)"
    )
    parser.add_argument(
        "--channels",
        type=int,
        default=8,
        help="channels (TCP connections) the drivers are spread over (default 8)",
    )
    parser.add_argument(
        "--watcher-channels", type=int, default=8, help="channels the watchers are spread over"
    )
    parser.add_argument(
        "--health-seconds",
        type=float,
        default=3.0,
        help="how long the Health/Check floor runs (default 3)",
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="each driver sends its commands over one DriveLane session (LaneSession, as the"
        " Python SDK does by default) instead of one unary RPC per command; a refused command"
        " is not sent again",
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="the drivers share one DriveLane session per channel (--channels), each lane's"
        " lifecycle a task: commands issued in one event-loop turn go in one message",
    )
    add_run_shape(parser)
    parser.add_argument(
        "--notify", choices=("on", "off"), default="on", help="the service's LANE_NOTIFY"
    )
    parser.add_argument(
        "--give-up-seconds",
        type=float,
        default=30.0,
        help="how long a command is retried before its driver fails (default 30)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=120.0,
        help="how long the watchers may take to catch up after the drivers stop (default 120)",
    )
    add_database_url(parser)
    args = parser.parse_args(argv)
    args.sessions = args.sessions or args.batched
    if min(args.drivers, args.calls, args.turns, args.workers, args.channels) < 1:
        parser.error("--drivers, --calls, --turns, --workers and --channels must be >= 1")
    if args.watchers < 1 or args.watcher_channels < 1:
        parser.error("--watchers and --watcher-channels must be >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.health_seconds <= 0:
        parser.error("--seconds and --health-seconds must be > 0, --warmup >= 0")
    return args


async def run(args: argparse.Namespace) -> int:
    async with provision_database(args.database_url) as db:
        print(f"PostgreSQL {db.version} ready ({db.description}); service ...", flush=True)
        async with run_service(
            db.url,
            args.notify == "on",
            watcher_limits(args.watchers, args.drivers),
            workers=args.workers,
        ) as service:
            result = await run_mix(args, db, service)
            print("stopping the service ...", flush=True)
    print()
    print(report(args, db, service, result))
    failed = bool(result.lost) or not result.watchers_ok or bool(result.driver_errors)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
