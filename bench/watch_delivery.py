"""Commit -> watcher delivery latency, beside a raw LISTEN/NOTIFY round trip in the same run.

Run from the repository root (virtualenv active)::

    python -m bench.watch_delivery [--lanes 1000 --watchers 1000 --rate 1000 --seconds 20]

docs/contract.md: "Commit -> watcher delivery: p99 <= 20 ms at 1,000 commits/s spread over 1,000
lanes with 1,000 watchers on one process". One run measures, on the same PostgreSQL:

1. **Baseline.** A raw psycopg LISTEN/NOTIFY round trip at the same rate: one connection
   (autocommit) sends ``SELECT pg_notify(channel, payload)`` on a fixed schedule, the payload
   holding a sequence number and ``time.time()`` taken just before the send; another connection,
   in its own thread, LISTENs, and the latency is its receive time minus the payload's time.
   Every notification sent must arrive. Measured before the service phase and again after it
   (``--single-baseline``: before only), because the load of a shared machine drifts.
2. **Service.** The real service runs as a **subprocess** (``python -m lane.server.app``, see
   :func:`bench.commit_throughput.run_service`), ``--lanes`` lanes are created, and
   ``--watchers`` WatchLane streams (watcher ``i`` on lane ``i mod lanes``) are attached from a
   second subprocess (:mod:`bench.watchers`), spread over ``--channels`` channels. So the
   service, the senders (this process) and the watchers each have their own CPU account and
   event loop. Then ``--senders`` concurrent tasks commit ``SetLaneValue`` (session name: one
   ``value_update`` event, nothing added to the transcript) round-robin over the lanes, commit
   ``i`` due at ``start + i / rate`` (open loop: a sender that is late sends at once and the lag
   is reported), for ``--warmup`` seconds and then a ``--seconds`` window. Nothing is sent
   after the window. The figures are of the commits sent in the window.

   Latency of a commit sent in the window = the watcher's receive time minus the event's
   ``commit_time`` (stamped by the service when it decides the command, before its writes and
   COMMIT; same host, same clock). Also shown: the commit RPC's return -> receive (negative when
   the watcher hears of the commit before the committer does) and send -> receive.

Checks: every commit the senders saw succeed must be received by every watcher of its lane
(from the watchers' own records, each group continuing exactly from the last), every watcher
must end at its lane's head (GetLaneSnapshot), and no stream may fail. A failed check sets the
exit status to 1; the timing is printed, never asserted.

The achieved commit rate (commits completed in the window / its length), the senders' schedule
lag, and the event-loop lag of the senders' and the watchers' processes (how late a 5 ms timer
fires) are printed so that a latency caused by the load generator is not blamed on the service.
CPU use of the server, senders, watchers and PostgreSQL is read from /proc over the window.

PostgreSQL is the one at ``--database-url`` (its role needs CREATEDB: a scratch database is
created and dropped), else an embedded pgserver in a temporary directory that is removed after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
import psycopg
from lane.v1 import events_pb2, lane_service_pb2_grpc
from lane.v1 import lane_service_pb2 as pb

from bench.commit_throughput import (
    CpuUse,
    Database,
    _cluster_children,
    committed_transactions,
    cpu_sample,
    cpu_use,
    finish_profiler,
    provision_database,
    run_service,
    settle_cluster,
    start_profiler,
)
from bench.entry import add_database_url, add_server_options, run_benchmark
from bench.watchers import FleetResult, percentiles, start_fleet

TARGET_P99_SECONDS = 0.020  # docs/contract.md, Targets
TARGET_RATE = 1000
TARGET_LANES = 1000
TARGET_WATCHERS = 1000
RPC_TIMEOUT_SECONDS = 30.0
NOTIFY_CHANNEL = "bench_round_trip"
_LAG_PROBE_SECONDS = 0.005


# -- baseline: LISTEN/NOTIFY ----------------------------------------------------------------------


@dataclass(frozen=True)
class NotifyBaseline:
    sent: int
    received: int
    #: Notifications sent in the window that never arrived (any at all is a failure).
    missing: int
    window_sent: int
    seconds: float
    #: send (payload time) -> receive, and send returned -> receive, seconds, in the window.
    latency: dict[str, float]
    latency_return: dict[str, float]
    #: Send: ``SELECT pg_notify`` round trip, seconds, in the window.
    send: dict[str, float]
    schedule_lag: dict[str, float]
    cpu: CpuUse

    @property
    def achieved_rate(self) -> float:
        return self.window_sent / self.seconds


def _notify_round_trips(
    url: str, rate: float, warmup: float, seconds: float
) -> tuple[list[tuple[float, float, float]], dict[int, float], int, float]:
    """Send ``rate`` NOTIFYs a second on one connection for ``warmup + seconds``, listen on
    another (its own thread). Returns (due, sent, returned) per notification, receive time by
    sequence number, the first sequence number in the window, and the window's length."""
    listener = psycopg.connect(url, autocommit=True)
    sender = psycopg.connect(url, autocommit=True)
    received: dict[int, float] = {}
    sends: list[tuple[float, float, float]] = []
    done_sending = threading.Event()
    listening = threading.Event()
    total = math.ceil((warmup + seconds) * rate)

    def listen() -> None:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        listening.set()
        drain_deadline = math.inf
        while len(received) < total and time.monotonic() < drain_deadline:
            for note in listener.notifies(timeout=0.2):
                now = time.time()
                sequence, _, sent_at = note.payload.partition(":")
                if int(sequence) >= 0:  # -1: the statement's warm-up, never counted
                    received[int(sequence)] = now - float(sent_at)
            if done_sending.is_set() and drain_deadline == math.inf:
                drain_deadline = time.monotonic() + 10.0

    thread = threading.Thread(target=listen, name="bench-listen")
    try:
        thread.start()
        listening.wait(30)
        query = "SELECT pg_notify(%s, %s)"
        sender.execute(query, (NOTIFY_CHANNEL, "-1:0"))  # prepare; never counted
        start = time.monotonic() + 0.1
        for sequence in range(total):
            due = start + sequence / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.monotonic()
            sent_at = time.time()
            sender.execute(query, (NOTIFY_CHANNEL, f"{sequence}:{sent_at!r}"))
            sends.append((began - due, sent_at, time.time()))
        done_sending.set()
        thread.join()
    finally:
        done_sending.set()
        thread.join()
        listener.close()
        sender.close()
    return sends, received, math.ceil(warmup * rate), seconds


