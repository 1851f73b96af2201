"""kill -9 at random points, then check that nothing was lost, doubled or unsafely replayed.

:func:`run_harness` starts real service processes (``python -m lane.server.app``, one or more on
one database, each restarted on its own port after a kill) and one driver process per lane
(:mod:`tests.crash.driver`: the shipped ``lane.client`` Driver with a scripted model and tools
that record their executions), follows every lane with an in-process watcher
(:func:`lane.client.watch.watch_lane`, resuming after each service kill), and, with a seeded
RNG, SIGKILLs either a service or a driver every so often:

* a killed **service** is restarted on the same port at once; drivers and watchers retry or
  resume against whichever service answers;
* a killed **driver** is replaced by a new driver (new driver id) that takes the run over
  (``Driver.recover``: AcquireOperation once the lease lapses, then the open batch) — or, for
  some kills, the run is left to the service: the harness aborts it (reconciled as soon as the
  lease lapses), or just waits until the service reconciles the orphan
  (``LANE_ORPHAN_SECONDS`` after the lapse); the next driver then
  starts the lane's next run.

Driver kills are aimed: most wait (briefly) for a lane whose batch has a SAFE or a NEVER call
effect_pending, or a call outcome_ready, so every recovery path is exercised. When the kills
are done, the drivers finish their runs; then every lane is checked (:mod:`tests.crash.checks`)
and :class:`CrashReport` says how many kills and recoveries happened, and every violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.connect import open_channel
from lane.client.watch import RetryPolicy, watch_lane
from lane.v1 import events_pb2, lane_service_pb2_grpc, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.server import LANE_SERVICE_NAME
from tests.crash.checks import (
    INTERRUPTED_MARKER,
    RETRIED,
    LaneFindings,
    RecoveryCounts,
    check_lane,
    snapshot_of,
)
from tests.crash.driver import EXIT_DONE, EXIT_LEASE_LOST
from tests.crash.recording import ensure_executions_table

REPO_ROOT = Path(__file__).resolve().parents[2]

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """Our environment without any LANE_* setting of the developer, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LANE_")} | extra


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _spawn(args: Sequence[str], env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *args, env=env, cwd=REPO_ROOT, stdout=out, stderr=asyncio.subprocess.STDOUT
        )


async def reap(process: asyncio.subprocess.Process, *, polite: bool = False) -> None:
    """Make sure ``process`` is gone (SIGTERM first when ``polite``), and waited for."""
    if process.returncode is None:
        if polite:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
                return
            except TimeoutError:
                pass
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    await process.wait()


# -- service processes ---------------------------------------------------------------------------


class ServiceProcess:
    """One ``python -m lane.server.app`` on a fixed port (kept across restarts)."""

    def __init__(
        self,
        index: int,
        database_url: str,
        workdir: Path,
        *,
        orphan_seconds: float,
        poll_interval: float,
        port: int | None = None,
        place_quiet_seconds: float = 5.0,
    ) -> None:
        self.index = index
        self.port = port or free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log = workdir / f"service-{index}.log"
        self.env = child_env(
            {
                "LANE_DATABASE_URL": database_url,
                "LANE_LISTEN": self.target,
                "LANE_ORPHAN_SECONDS": str(orphan_seconds),
                "LANE_PLACE_QUIET_SECONDS": str(place_quiet_seconds),
                "LANE_POLL_INTERVAL_SECONDS": str(poll_interval),
                "LANE_GRACE_SECONDS": "0.5",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self, within: float = 60.0) -> None:
        """Start it and wait until it serves; retry a start that failed (say, the port was
        still held for a moment after a kill)."""
        deadline = time.monotonic() + within
        while True:
            self.starts += 1
            command = [sys.executable, "-m", "lane.server.app"]
            self.process = await _spawn(command, self.env, self.log)
            if await self._serving(self.process, deadline):
                return
            await reap(self.process)
            if time.monotonic() > deadline:
                raise RuntimeError(f"service {self.index} did not start:\n{tail(self.log)}")
            await asyncio.sleep(0.3)

    async def _serving(self, process: asyncio.subprocess.Process, deadline: float) -> bool:
        request = health_pb2.HealthCheckRequest(service=LANE_SERVICE_NAME)
        options = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 200),
        ]
        async with grpc.aio.insecure_channel(self.target, options=options) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while process.returncode is None and time.monotonic() < deadline:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    answer = await health.Check(request, timeout=1)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return True
                await asyncio.sleep(0.1)
        return False

    async def kill(self) -> None:
        """kill -9, and wait for the process to be gone."""
        if self.process is not None:
            await reap(self.process)

    async def stop(self) -> None:
        if self.process is not None:
            await reap(self.process, polite=True)


