"""Idle watchers: resident memory per idle WatchLane stream of one service process.

Run from the repository root (virtualenv active)::

    python -m bench.idle_watchers [--watchers 10000] [--lanes 1000] [--database-url URL]

docs/contract.md: "Idle watchers: >= 10,000 per process, <= 20 KiB of resident memory each". One
run measures, one after the other on the same machine:

1. **Baseline: gRPC's own cost.** A minimal ``grpc.aio`` server runs as a subprocess of this
   module (``--minimal-server``, the service's own server options): its one server-streaming
   method writes one small message and then just awaits. This process opens the same number
   of idle streams on it over the same number of channels, checks that each received its
   message, lets them settle, and reads the server's resident memory before and after.
2. **Service.** The real service runs as a subprocess (``python -m lane.server.app``, on an
   embedded PostgreSQL in a temp dir or ``--database-url``; ``LANE_MAX_WATCHERS`` and
   ``LANE_MAX_WATCHERS_PER_LANE`` raised when the run needs more than the defaults). This
   process creates ``--lanes`` lanes (empty, or with ``--prompts`` transcript entries each:
   one StartRun whose prompt places that many user messages; the run stays open), warms the
   service up (one watch and one snapshot), reads its resident memory with 0 watchers, then
   opens ``--watchers`` WatchLane streams spread evenly over the lanes and over
   ``--channels`` channels (each its own TCP connection), checks that each received its whole
   snapshot (head and any transcript chunks), lets them sit idle for ``--settle`` seconds
   (longer than the 10 s heartbeat, so every stream has gone through a heartbeat) and reads
   the memory again. The service's CPU use over the idle window is read from /proc too:
   idle streams are not free.
3. **The watchers still work.** A commit (SetLaneValue) to each of ``--verify-lanes`` lanes;
   every watcher of those lanes must receive its event group (the commit's revision), and the
   delay from the commit's start to the last watcher's receipt is printed.
4. **Detach.** Every stream is cancelled; after a short settle the memory is read again, to
   show what the process keeps after its watchers leave.

Memory is VmRSS (``/proc/PID/status``) and Pss (``/proc/PID/smaps_rollup``) of the server
process; the figure per watcher is (after - before) / watchers. Every process and directory
started here is stopped and removed on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
import psycopg
from lane.client.testing import LaneScript
from lane.v1 import events_pb2, lane_service_pb2_grpc
from lane.v1 import lane_service_pb2 as pb

from bench.commit_throughput import (
    REPO_ROOT,
    CpuUse,
    Database,
    cpu_sample,
    cpu_use,
    provision_database,
    run_service,
)
from bench.entry import add_database_url, open_channels, run_benchmark, stop_process
from bench.memory import Memory

TARGET_WATCHERS = 10_000  # docs/contract.md, Targets
TARGET_KIB_PER_WATCHER = 20.0
RPC_TIMEOUT_SECONDS = 60.0
_MINIMAL_METHOD = "/bench.Idle/Watch"
_MINIMAL_READY = "minimal server listening on "


# -- the minimal gRPC server (the baseline), run as this module with --minimal-server --------


async def _serve_minimal() -> None:
    """A ``grpc.aio`` server whose one server-streaming method writes one message and then
    waits forever: the least any server holding an idle stream keeps."""
    from lane.server.app.server import SERVER_OPTIONS  # the service's own keepalive and limits

    async def idle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        await context.write(b"ready")
        await asyncio.Event().wait()

    handler = grpc.method_handlers_generic_handler(
        "bench.Idle", {"Watch": grpc.unary_stream_rpc_method_handler(idle)}
    )
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"{_MINIMAL_READY}127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(None)


@dataclass
class ServerProcess:
    process: asyncio.subprocess.Process
    address: str

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def run_minimal_server() -> AsyncIterator[ServerProcess]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.idle_watchers",
        "--minimal-server",
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode().strip()
        if not line.startswith(_MINIMAL_READY):
            raise RuntimeError(f"the minimal server did not start: {line!r}")
        yield ServerProcess(process, line.removeprefix(_MINIMAL_READY))
    finally:
        await stop_process(process)


# -- channels and streams ---------------------------------------------------------------------


async def _cancel_all(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Watcher:
    """One idle WatchLane stream, read by its own task."""

    lane_id: str
    snapshot_revision: int = -1
    revision: int = -1
    heartbeats: int = 0
    event_groups: int = 0
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    received_at: float = 0.0
    error: str | None = None

    async def follow(
        self, stub: lane_service_pb2_grpc.LaneServiceAsyncStub, attached: asyncio.Event
    ) -> None:
        call = stub.WatchLane(pb.WatchLaneRequest(lane_id=self.lane_id))
        try:
            first = await call.read()
            if first is grpc.aio.EOF or not isinstance(first, pb.WatchLaneResponse):
                raise RuntimeError("the stream ended before its snapshot")
            if first.WhichOneof("item") != "snapshot":
                raise RuntimeError(f"the first message is not a snapshot: {first}")
            for _ in range(first.snapshot.following_chunks):
                chunk = await call.read()
                if (
                    not isinstance(chunk, pb.WatchLaneResponse)
                    or chunk.WhichOneof("item") != "transcript_chunk"
                ):
                    raise RuntimeError("the stream ended before its last transcript chunk")
            self.snapshot_revision = self.revision = first.snapshot.snapshot.revision
            attached.set()
            while True:
                message = await call.read()
                if message is grpc.aio.EOF or not isinstance(message, pb.WatchLaneResponse):
                    raise RuntimeError("the stream ended")
                item = message.WhichOneof("item")
                if item == "heartbeat":
                    self.heartbeats += 1
                elif item == "event_group":
                    events: Sequence[events_pb2.HarnessEvent] = message.event_group.events
                    self.revision = events[-1].revision
                    self.event_groups += 1
                    self.received_at = time.monotonic()
                    self.moved.set()
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception as exc:  # recorded and reported; the bench goes on
            self.error = f"{type(exc).__name__}: {exc}"
            attached.set()


async def attach(
    channels: Sequence[grpc.aio.Channel],
    lanes: Sequence[str],
    count: int,
    concurrency: int,
    progress_every: int,
) -> tuple[list[Watcher], list[asyncio.Task[None]], float]:
    """Open ``count`` WatchLane streams, lane ``i % len(lanes)`` on channel ``i % channels``,
    at most ``concurrency`` of them waiting for their snapshot at a time."""
    stubs = [lane_service_pb2_grpc.LaneServiceStub(channel) for channel in channels]
    watchers: list[Watcher] = []
    tasks: list[asyncio.Task[None]] = []
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()

    async def one(index: int) -> None:
        attached = asyncio.Event()
        watcher = Watcher(lanes[index % len(lanes)])
        watchers.append(watcher)
        tasks.append(asyncio.create_task(watcher.follow(stubs[index % len(stubs)], attached)))
        async with asyncio.timeout(RPC_TIMEOUT_SECONDS):
            await attached.wait()

    async def gated(index: int) -> None:
        async with gate:
            await one(index)
        if (index + 1) % progress_every == 0:
            print(f"  {index + 1:,} attached, {time.monotonic() - started:.1f} s", flush=True)

    try:
        await asyncio.gather(*(gated(i) for i in range(count)))
    except BaseException:
        await _cancel_all(tasks)
        raise
    return watchers, tasks, time.monotonic() - started


async def attach_minimal(
    channels: Sequence[grpc.aio.Channel], count: int, concurrency: int
) -> tuple[list[asyncio.Task[None]], int, float]:
    """``count`` idle streams on the minimal server; returns the tasks holding them, how many
    received their first message, and the seconds it took."""
    received = 0
    gate = asyncio.Semaphore(concurrency)
    tasks: list[asyncio.Task[None]] = []
    callables: list[grpc.aio.UnaryStreamMultiCallable[bytes, bytes]] = [
        channel.unary_stream(_MINIMAL_METHOD, request_serializer=None, response_deserializer=None)
        for channel in channels
    ]

    async def hold(index: int, ready: asyncio.Event) -> None:
        nonlocal received
        call = callables[index % len(callables)](b"")
        try:
            first = await call.read()
            if first == b"ready":
                received += 1
            ready.set()
            await call.read()  # never answers: the stream stays open until cancelled
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            ready.set()

    async def gated(index: int) -> None:
        async with gate:
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(hold(index, ready)))
            async with asyncio.timeout(RPC_TIMEOUT_SECONDS):
                await ready.wait()

    started = time.monotonic()
    try:
        await asyncio.gather(*(gated(i) for i in range(count)))
    except BaseException:
        await _cancel_all(tasks)
        raise
    return tasks, received, time.monotonic() - started


# -- phases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MinimalResult:
    streams: int
    received: int
    attach_seconds: float
    before: Memory
    after: Memory
    cpu: CpuUse

    @property
    def kib_per_stream(self) -> float:
        return (self.after.rss - self.before.rss) / max(self.streams, 1)


async def run_minimal(args: argparse.Namespace) -> MinimalResult:
    async with (
        run_minimal_server() as server,
        open_channels(server.address, args.channels, ready_within=30) as channels,
    ):
        # Warm-up: one stream opened and closed, so lazily made state is not counted.
        tasks, _, _ = await attach_minimal(channels, len(channels), 1)
        await _cancel_all(tasks)
        await asyncio.sleep(args.base_settle)
        before = Memory.of(server.pid)
        print(f"minimal server: {before.rss:,} KiB with 0 streams; attaching ...", flush=True)
        tasks, received, seconds = await attach_minimal(channels, args.watchers, args.concurrency)
        try:
            sample = cpu_sample({"server": server.pid, "bench": os.getpid()})
            await asyncio.sleep(args.settle)
            cpu = cpu_use(sample, cpu_sample({"server": server.pid, "bench": os.getpid()}))
            after = Memory.of(server.pid)
        finally:
            await _cancel_all(tasks)
    return MinimalResult(args.watchers, received, seconds, before, after, cpu)


@dataclass(frozen=True)
class Delivery:
    lane_id: str
    revision: int
    watchers: int
    received: int
    seconds: float


@dataclass(frozen=True)
class ServiceResult:
    lanes: int
    watchers: int
    attached: int
    errors: list[str]
    attach_seconds: float
    base: Memory
    attached_memory: Memory
    settled: Memory
    after_delivery: Memory
    detached: Memory
    idle_cpu: CpuUse
    idle_seconds: float
    heartbeats: int
    transactions: int
    deliveries: list[Delivery]

    @property
    def kib_per_watcher(self) -> float:
        return (self.settled.rss - self.base.rss) / max(self.watchers, 1)

    @property
    def deliveries_ok(self) -> bool:
        return all(d.received == d.watchers for d in self.deliveries)


async def _transactions(url: str) -> int:
    """Committed plus rolled-back transactions of the bench database so far."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _create_lanes(
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub, count: int, prompts: int, prompt_bytes: int
) -> list[str]:
    """``count`` lanes; with ``prompts``, each gets a run (left open: unleased runs are never
    reconciled) whose prompt places that many user messages of ``prompt_bytes`` each."""
    prefix = f"idle-{uuid.uuid4().hex[:8]}"
    lanes = [f"{prefix}-{i:05d}" for i in range(count)]
    gate = asyncio.Semaphore(16)
    text = ("lorem ipsum dolor sit amet " * (prompt_bytes // 27 + 1))[:prompt_bytes]

    async def create(lane_id: str) -> None:
        async with gate:
            lane = await LaneScript.create(stub, lane_id)
            if prompts:
                await lane.start_run(*[text] * prompts)

    await asyncio.gather(*(create(lane) for lane in lanes))
    return lanes


async def _deliver(
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub,
    watchers: Sequence[Watcher],
    lane_id: str,
) -> Delivery:
    """Commit once to ``lane_id``; wait (at most 10 s) until its watchers have the revision."""
    mine = [w for w in watchers if w.lane_id == lane_id and w.error is None]
    for watcher in mine:
        watcher.moved.clear()
    started = time.monotonic()
    answer = await stub.SetLaneValue(
        pb.SetLaneValueRequest(
            lane_id=lane_id, session_name=events_pb2.SessionNameValue(name="still watched")
        ),
        timeout=RPC_TIMEOUT_SECONDS,
    )

    async def seen(watcher: Watcher) -> None:
        while watcher.revision < answer.revision:
            await watcher.moved.wait()
            watcher.moved.clear()

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            await asyncio.gather(*(seen(w) for w in mine))
    got = [w for w in mine if w.revision >= answer.revision]
    last = max((w.received_at for w in got), default=started)
    return Delivery(lane_id, answer.revision, len(mine), len(got), last - started)


async def run_service_phase(args: argparse.Namespace, db: Database) -> ServiceResult:
    per_lane = math.ceil(args.watchers / args.lanes)
    limits = {
        "LANE_MAX_WATCHERS": str(max(TARGET_WATCHERS, args.watchers)),
        "LANE_MAX_WATCHERS_PER_LANE": str(max(1000, per_lane)),
    }
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(
            run_service(db.url, notify=True, extra_env=limits)
        )
        pid = service.pid
        channels = await stack.enter_async_context(
            open_channels(service.address, args.channels, ready_within=30)
        )
        stub = lane_service_pb2_grpc.LaneServiceStub(channels[0])
        print(f"service pid {pid} on {service.address}; creating {args.lanes:,} lanes", flush=True)
        lanes = await _create_lanes(stub, args.lanes, args.prompts, args.prompt_bytes)
        # Warm-up: the code paths of a watch and a snapshot run once before the baseline.
        watchers, tasks, _ = await attach(channels, lanes[:1], len(channels), 1, 1 << 30)
        await _cancel_all(tasks)
        await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lanes[0]))
        await asyncio.sleep(args.base_settle)
        base = Memory.of(pid)
        print(f"service: {base.rss:,} KiB with 0 watchers; attaching ...", flush=True)
        watchers, tasks, attach_seconds = await attach(
            channels, lanes, args.watchers, args.concurrency, max(1, args.watchers // 10)
        )
        try:
            attached_memory = Memory.of(pid)
            processes = {"server": pid, "bench": os.getpid()}
            heartbeats_before = sum(w.heartbeats for w in watchers)
            transactions_before = await _transactions(db.url)
            sample = cpu_sample(processes, db.postmaster)
            print(f"attached in {attach_seconds:.1f} s; idle for {args.settle:g} s", flush=True)
            await asyncio.sleep(args.settle)
            after = cpu_sample(processes, db.postmaster)
            idle_seconds = after.wall - sample.wall
            idle_cpu = cpu_use(sample, after)
            heartbeats = sum(w.heartbeats for w in watchers) - heartbeats_before
            settled = Memory.of(pid)
            await asyncio.sleep(1.0)  # PostgreSQL's statistics lag
            transactions = await _transactions(db.url) - transactions_before
            step = max(1, len(lanes) // max(args.verify_lanes, 1))
            deliveries = [
                await _deliver(stub, watchers, lane) for lane in lanes[::step][: args.verify_lanes]
            ]
            after_delivery = Memory.of(pid)
        finally:
            await _cancel_all(tasks)
        errors = [w.error for w in watchers if w.error is not None]
        await asyncio.sleep(args.base_settle)
        detached = Memory.of(pid)
    return ServiceResult(
        lanes=len(lanes),
        watchers=args.watchers,
        attached=sum(1 for w in watchers if w.snapshot_revision >= 0),
        errors=errors,
        attach_seconds=attach_seconds,
        base=base,
        attached_memory=attached_memory,
        settled=settled,
        after_delivery=after_delivery,
        detached=detached,
        idle_cpu=idle_cpu,
        idle_seconds=idle_seconds,
        heartbeats=heartbeats,
        transactions=transactions,
        deliveries=deliveries,
    )


# -- report -----------------------------------------------------------------------------------


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.1f} MiB"


def _per(delta_kib: int, count: int) -> str:
    return f"{delta_kib / max(count, 1):,.2f}"


def report(
    args: argparse.Namespace, db: Database, service: ServiceResult, minimal: MinimalResult | None
) -> str:
    n = service.watchers
    per_watcher = service.kib_per_watcher
    count_met = service.attached >= TARGET_WATCHERS and not service.errors
    memory_met = per_watcher <= TARGET_KIB_PER_WATCHER
    rows: list[tuple[str, str]] = [
        ("service: watchers attached (snapshot received)", f"{service.attached:,} of {n:,}"),
        ("service: RSS with 0 watchers", _mib(service.base.rss)),
        (f"service: RSS with {n:,} idle watchers", _mib(service.settled.rss)),
        ("service: KiB per idle watcher (RSS)", f"{per_watcher:,.2f}"),
    ]
    if service.base.pss is not None and service.settled.pss is not None:
        rows.append(
            ("service: KiB per idle watcher (Pss)", _per(service.settled.pss - service.base.pss, n))
        )
    if minimal is not None:
        rows += [
            (
                "baseline: minimal grpc.aio server, streams attached",
                f"{minimal.received:,} of {minimal.streams:,}",
            ),
            ("baseline: RSS with 0 streams", _mib(minimal.before.rss)),
            (f"baseline: RSS with {minimal.streams:,} idle streams", _mib(minimal.after.rss)),
            ("baseline: KiB per idle stream (RSS)", f"{minimal.kib_per_stream:,.2f}"),
            (
                "service minus baseline: KiB per watcher",
                f"{per_watcher - minimal.kib_per_stream:,.2f}",
            ),
            ("ratio service / baseline (per stream)", f"{per_watcher / minimal.kib_per_stream:.2f}")
            if minimal.kib_per_stream > 0
            else ("ratio service / baseline (per stream)", "n/a"),
        ]
    rows += [
        (
            f"target: >= {TARGET_WATCHERS:,} watchers per process",
            "met" if count_met else "NOT met",
        ),
        (
            f"target: <= {TARGET_KIB_PER_WATCHER:g} KiB per watcher",
            "met" if memory_met else "NOT met",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    per_lane = math.ceil(n / service.lanes)
    lines = [
        f"idle watchers: {n:,} WatchLane streams on {service.lanes:,} lanes"
        f" ({per_lane} per lane), {args.channels} channels (TCP connections);"
        f" idle {args.settle:g} s; "
        + (
            f"each lane holds {args.prompts} transcript entries of {args.prompt_bytes:,}"
            " text bytes (an open run)"
            if args.prompts
            else "the lanes are empty (created only)"
        ),
        f"PostgreSQL ({db.description}); {os.cpu_count()} CPUs; service and baseline server"
        " are subprocesses; memory is the server process's VmRSS / Pss",
        "",
        f"  {'':<{width}}  value",
        *(f"  {label:<{width}}  {value:>16}" for label, value in rows),
        "",
        f"service: attached {n:,} in {service.attach_seconds:.1f} s"
        f" ({n / max(service.attach_seconds, 1e-9):,.0f}/s);"
        f" RSS right after attaching {_mib(service.attached_memory.rss)},"
        f" after {args.settle:g} s idle {_mib(service.settled.rss)},"
        f" after the deliveries {_mib(service.after_delivery.rss)},"
        f" {args.base_settle:g} s after every watcher left {_mib(service.detached.rss)}",
        f"  idle window {service.idle_seconds:.1f} s: {service.heartbeats:,} heartbeats received"
        f" ({service.heartbeats / max(service.idle_seconds, 1e-9):,.0f}/s),"
        f" {service.transactions:,} PostgreSQL transactions in the bench database"
        f" ({service.transactions / max(service.idle_seconds, 1e-9):,.0f}/s)",
        f"  {service.idle_cpu.describe()}",
    ]
    if minimal is not None:
        lines += [
            f"baseline: attached {minimal.streams:,} in {minimal.attach_seconds:.1f} s;"
            f" idle window {minimal.cpu.describe()}",
        ]
    for d in service.deliveries:
        status = "OK" if d.received == d.watchers else "MISSING"
        lines.append(
            f"  delivery: {d.lane_id} revision {d.revision}: {d.received}/{d.watchers} watchers"
            f" in {d.seconds * 1e3:,.1f} ms: {status}"
        )
    if service.errors:
        lines.append(f"  {len(service.errors):,} watchers failed; first: {service.errors[0]}")
    return "\n".join(lines)


# -- entry point ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle_watchers",
        description="Resident memory per idle WatchLane stream, beside a minimal grpc.aio"
        " server holding as many idle streams.",
    )
    parser.add_argument("--watchers", type=int, default=10_000, help="idle streams (10000)")
    parser.add_argument(
        "--lanes", type=int, help="lanes the watchers spread over (default watchers / 10)"
    )
    parser.add_argument("--channels", type=int, default=16, help="channels = connections (16)")
    parser.add_argument(
        "--prompts",
        type=int,
        default=0,
        help="transcript entries per lane: user messages placed by one StartRun (0: empty lanes)",
    )
    parser.add_argument(
        "--prompt-bytes", type=int, default=1000, help="text bytes per such message (1000)"
    )
    parser.add_argument(
        "--settle", type=float, default=15.0, help="idle seconds before the reading (15)"
    )
    parser.add_argument(
        "--base-settle", type=float, default=3.0, help="seconds before the 0-watcher reading (3)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=64, help="streams waiting for their snapshot (64)"
    )
    parser.add_argument(
        "--verify-lanes", type=int, default=5, help="lanes committed to after attaching (5)"
    )
    add_database_url(parser)
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the minimal grpc.aio server baseline"
    )
    parser.add_argument("--minimal-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.lanes is None:
        args.lanes = max(1, args.watchers // 10)
    if min(args.watchers, args.lanes, args.channels, args.concurrency) < 1:
        parser.error("--watchers, --lanes, --channels and --concurrency must be at least 1")
    if args.prompts < 0 or args.prompt_bytes < 1:
        parser.error("--prompts must be >= 0 and --prompt-bytes >= 1")
    if args.settle <= 0 or args.base_settle < 0 or args.verify_lanes < 0:
        parser.error("--settle must be > 0, --base-settle and --verify-lanes >= 0")
    return args


async def run(args: argparse.Namespace) -> int:
    minimal = None
    if not args.no_baseline:
        print(f"baseline: minimal grpc.aio server, {args.watchers:,} idle streams ...", flush=True)
        minimal = await run_minimal(args)
        print(f"baseline: {minimal.kib_per_stream:,.2f} KiB per stream", flush=True)
    async with provision_database(args.database_url) as db:
        print(f"PostgreSQL {db.version} ready ({db.description}); service ...", flush=True)
        service = await run_service_phase(args, db)
    print()
    print(report(args, db, service, minimal))
    ok = service.attached == args.watchers and not service.errors and service.deliveries_ok
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    if parse_args(argv).minimal_server:  # the baseline's server process (run_minimal_server)
        asyncio.run(_serve_minimal())
        return 0
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