async def run_notify_baseline(db: Database, args: argparse.Namespace) -> NotifyBaseline:
    children_before = _cluster_children(db.postmaster)
    times_before = os.times()
    sample = cpu_sample({}, db.postmaster)
    sends, latencies, first, seconds = await asyncio.to_thread(
        _notify_round_trips, db.url, args.rate, args.warmup, args.baseline_seconds
    )
    await settle_cluster(db.postmaster, children_before)
    after = cpu_sample({}, db.postmaster)
    now = os.times()
    own = (now.user - times_before.user) + (now.system - times_before.system)
    cpu = cpu_use(sample, after, {"bench (sender + listener threads)": own})
    window = range(first, len(sends))
    # ``latencies`` holds receive - payload time; receive - returned follows from it.
    return NotifyBaseline(
        sent=len(sends),
        received=len(latencies),
        missing=sum(1 for i in range(len(sends)) if i not in latencies),
        window_sent=len(window),
        seconds=seconds,
        latency=percentiles([latencies[i] for i in window if i in latencies]),
        latency_return=percentiles(
            [latencies[i] - (sends[i][2] - sends[i][1]) for i in window if i in latencies]
        ),
        send=percentiles([sends[i][2] - sends[i][1] for i in window]),
        schedule_lag=percentiles([max(0.0, sends[i][0]) for i in window]),
        cpu=cpu,
    )


# -- the service phase ------------------------------------------------------------------------


@dataclass
class Sent:
    """One commit the senders made."""

    lane: int
    due: float  # monotonic
    began: float  # time.time()
    returned: float  # time.time()
    returned_mono: float
    revision: int
    #: Sent in the window (a sender that fell behind sends commits due in the warm-up then).
    in_window: bool


@dataclass
class SendStats:
    sent: list[Sent] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    #: How late each commit of the window was sent after it was due, seconds.
    lags: list[float] = field(default_factory=list)
    #: How late this process's event loop ran a 5 ms timer in the window, seconds.
    lags_loop: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ServicePhase:
    lanes: list[str]
    watched: list[str]
    service_pid: int
    fleet_pid: int
    attach_seconds: float
    create_seconds: float
    window_start: float
    window_end: float
    sends: SendStats
    fleet: FleetResult
    cpu: CpuUse
    head_mismatches: list[str]
    #: ``pg_stat_database.xact_commit`` over the window (its statistics lag by up to ~1 s).
    postgres_transactions: int

    @property
    def window_seconds(self) -> float:
        return self.window_end - self.window_start

    @property
    def completed_in_window(self) -> int:
        return sum(
            1 for s in self.sends.sent if self.window_start <= s.returned_mono <= self.window_end
        )

    @property
    def achieved_rate(self) -> float:
        return self.completed_in_window / self.window_seconds