# -- driver processes ----------------------------------------------------------------------------


@dataclass
class DriverProcess:
    """One ``python -m tests.crash.driver``: the SDK's Driver on one lane."""

    driver_id: str
    process: asyncio.subprocess.Process
    log: Path
    killed: bool = False
    #: After a kill: "takeover", "abort" or "orphan" (who finishes the run).
    recovery: str = "takeover"

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.killed


async def spawn_driver(
    targets: Sequence[str],
    lane_id: str,
    driver_id: str,
    database_url: str,
    workdir: Path,
    *,
    runs: int = 1,
    seed: int = 0,
    lease_seconds: int = 3,
    plan: str = "",
) -> DriverProcess:
    """Start a driver process for ``lane_id``; its output goes to ``workdir/<driver>.log``."""
    log = workdir / f"{driver_id}.log"
    args = [
        sys.executable,
        "-m",
        "tests.crash.driver",
        "--target",
        ",".join(targets),
        "--lane",
        lane_id,
        "--driver-id",
        driver_id,
        "--database-url",
        database_url,
        "--runs",
        str(runs),
        "--seed",
        str(seed),
        "--lease-seconds",
        str(lease_seconds),
    ]
    if plan:
        args += ["--plan", plan]
    process = await _spawn(args, child_env({"PYTHONUNBUFFERED": "1"}), log)
    return DriverProcess(driver_id, process, log)


# -- helpers shared with the focused tests -------------------------------------------------------


async def wait_until(
    condition: Callable[[], Any], *, within: float, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll the async ``condition`` until it returns something truthy; return it."""
    deadline = time.monotonic() + within
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what or condition}")
        await asyncio.sleep(interval)


async def rpc(stub: Stub | Sequence[Stub], method: str, request: Any, *, within: float = 60) -> Any:
    """``method(request)`` on ``stub`` (or on each of several in turn), retrying the failures
    of a service that is down or restarting (:data:`RETRIED`) for up to ``within`` seconds."""
    stubs = list(stub) if isinstance(stub, Sequence) else [stub]
    deadline = time.monotonic() + within
    attempt = 0
    while True:
        try:
            return await getattr(stubs[attempt % len(stubs)], method)(request, timeout=10)
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRIED or time.monotonic() > deadline:
                raise
        attempt += 1
        await asyncio.sleep(0.1)


async def open_operation(stub: Stub | Sequence[Stub], lane_id: str) -> str:
    """The lane's open operation id ('' when none)."""
    snapshot = await snapshot_of(stub, lane_id)
    return snapshot.operation.id if snapshot.HasField("operation") else ""


async def call_statuses(
    conn: psycopg.AsyncConnection[Any], lane_id: str
) -> list[tuple[str, str, int, bool]]:
    """(tool_call_id, status, replay, has checkpoint) of the lane's open batch, as stored."""
    cur = await conn.execute(
        "SELECT c.tool_call_id, c.status, c.replay, c.checkpoint IS NOT NULL FROM tool_calls c"
        " JOIN operations o ON o.operation_id = c.operation_id"
        " WHERE o.lane_id = %s AND o.phase <> 'ended' ORDER BY c.source_index",
        (lane_id,),
    )
    return [(str(a), str(b), int(c), bool(d)) for a, b, c, d in await cur.fetchall()]


async def lease_holder(conn: psycopg.AsyncConnection[Any], lane_id: str) -> str:
    """The driver holding the lease of the lane's open run ('' when none)."""
    cur = await conn.execute(
        "SELECT lease_holder FROM operations WHERE lane_id = %s AND phase <> 'ended'"
        " AND lease_expires > now()",
        (lane_id,),
    )
    row = await cur.fetchone()
    return str(row[0]) if row and row[0] else ""


@contextlib.asynccontextmanager
async def lane_stub(target: str) -> AsyncIterator[Stub]:
    channel = open_channel(target)
    try:
        yield lane_service_pb2_grpc.LaneServiceStub(channel)
    finally:
        await channel.close()


# -- the randomized harness ----------------------------------------------------------------------


@dataclass
class HarnessConfig:
    database_url: str
    workdir: Path
    seed: int = 1
    #: Total kills (service + driver) before the harness lets the runs finish.
    kills: int = 20
    lanes: int = 3
    services: int = 2
    lease_seconds: int = 3
    orphan_seconds: float = 2.0
    poll_interval: float = 0.2
    #: Runs a driver adds to its lane's goal when it finished the previous goal.
    runs_per_driver: int = 2
    #: Share of kills that hit a service (the rest hit a driver).
    service_kill_share: float = 0.35
    #: Seconds between kills, drawn uniformly.
    kill_gap: tuple[float, float] = (0.4, 2.4)
    #: After a driver kill: who finishes its run (weights).
    recovery_weights: tuple[tuple[str, float], ...] = (
        ("takeover", 0.6),
        ("abort", 0.2),
        ("orphan", 0.2),
    )
    #: Kills allowed beyond ``kills`` while a recovery path (takeover, safe replay, interruption
    #: at a takeover, reconciliation) was never taken.
    extra_kills: int = 20
    #: Upper bound on the chaos phase, and on letting the runs finish after it.
    chaos_seconds: float = 900.0
    drain_seconds: float = 120.0
    #: Called with a line of progress now and then (None: quiet).
    progress: Callable[[str], None] | None = None


@dataclass
class CrashReport(RecoveryCounts):
    """What one harness run did and found: the lanes' counts summed, and the harness's own."""

    service_kills: int = 0
    driver_kills: int = 0
    aborts_requested: int = 0
    lease_lost: int = 0
    drivers_started: int = 0
    seconds: float = 0.0
    #: Broken crash invariants (and harness failures).
    violations: list[str] = field(default_factory=list)
    #: Service bugs that retries hid: INTERNAL answers, "unexpected error" in a service log.
    service_errors: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return self.service_kills + self.driver_kills

    def add(self, findings: LaneFindings) -> None:
        self.add_counts(findings)
        self.violations.extend(findings.violations)

    def summary(self) -> str:
        lines = [
            f"kills: {self.kills} (service {self.service_kills}, driver {self.driver_kills})",
            f"takeovers: {self.takeovers} (mid-batch {self.batch_takeovers})",
            f"safe replays: {self.replays}",
            f"interruptions: {self.interruptions} (unsafe recoveries at a takeover "
            f"{self.unsafe_recoveries})",
            f"outcome_ready at a takeover (placed, not re-executed): {self.staged_at_takeover}",
            f"reconciliations by the service: {self.reconciliations} "
            f"(aborts requested {self.aborts_requested})",
            f"runs: {self.runs_ended} ended ({self.runs_completed} completed, "
            f"{self.runs_aborted} aborted; {self.parallel_runs} parallel, "
            f"{self.sequential_runs} sequential)",
            f"tool calls: {self.calls}, executions: {self.executions}",
            f"drivers started: {self.drivers_started}, lost their lease: {self.lease_lost}",
            f"seconds: {self.seconds:.1f}",
            f"violations: {len(self.violations)}",
        ]
        lines += [f"  - {v}" for v in self.violations]
        lines.append(f"service errors: {len(self.service_errors)}")
        lines += [f"  - {v}" for v in self.service_errors]
        return "\n".join(lines)


@dataclass
class Lane:
    lane_id: str
    index: int
    runs_goal: int
    generation: int = 0
    driver: DriverProcess | None = None
    view: snapshot_pb2.LaneSnapshot | None = None
    watch_error: str = ""
    failures: int = 0


class Harness:
    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.report = CrashReport()
        self.services: list[ServiceProcess] = []
        self.lanes: list[Lane] = []
        self.chaos_over = False
        self.stubs: list[Stub] = []
        self.channels: list[grpc.aio.Channel] = []
        self.drivers: list[DriverProcess] = []
        self.conn: psycopg.AsyncConnection[Any] | None = None

    def say(self, line: str) -> None:
        if self.config.progress is not None:
            self.config.progress(line)

    def violation(self, problem: str) -> None:
        self.report.violations.append(problem)
        self.say(f"VIOLATION {problem}")

    def service_error(self, problem: str) -> None:
        self.report.service_errors.append(problem)
        self.say(f"SERVICE ERROR {problem}")

    @property
    def targets(self) -> list[str]:
        return [s.target for s in self.services]

    async def run(self) -> CrashReport:
        started = time.monotonic()
        cfg = self.config
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        tasks: list[asyncio.Task[None]] = []
        try:
            self.conn = await psycopg.AsyncConnection.connect(cfg.database_url, autocommit=True)
            self.services = [
                ServiceProcess(
                    i,
                    cfg.database_url,
                    cfg.workdir,
                    orphan_seconds=cfg.orphan_seconds,
                    poll_interval=cfg.poll_interval,
                )
                for i in range(cfg.services)
            ]
            await self.services[0].start()  # it migrates; the others find the schema ready
            await asyncio.gather(*(s.start() for s in self.services[1:]))
            await ensure_executions_table(self.conn)
            self.channels = [open_channel(t) for t in self.targets]
            self.stubs = [lane_service_pb2_grpc.LaneServiceStub(c) for c in self.channels]
            prefix = uuid.uuid4().hex[:5]
            for i in range(cfg.lanes):
                lane = Lane(f"c{prefix}L{i}", i, cfg.runs_per_driver)
                await rpc(self.stubs, "CreateLane", pb.CreateLaneRequest(lane_id=lane.lane_id))
                self.lanes.append(lane)
            tasks += [asyncio.create_task(self.watch(lane)) for lane in self.lanes]
            supervisors = [asyncio.create_task(self.supervise(lane)) for lane in self.lanes]
            await self.chaos(started)
            self.chaos_over = True
            self.say(f"chaos over after {time.monotonic() - started:.0f}s; letting runs finish")
            done, pending = await asyncio.wait(supervisors, timeout=cfg.drain_seconds)
            for task in pending:
                task.cancel()
            for task in done:
                if task.exception() is not None:
                    self.violation(f"supervisor failed: {task.exception()!r}")
            if pending:
                self.violation(f"{len(pending)} lanes did not finish within {cfg.drain_seconds}s")
            for driver in self.drivers:
                await reap(driver.process)
            await self.check_all()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for driver in self.drivers:
                await reap(driver.process)
            for channel in self.channels:
                await channel.close()
            for service in self.services:
                await service.stop()
            if self.conn is not None:
                await self.conn.close()
        self.report.seconds = time.monotonic() - started
        return self.report

    # -- lanes ------------------------------------------------------------------------------------

    async def watch(self, lane: Lane) -> None:
        stub = self.stubs[lane.index % len(self.stubs)]
        retry = RetryPolicy(initial_backoff=0.05, max_backoff=0.5)
        try:
            async for view in watch_lane(stub, lane.lane_id, retry=retry, idle_timeout=15.0):
                lane.view = view.snapshot
        except asyncio.CancelledError:
            raise
        except Exception as error:
            lane.watch_error = repr(error)
            self.violation(f"{lane.lane_id}: the watcher failed: {error!r}")

    async def start_driver(self, lane: Lane) -> DriverProcess:
        lane.generation += 1
        targets = (
            self.targets[lane.index % len(self.targets) :]
            + self.targets[: lane.index % len(self.targets)]
        )
        driver = await spawn_driver(
            targets,
            lane.lane_id,
            f"{lane.lane_id}-d{lane.generation}",
            self.config.database_url,
            self.config.workdir,
            runs=lane.runs_goal,
            seed=self.config.seed,
            lease_seconds=self.config.lease_seconds,
        )
        self.drivers.append(driver)
        self.report.drivers_started += 1
        lane.driver = driver
        return driver

    async def supervise(self, lane: Lane) -> None:
        """Keep one driver on the lane until the chaos is over and its runs are done."""
        while True:
            driver = await self.start_driver(lane)
            status = await driver.process.wait()
            if driver.killed:
                await self.after_driver_kill(lane, driver.recovery)
                continue
            if status == EXIT_DONE:
                if self.chaos_over:
                    return
                lane.runs_goal += self.config.runs_per_driver
                continue
            if status == EXIT_LEASE_LOST:
                self.report.lease_lost += 1
                continue
            lane.failures += 1
            self.violation(
                f"driver {driver.driver_id} exited with status {status}:\n{tail(driver.log)}"
            )
            if lane.failures >= 3:
                return

    async def after_driver_kill(self, lane: Lane, recovery: str) -> None:
        """Leave the killed driver's run to a new driver, or to the service."""
        if recovery == "takeover":
            return
        stub = self.stubs
        operation_id = await open_operation(stub, lane.lane_id)
        if not operation_id:
            return
        if recovery == "abort":
            await self.abort(lane.lane_id, operation_id)
        cfg = self.config

        async def ended() -> bool:
            return await open_operation(stub, lane.lane_id) != operation_id

        try:
            await wait_until(
                ended,
                within=cfg.lease_seconds + cfg.orphan_seconds + 30,
                interval=0.2,
                what=f"the service to reconcile {operation_id}",
            )
        except TimeoutError as error:
            self.violation(f"{lane.lane_id}: {error}")

    async def abort(self, lane_id: str, operation_id: str) -> None:
        request = pb.AbortOperationRequest(
            lane_id=lane_id, operation_id=operation_id, request_id=f"harness-abort-{operation_id}"
        )
        try:
            await rpc(self.stubs, "AbortOperation", request)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return  # the run ended meanwhile
        self.report.aborts_requested += 1

    # -- chaos ------------------------------------------------------------------------------------

    async def chaos(self, started: float) -> None:
        """Kill until ``kills`` kills happened; then, while a recovery path was never taken,
        keep killing (at most ``extra_kills`` more), aiming at the missing one."""
        cfg = self.config
        while time.monotonic() - started < cfg.chaos_seconds:
            missing: list[str] = []
            if self.report.kills >= cfg.kills:
                missing = [path for path, n in (await self.coverage()).items() if not n]
                if not missing or self.report.kills >= cfg.kills + cfg.extra_kills:
                    if missing:
                        self.say(f"recovery paths never taken: {missing}")
                    return
            await asyncio.sleep(self.rng.uniform(*cfg.kill_gap))
            before = self.report.kills
            if not missing and self.rng.random() < cfg.service_kill_share:
                await self.kill_service(self.rng.choice(self.services))
            else:
                await self.kill_driver(missing[0] if missing else None)
            if self.report.kills != before and self.report.kills % 10 == 0:
                self.say(
                    f"{self.report.kills} kills ({self.report.service_kills} service) after "
                    f"{time.monotonic() - started:.0f}s"
                )

    async def coverage(self) -> dict[str, int]:
        """How often each recovery path was taken so far, from the database."""
        assert self.conn is not None
        lanes = [lane.lane_id for lane in self.lanes]

        async def count(query: str, *params: object) -> int:
            assert self.conn is not None
            cur = await self.conn.execute(query, (lanes, *params))
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return {
            "takeover": await count(
                "SELECT count(*) FROM operations WHERE lane_id = ANY(%s) AND lease_token > 1"
            ),
            "replay": await count(
                "SELECT count(*) FROM crash_executions WHERE lane_id = ANY(%s) AND replayed"
            ),
            # Interruptions a driver staged after a takeover: not in an EndRun/reconcile group.
            "interruption": await count(
                "SELECT count(*) FROM events e WHERE e.lane_id = ANY(%s) AND e.kind = 'tool_end'"
                " AND position(%s::bytea in e.body) > 0 AND NOT EXISTS (SELECT 1 FROM events r"
                " WHERE r.lane_id = e.lane_id AND r.group_end = e.group_end"
                " AND r.kind = 'run_end')",
                INTERRUPTED_MARKER.encode(),
            ),
            "reconciliation": sum(
                events_pb2.HarnessEvent.FromString(bytes(body)).recovery
                for (body,) in await (
                    await self.conn.execute(
                        "SELECT body FROM events WHERE lane_id = ANY(%s) AND kind = 'run_end'",
                        (lanes,),
                    )
                ).fetchall()
            ),
        }

    async def kill_service(self, service: ServiceProcess) -> None:
        await service.kill()
        self.report.service_kills += 1
        await asyncio.sleep(self.rng.uniform(0.0, 0.3))
        await service.start()

    async def kill_driver(self, missing: str | None = None) -> None:
        """SIGKILL one driver, aimed at a batch state; ``missing`` names a recovery path not
        taken yet, which the aim and the recovery choice then favour."""
        aim = self.rng.choice(("safe_pending", "never_pending", "staged", "any", "any"))
        recovery = self.rng.choices(
            [name for name, _ in self.config.recovery_weights],
            [weight for _, weight in self.config.recovery_weights],
        )[0]
        if missing == "replay":
            aim, recovery = "safe_pending", "takeover"
        elif missing == "interruption":
            aim, recovery = "never_pending", "takeover"
        elif missing == "takeover":
            recovery = "takeover"
        elif missing == "reconciliation":
            recovery = self.rng.choice(("abort", "orphan"))
        victim = await self.aim(aim)
        if victim is None:
            return
        driver = victim.driver
        assert driver is not None
        driver.killed = True
        driver.recovery = recovery
        with contextlib.suppress(ProcessLookupError):
            driver.process.kill()
        self.report.driver_kills += 1

    async def aim(self, aim: str) -> Lane | None:
        """A lane whose driver is alive and holds its run's lease, preferably one whose batch
        matches ``aim``; after a few seconds without a match any such lane, or any lane whose
        driver is alive (kills at start-up and between runs are points too)."""
        assert self.conn is not None
        deadline = time.monotonic() + 3.0
        while True:
            alive = [lane for lane in self.lanes if lane.driver and lane.driver.alive]
            if not alive:
                return None
            self.rng.shuffle(alive)
            holding = []
            for lane in alive:
                assert lane.driver is not None
                if await lease_holder(self.conn, lane.lane_id) != lane.driver.driver_id:
                    continue
                holding.append(lane)
                if aim == "any":
                    return lane
                for _, status, replay, _ in await call_statuses(self.conn, lane.lane_id):
                    if (
                        (aim == "staged" and status == "outcome_ready")
                        or (
                            aim == "safe_pending"
                            and status == "effect_pending"
                            and replay == pb.REPLAY_POLICY_SAFE
                        )
                        or (
                            aim == "never_pending"
                            and status == "effect_pending"
                            and replay == pb.REPLAY_POLICY_NEVER
                        )
                    ):
                        return lane
            if time.monotonic() > deadline:
                return (holding or alive)[0]
            await asyncio.sleep(0.05)

    # -- the verdict ------------------------------------------------------------------------------

    def check_logs(self) -> None:
        """Service bugs the logs show: unexpected errors (INTERNAL answers; a driver given one
        exits with status 1, which is a violation of its own)."""
        for service in self.services:
            text = service.log.read_text(errors="replace") if service.log.exists() else ""
            marker = "ERROR lane.server.api.errors: unexpected error"
            if marker in text:
                at = text.index(marker)
                excerpt = text[at : at + 3000].splitlines()
                last = next((line for line in reversed(excerpt[:60]) if "Error" in line), "")
                self.service_error(
                    f"service {service.index} answered INTERNAL {text.count(marker)} times; "
                    f"first at {excerpt[0][:23]}: {last}"
                )

    async def check_all(self) -> None:
        assert self.conn is not None
        self.check_logs()
        stub = self.stubs[0]
        for lane in self.lanes:
            fresh = await snapshot_of(self.stubs, lane.lane_id)

            async def caught_up(lane: Lane = lane, revision: int = fresh.revision) -> bool:
                return lane.view is not None and lane.view.revision >= revision

            try:
                await wait_until(caught_up, within=30, what=f"the watcher of {lane.lane_id}")
            except TimeoutError as error:
                self.violation(str(error))
            findings = await check_lane(self.conn, stub, lane.lane_id, lane.view)
            self.report.add(findings)


async def run_harness(config: HarnessConfig) -> CrashReport:
    """Run the kill -9 harness once; see the module docstring."""
    return await Harness(config).run()