async def _create_lanes(
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub, lanes: Sequence[str], concurrency: int
) -> None:
    queue = list(reversed(lanes))

    async def worker() -> None:
        while queue:
            lane = queue.pop()
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane), timeout=RPC_TIMEOUT_SECONDS)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _probe_lag(lags: list[float], recording: asyncio.Event, stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(_LAG_PROBE_SECONDS)
        if recording.is_set():
            lags.append(time.perf_counter() - started - _LAG_PROBE_SECONDS)


async def _send_paced(
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub,
    lanes: Sequence[str],
    args: argparse.Namespace,
    start: float,
    stats: SendStats,
) -> None:
    """``args.senders`` tasks; commit ``i`` is due at ``start + i / rate`` on lane
    ``i mod lanes``; nothing due after the window is sent."""
    window_start = start + args.warmup
    end = window_start + args.seconds
    counter = iter(range(sys.maxsize))

    async def sender() -> None:
        while True:
            index = next(counter)
            due = start + index / args.rate
            if due >= end:
                return
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            began_mono = time.monotonic()
            if began_mono >= end:
                return
            lane = index % len(lanes)
            began = time.time()
            request = pb.SetLaneValueRequest(
                lane_id=lanes[lane], session_name=events_pb2.SessionNameValue(name=f"n{index}")
            )
            try:
                response = await stub.SetLaneValue(request, timeout=RPC_TIMEOUT_SECONDS)
            except grpc.aio.AioRpcError as exc:
                stats.errors[exc.code().name] += 1
                continue
            returned, returned_mono = time.time(), time.monotonic()
            in_window = began_mono >= window_start
            if in_window:
                stats.lags.append(max(0.0, began_mono - due))
            stats.sent.append(
                Sent(lane, due, began, returned, returned_mono, response.revision, in_window)
            )

    await asyncio.gather(*(sender() for _ in range(args.senders)))


async def run_service_phase(db: Database, args: argparse.Namespace) -> ServicePhase:
    tag = uuid.uuid4().hex[:8]
    lanes = [f"wd-{tag}-{i:05d}" for i in range(args.lanes)]
    watched = [lanes[i % len(lanes)] for i in range(args.watchers)]
    extra_env = {
        "LANE_MAX_WATCHERS": str(max(10_000, args.watchers)),
        "LANE_MAX_WATCHERS_PER_LANE": str(max(1000, math.ceil(args.watchers / args.lanes))),
    }
    async with run_service(db.url, args.notify == "on", extra_env) as service:
        print(f"service pid {service.pid} on {service.address}; creating lanes ...", flush=True)
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            began = time.monotonic()
            await _create_lanes(stub, lanes, args.senders)
            create_seconds = time.monotonic() - began
            print(
                f"{len(lanes)} lanes in {create_seconds:.1f} s; attaching watchers ...", flush=True
            )
            async with start_fleet(
                service.address, watched, channels=args.channels, records=True
            ) as fleet:
                print(
                    f"{len(watched)} watchers attached in {fleet.ready_seconds:.1f} s;"
                    f" committing at {args.rate:g}/s for {args.warmup:g} + {args.seconds:g} s ...",
                    flush=True,
                )
                stats = SendStats()
                processes = {"server": service.pid, "senders": os.getpid(), "watchers": fleet.pid}
                recording, stop = asyncio.Event(), asyncio.Event()
                probe = asyncio.create_task(_probe_lag(stats.lags_loop, recording, stop))
                start = time.monotonic() + 0.2
                sending = asyncio.create_task(_send_paced(stub, lanes, args, start, stats))
                profiler: asyncio.subprocess.Process | None = None
                try:
                    await _sleep_until(start + args.warmup, sending)
                    window_start = time.monotonic()
                    await fleet.window_start()
                    recording.set()
                    before = cpu_sample(processes, db.postmaster)
                    xacts_before = await committed_transactions(db.url)
                    if args.py_spy is not None:
                        profiler = await start_profiler(args.py_spy, service.pid, args.seconds)
                    await _sleep_until(start + args.warmup + args.seconds, sending)
                    after = cpu_sample(processes, db.postmaster)
                    window_end = time.monotonic()
                    xacts = await committed_transactions(db.url) - xacts_before
                    recording.clear()
                    await fleet.window_end()
                    await sending
                finally:
                    stop.set()
                    if not sending.done():
                        sending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await probe
                    if profiler is not None and not sending.done():
                        profiler.kill()
                    await finish_profiler(profiler)
                expect: dict[str, int] = {}
                for sent in stats.sent:
                    lane = lanes[sent.lane]
                    expect[lane] = max(expect.get(lane, 0), sent.revision)
                print(
                    f"sent {len(stats.sent):,} commits; waiting for every watcher ...", flush=True
                )
                result = await fleet.finish(expect, args.drain_seconds)
            mismatches = await _check_heads(stub, lanes, result)
    return ServicePhase(
        lanes=lanes,
        watched=watched,
        service_pid=service.pid,
        fleet_pid=fleet.pid,
        attach_seconds=fleet.ready_seconds,
        create_seconds=create_seconds,
        window_start=window_start,
        window_end=window_end,
        sends=stats,
        fleet=result,
        cpu=cpu_use(before, after),
        head_mismatches=mismatches,
        postgres_transactions=xacts,
    )


async def _sleep_until(deadline: float, sending: asyncio.Task[None]) -> None:
    """Sleep until ``deadline`` (monotonic); a sender that fails ends the run at once."""
    done, _ = await asyncio.wait({sending}, timeout=max(0.0, deadline - time.monotonic()))
    if done:
        sending.result()


async def _check_heads(
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub, lanes: Sequence[str], fleet: FleetResult
) -> list[str]:
    """Every watcher ended at its lane's head revision (nothing committed it did not see)."""
    heads: dict[str, int] = {}
    for lane in lanes:
        response = await stub.GetLaneSnapshot(
            pb.GetLaneSnapshotRequest(lane_id=lane), timeout=RPC_TIMEOUT_SECONDS
        )
        heads[lane] = response.snapshot.revision
    return [
        f"{w.lane_id}: watcher at revision {w.revision}, lane head {heads[w.lane_id]}"
        for w in fleet.watchers
        if w.error is None and w.revision != heads[w.lane_id]
    ]


# -- report -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """What the watchers' records say about the commits the senders made."""

    commit_to_receive: dict[str, float]
    return_to_receive: dict[str, float]
    send_to_receive: dict[str, float]
    rpc: dict[str, float]
    expected: int
    delivered: int
    missing: list[str]


def delivery(phase: ServicePhase) -> Delivery:
    watchers_of: dict[str, list[int]] = {}
    for index, lane in enumerate(phase.watched):
        watchers_of.setdefault(lane, []).append(index)
    received: list[dict[int, tuple[float, float]]] = []
    for watcher in phase.fleet.watchers:
        by_revision: dict[int, tuple[float, float]] = {}
        for first, count, commit_time, at in watcher.records:
            for revision in range(first, first + count):
                by_revision[revision] = (commit_time, at)
        received.append(by_revision)
    commit_lat: list[float] = []
    return_lat: list[float] = []
    send_lat: list[float] = []
    expected = delivered = 0
    missing: list[str] = []
    for sent in phase.sends.sent:
        lane = phase.lanes[sent.lane]
        for index in watchers_of.get(lane, ()):
            expected += 1
            got = received[index].get(sent.revision)
            if got is None:
                missing.append(f"{lane} revision {sent.revision} (watcher {index})")
                continue
            delivered += 1
            if sent.in_window:
                commit_time, at = got
                commit_lat.append(at - commit_time)
                return_lat.append(at - sent.returned)
                send_lat.append(at - sent.began)
    rpc = [s.returned - s.began for s in phase.sends.sent if s.in_window]
    return Delivery(
        commit_to_receive=percentiles(commit_lat),
        return_to_receive=percentiles(return_lat),
        send_to_receive=percentiles(send_lat),
        rpc=percentiles(rpc),
        expected=expected,
        delivered=delivered,
        missing=missing,
    )


def _row(label: str, stats: dict[str, float], width: int) -> str:
    if not stats["count"]:
        return f"  {label:<{width}} {0:>8}        -        -        -        -"
    values = " ".join(f"{stats[k] * 1e3:>8.2f}" for k in ("p50", "p90", "p99", "max"))
    return f"  {label:<{width}} {int(stats['count']):>8,} {values}"


def report(
    args: argparse.Namespace,
    db: Database,
    baselines: Sequence[NotifyBaseline],
    phase: ServicePhase,
    found: Delivery,
) -> tuple[str, bool]:
    """The report, and whether every check passed."""
    fleet = phase.fleet
    full_size = (
        args.rate >= TARGET_RATE and args.lanes >= TARGET_LANES and args.watchers >= TARGET_WATCHERS
    )
    rate_held = phase.achieved_rate >= 0.95 * args.rate
    p99 = found.commit_to_receive["p99"]
    if not full_size:
        verdict = "not measured (run below the target's size)"
    elif p99 <= TARGET_P99_SECONDS and rate_held:
        verdict = "met"
    elif not rate_held:
        verdict = f"NOT met (the rate reached {phase.achieved_rate:,.0f}/s, not {args.rate:g}/s)"
    else:
        verdict = "NOT met"
    checks_ok = (
        not found.missing
        and not fleet.errors
        and not fleet.behind
        and not phase.head_mismatches
        and not any(b.missing for b in baselines)
    )
    width = 46
    lines = [
        f"watch delivery: {args.lanes:,} lanes, {args.watchers:,} watchers over {args.channels}"
        f" channels, offered {args.rate:,g} commits/s (SetLaneValue: 1 event each) by"
        f" {args.senders} senders; window {phase.window_seconds:.1f} s after {args.warmup:g} s"
        f" warm-up; NOTIFY {args.notify}",
        f"PostgreSQL {db.version} ({db.description}); fsync={db.fsync},"
        f" synchronous_commit={db.synchronous_commit}; {os.cpu_count()} CPUs; service pid"
        f" {phase.service_pid}, watchers pid {phase.fleet_pid}, senders pid {os.getpid()}"
        " (three processes)",
        "",
        f"  {'latency (ms)':<{width}} {'count':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}",
        _row("service: commit_time -> watcher receive", found.commit_to_receive, width),
        _row("service: commit RPC returned -> receive", found.return_to_receive, width),
        _row("service: commit RPC sent -> receive", found.send_to_receive, width),
        _row("service: commit RPC (sent -> returned)", found.rpc, width),
    ]
    for when, b in zip(("before", "after"), baselines, strict=False):
        lines.append(_row(f"baseline ({when}): NOTIFY -> LISTEN receive", b.latency, width))
    for when, b in zip(("before", "after"), baselines, strict=False):
        lines.append(
            _row(f"baseline ({when}): NOTIFY returned -> receive", b.latency_return, width)
        )
    lines += [
        "",
        f"  rate: offered {args.rate:,g}/s; service achieved {phase.achieved_rate:,.0f} commits/s"
        f" ({phase.completed_in_window:,} completed in the window); baseline achieved "
        + " / ".join(f"{b.achieved_rate:,.0f}" for b in baselines)
        + " NOTIFYs/s",
        f"  target: p99 <= {TARGET_P99_SECONDS * 1e3:g} ms at {TARGET_RATE:,}"
        f" commits/s over {TARGET_LANES:,} lanes with {TARGET_WATCHERS:,} watchers: {verdict}"
        f" (p99 {p99 * 1e3:.1f} ms at {phase.achieved_rate:,.0f} commits/s)",
        "",
        f"service phase: {len(phase.lanes):,} lanes created in {phase.create_seconds:.1f} s,"
        f" {len(phase.watched):,} watchers attached in {phase.attach_seconds:.1f} s",
        f"  senders: {len(phase.sends.sent):,} commits, errors "
        + (", ".join(f"{k} {v}" for k, v in phase.sends.errors.items()) or "none")
        + f"; schedule lag in the window (ms) p50 {_ms(phase.sends.lags, 0.5)},"
        f" p99 {_ms(phase.sends.lags, 0.99)}, max {_ms(phase.sends.lags, 1.0)}",
        f"  watchers: {fleet.window_groups:,} groups ({fleet.window_events:,} events) received in"
        f" the window, {fleet.window_groups / max(fleet.window_seconds, 1e-9):,.0f}/s;"
        f" drained in {fleet.drain_seconds:.2f} s after the last send",
        f"  count check: {found.delivered:,} of {found.expected:,} (commit, watcher) pairs"
        " received: " + ("OK" if not found.missing else f"{len(found.missing):,} MISSING"),
        f"  streams: {len(fleet.errors)} failed, {len(fleet.behind)} behind at the end,"
        f" {len(phase.head_mismatches)} not at their lane's head",
        f"  PostgreSQL counted {phase.postgres_transactions:,} transactions in the window:"
        f" {phase.postgres_transactions / max(phase.completed_in_window, 1):.1f} per commit"
        f" (the commit, doorbells, the watchers' event-log reads, hub polls)",
        f"  {phase.cpu.describe()}",
        "  "
        + phase.cpu.per_commit(phase.achieved_rate, "server", "PostgreSQL", "senders", "watchers"),
        f"  event-loop lag (5 ms timer, ms): watchers p50 {fleet.loop_lag['p50'] * 1e3:.2f}"
        f" p99 {fleet.loop_lag['p99'] * 1e3:.2f} max {fleet.loop_lag['max'] * 1e3:.2f};"
        f" senders p50 {_ms(phase.sends.lags_loop, 0.5)} p99 {_ms(phase.sends.lags_loop, 0.99)}"
        f" max {_ms(phase.sends.lags_loop, 1.0)}",
    ]
    for problem in [*found.missing[:10], *fleet.errors[:10], *phase.head_mismatches[:10]]:
        lines.append(f"    {problem}")
    for when, b in zip(("before", "after"), baselines, strict=False):
        lines += [
            f"baseline {when} the service: {b.sent:,} NOTIFYs on one connection,"
            f" {b.received:,} received, {b.missing} missing; pg_notify round trip p50"
            f" {b.send['p50'] * 1e3:.2f} ms, p99 {b.send['p99'] * 1e3:.2f} ms; schedule lag p99"
            f" {b.schedule_lag['p99'] * 1e3:.2f} ms",
            f"  {b.cpu.describe()}",
        ]
    lines.append("checks: " + ("OK" if checks_ok else "FAILED"))
    return "\n".join(lines), checks_ok


def _ms(values: Sequence[float], fraction: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return f"{ordered[index] * 1e3:.2f}"


# -- entry point ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.watch_delivery",
        description="Commit -> watcher delivery latency beside a raw LISTEN/NOTIFY round trip.",
    )
    parser.add_argument("--lanes", type=int, default=1000, help="lanes committed to (1000)")
    parser.add_argument("--watchers", type=int, default=1000, help="WatchLane streams (1000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="commits/s offered (1000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window (20)")
    parser.add_argument("--warmup", type=float, default=2.0, help="load before the window (2)")
    parser.add_argument(
        "--senders", type=int, default=32, help="concurrent commit RPCs at most (32)"
    )
    parser.add_argument(
        "--channels", type=int, default=8, help="channels the watchers are spread over (8)"
    )
    parser.add_argument(
        "--baseline-seconds",
        type=float,
        default=None,
        help="the LISTEN/NOTIFY baseline's window (default: --seconds)",
    )
    parser.add_argument(
        "--single-baseline",
        action="store_true",
        help="measure the baseline only before the service (default: before and after)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=60.0,
        help="how long the watchers may take to receive the last commits (60)",
    )
    add_database_url(parser)
    add_server_options(parser)
    args = parser.parse_args(argv)
    if min(args.lanes, args.watchers, args.senders, args.channels) < 1:
        parser.error("--lanes, --watchers, --senders and --channels must be at least 1")
    if args.rate <= 0 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--rate and --seconds must be > 0 and --warmup >= 0")
    if args.baseline_seconds is None:
        args.baseline_seconds = args.seconds
    return args


async def run(args: argparse.Namespace) -> int:
    async with provision_database(args.database_url) as db:
        print(f"PostgreSQL {db.version} ready ({db.description}); baseline first ...", flush=True)
        baselines = [await run_notify_baseline(db, args)]
        print(f"baseline: NOTIFY p99 {baselines[0].latency['p99'] * 1e3:.2f} ms", flush=True)
        phase = await run_service_phase(db, args)
        found = delivery(phase)
        print(
            f"service: p99 {found.commit_to_receive['p99'] * 1e3:.2f} ms at"
            f" {phase.achieved_rate:,.0f} commits/s",
            flush=True,
        )
        if not args.single_baseline:
            print("baseline again ...", flush=True)
            baselines.append(await run_notify_baseline(db, args))
        text, ok = report(args, db, baselines, phase, found)
        print()
        print(text)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
