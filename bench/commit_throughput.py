"""Commit throughput: lifecycle commits/s through gRPC versus PostgreSQL's own commit rate.

Run from the repository root (virtualenv active)::

    python -m bench.commit_throughput [--drivers N] [--seconds S] [--database-url URL]

DESIGN.md §8: "lifecycle commits/s through gRPC >= 0.5 x PostgreSQL's own single-row commit
rate (pgbench) at the same concurrency on the same machine". One run measures both, one after
the other, on the same PostgreSQL:

1. **Baseline.** ``pgbench -n -c N -j N -T S -f script`` where the script is one single-row
   ``INSERT`` (or, with ``--baseline update``, an ``UPDATE`` of the client's own row) per
   transaction. Without ``pgbench`` on PATH, N threads with one psycopg connection each run the
   same statement in autocommit for S seconds. Measured before the service phase and again
   after it (``--single-baseline``: before only); the ratio uses their mean, since the load
   of a shared machine drifts.
2. **Service.** The real service runs as a **subprocess** (``python -m service.app`` with
   ``LANE_DATABASE_URL`` and ``LANE_LISTEN``), so the load generator does not share its event
   loop or GIL; the measured figure is the service's, not the service's minus the driver's
   Python time. N drivers (``grpc.aio`` tasks in this process on one channel), each on its own
   lane, repeat a run: StartRun, then ``--turns`` turns of StartTurn, SettleAssistantMessage
   with ``--calls`` tool calls, and for each call StartToolCall, UpdateToolCall x 2,
   StageToolOutcome; then a final turn with a text-only answer and EndRun. Every RPC is one
   commit, StageToolOutcome two (staging, then placement in a second transaction). After a
   warm-up the counters are read at the start and end of an S-second window. Before the
   drivers start, a short burst of Health.Check RPCs at the same concurrency gives the gRPC
   ceiling: what one service process answers with no database work at all.

Cross-checks printed with the result: the lane revisions advanced (from the RPC answers, and
at the end from GetLaneSnapshot of every lane: they must agree, else the exit status is 1),
and PostgreSQL's own count of committed transactions in the bench database over each whole
phase (``pg_stat_database.xact_commit``), which also shows the transactions the service runs
besides the lifecycle commits (the pool's check query on every checkout, NOTIFY doorbells, hub
polls). CPU use (server, drivers or pgbench, the PostgreSQL cluster, the rest of the machine)
is read from /proc over each window, also as CPU time per commit, which varies less than the
rates when other work shares the machine. ``--py-spy FILE`` profiles the server during the
window.

``--watchers W`` (DESIGN.md §8: "with 1,000 watchers attached it drops by <= 10 %") adds a
second service phase, on a fresh service process, with W WatchLane streams attached before the
drivers start: spread evenly over the drivers' lanes (``--watch-lanes driven``, the default),
or one each on W lanes nobody commits to (``idle``). The watchers run in a process of their own
(:mod:`bench.watchers`) and read everything; each must end at its lane's last revision (else
the exit status is 1). The report without the option is unchanged; with it, a second block
shows both phases side by side and the drop of commits/s.

PostgreSQL is the one at ``--database-url`` (its role needs CREATEDB: a scratch database is
created and dropped), else an embedded pgserver in a temporary directory that is removed after.
Every process and directory started here is stopped and removed on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.v1 import (
    lane_service_pb2 as pb,
)
from lane.v1 import (
    lane_service_pb2_grpc,
    messages_pb2,
    snapshot_pb2,
)
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.entry import add_database_url, run_benchmark, stop_process
from bench.watchers import Fleet, FleetResult, start_fleet

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.5  # DESIGN.md §8
TARGET_WATCHERS = 1000  # DESIGN.md §8: "with 1,000 watchers attached it drops by <= 10 %"
TARGET_WATCHER_DROP = 0.10
RPC_TIMEOUT_SECONDS = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# "lane service listening on ADDRESS (transport); database: ..." (older services: "ADDRESS;").
_LISTENING = re.compile(r"lane service listening on (\S+?)(?:;| \()")

Response = TypeVar("Response")


# -- CPU accounting from /proc ----------------------------------------------------------------


@dataclass(frozen=True)
class CpuSample:
    """System CPU ticks (busy, total) and per-process ticks (user + system) at one moment."""

    busy: int
    total: int
    processes: dict[str, int]
    wall: float


def _system_ticks() -> tuple[int, int]:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # Fields after "(comm)": state is [0], ppid [1], utime [11], stime [12],
            # cutime [13], cstime [14] (proc(5), counted from 1 after the comm as 3...).
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def _process_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    return 0 if fields is None else int(fields[11]) + int(fields[12])  # all threads


def _cluster_ticks(postmaster: int) -> int:
    """CPU ticks of a PostgreSQL cluster: the postmaster, its live children, and (through the
    postmaster's cutime/cstime) every child it has reaped, so backends that exit in between
    (pgbench's, at its end) are still counted."""
    fields = _stat_fields(postmaster)
    if fields is None:
        return 0
    ticks = sum(int(v) for v in fields[11:15])
    for pid in _cluster_children(postmaster):
        child = _stat_fields(pid)
        if child is not None and child[1] == str(postmaster):
            ticks += int(child[11]) + int(child[12])
    return ticks


def _cluster_children(postmaster: int | None) -> set[int]:
    if postmaster is None:
        return set()
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[1] == str(postmaster):
                found.add(int(entry.name))
    return found


async def settle_cluster(postmaster: int | None, children_before: set[int]) -> None:
    """Wait (at most 2 s) until backends started since ``children_before`` are reaped: while a
    backend is exiting its CPU time is in neither its own stat nor the postmaster's cutime."""
    for _ in range(100):
        if not _cluster_children(postmaster) - children_before:
            return
        await asyncio.sleep(0.02)


def cpu_sample(processes: dict[str, int], postmaster: int | None = None) -> CpuSample:
    """Sample system ticks, the ticks of each named pid and of the cluster of ``postmaster``
    (reported as "PostgreSQL")."""
    busy, total = _system_ticks()
    ticks = {name: _process_ticks(pid) for name, pid in processes.items()}
    if postmaster is not None:
        ticks["PostgreSQL"] = _cluster_ticks(postmaster)
    return CpuSample(busy=busy, total=total, processes=ticks, wall=time.monotonic())


@dataclass(frozen=True)
class CpuUse:
    """CPU used during a window, in cores (CPU-seconds per wall second)."""

    cores: int
    busy: float
    processes: dict[str, float]

    @property
    def rest(self) -> float:
        """Busy time not in the named processes: other processes on the machine (and
        PostgreSQL when its postmaster is not local)."""
        return max(0.0, self.busy - sum(self.processes.values()))

    def describe(self) -> str:
        parts = [f"{name} {value:.2f}" for name, value in self.processes.items()]
        rest = "rest" if "PostgreSQL" in self.processes else "rest (PostgreSQL, other)"
        parts.append(f"{rest} {self.rest:.2f}")
        parts.append(f"idle {max(0.0, self.cores - self.busy):.2f}")
        return f"CPU in cores of {self.cores}: " + ", ".join(parts)

    def per_commit(self, commits_per_second: float, *names: str) -> str:
        """CPU time per commit of the named processes: steadier than rates on a busy machine."""
        parts = [
            f"{name} {self.processes[name] / commits_per_second * 1e6:,.0f} µs"
            for name in names
            if name in self.processes and commits_per_second > 0
        ]
        return "CPU per commit: " + ", ".join(parts) if parts else ""


def cpu_use(before: CpuSample, after: CpuSample, extra: dict[str, float] | None = None) -> CpuUse:
    """CPU use between two samples; ``extra`` adds CPU-seconds measured otherwise (children)."""
    wall = max(after.wall - before.wall, 1e-9)
    total = max(after.total - before.total, 1)
    cores = os.cpu_count() or 1
    busy = cores * (after.busy - before.busy) / total
    processes = {
        name: (after.processes[name] - before.processes[name]) / _CLOCK_TICKS / wall
        for name in before.processes
    }
    for name, seconds in (extra or {}).items():
        processes[name] = seconds / wall
    return CpuUse(cores=cores, busy=busy, processes=processes)


# -- PostgreSQL provisioning --------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    """The scratch database the benchmark runs in, and what it runs on."""

    url: str
    description: str
    version: str
    fsync: str
    synchronous_commit: str
    #: The local postmaster's pid (for CPU accounting); None when the server is not local.
    postmaster: int | None


@contextlib.asynccontextmanager
async def provision_database(server_url: str | None) -> AsyncIterator[Database]:
    """A scratch database on ``server_url`` (else on an embedded pgserver in a temp dir)."""
    async with contextlib.AsyncExitStack() as stack:
        if server_url is None:
            # Imported here: the service's own helper for pgserver (unprivileged user as root,
            # quiet platformdirs warning). Only needed without a URL.
            from service.app.embedded import start_embedded

            temp_dir = Path(tempfile.mkdtemp(prefix="lane-bench-pg-"))
            stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)
            embedded = await asyncio.to_thread(start_embedded, temp_dir)
            stack.push_async_callback(asyncio.to_thread, embedded.stop)
            server_url, description = embedded.uri, "embedded pgserver in a temp dir"
        else:
            description = "--database-url"
        name = f"lane_bench_{uuid.uuid4().hex[:12]}"
        async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            settings = {}
            for setting in ("server_version", "fsync", "synchronous_commit"):
                cur = await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting)))
                row = await cur.fetchone()
                settings[setting] = str(row[0]) if row else "?"
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            postmaster = _local_postmaster(int(row[0])) if row else None

        async def drop() -> None:
            async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )

        stack.push_async_callback(drop)
        yield Database(
            url=make_conninfo(server_url, dbname=name),
            description=description,
            version=settings["server_version"],
            fsync=settings["fsync"],
            synchronous_commit=settings["synchronous_commit"],
            postmaster=postmaster,
        )


def _local_postmaster(backend_pid: int) -> int | None:
    """The postmaster of a local backend (its parent), None if the backend is not local."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{backend_pid}/comm") as comm:
            if comm.read().strip() != "postgres":
                return None
        fields = _stat_fields(backend_pid)
        if fields is not None:
            return int(fields[1])
    return None


async def committed_transactions(url: str) -> int:
    """``pg_stat_database.xact_commit`` of the database ``url`` names (stats lag up to ~1 s)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def counted_commits(url: str, before: int) -> int:
    """Commits counted by PostgreSQL since ``before``, after letting idle backends flush stats."""
    await asyncio.sleep(1.5)
    # This query's own transaction is counted after it, so it does not inflate the figure.
    return await committed_transactions(url) - before


# -- baseline -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    method: str
    transactions: int
    commits_per_second: float
    postgres_counted: int
    cpu: CpuUse


_BASELINE_STATEMENTS = {
    "insert": "INSERT INTO bench_rows (client, v) VALUES (:client_id, 1);",
    "update": "UPDATE bench_rows SET v = v + 1 WHERE id = :client_id;",
}
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_PROCESSED = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)


async def _prepare_baseline_table(url: str, clients: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS bench_rows")
        await conn.execute(
            "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, client integer NOT NULL,"
            " v bigint NOT NULL, created timestamptz NOT NULL DEFAULT now())"
        )
        # One row per client for the UPDATE variant; pgbench's :client_id counts from 0.
        await conn.execute(
            "INSERT INTO bench_rows (id, client, v) SELECT g, g, 0 FROM generate_series(0, %s) g",
            (clients - 1,),
        )
        await conn.execute("SELECT setval('bench_rows_id_seq', %s)", (clients,))


async def run_baseline(
    db: Database, clients: int, seconds: float, statement: str, work_dir: Path
) -> Baseline:
    """PostgreSQL's single-row commit rate at ``clients`` connections for ``seconds``."""
    await _prepare_baseline_table(db.url, clients)
    pgbench = shutil.which("pgbench")
    before_commits = await committed_transactions(db.url)
    times_before = os.times()
    children_before = _cluster_children(db.postmaster)
    sample = cpu_sample({}, db.postmaster)
    if pgbench is not None:
        script = work_dir / f"baseline_{statement}.sql"
        script.write_text(_BASELINE_STATEMENTS[statement] + "\n")
        command = [pgbench, "-n", "-c", str(clients), "-j", str(clients)]
        command += ["-T", str(max(1, round(seconds))), "-f", str(script), db.url]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        output = out.decode() + err.decode()
        tps, processed = _TPS.search(output), _PROCESSED.search(output)
        if process.returncode != 0 or tps is None or processed is None:
            raise RuntimeError(f"pgbench failed (exit {process.returncode}):\n{output}")
        await settle_cluster(db.postmaster, children_before)
        after = cpu_sample({}, db.postmaster)
        times_after = os.times()
        child = (times_after.children_user - times_before.children_user) + (
            times_after.children_system - times_before.children_system
        )
        use = cpu_use(sample, after, {"pgbench": child})
        method = f"pgbench -c {clients} -j {clients} -T {round(seconds)}, {statement}"
        transactions, rate = int(processed.group(1)), float(tps.group(1))
    else:
        transactions, elapsed = await asyncio.to_thread(
            _psycopg_baseline, db.url, clients, seconds, statement
        )
        await settle_cluster(db.postmaster, children_before)
        after = cpu_sample({}, db.postmaster)
        use = cpu_use(sample, after, {"bench (psycopg threads)": _own_cpu_seconds(times_before)})
        method = f"psycopg, {clients} threads x 1 connection, {statement} (no pgbench on PATH)"
        rate = transactions / elapsed
    counted = await counted_commits(db.url, before_commits)
    return Baseline(method, transactions, rate, counted, use)


def _own_cpu_seconds(before: os.times_result) -> float:
    now = os.times()
    return (now.user - before.user) + (now.system - before.system)


def _psycopg_baseline(url: str, clients: int, seconds: float, statement: str) -> tuple[int, float]:
    """The pgbench stand-in: ``clients`` threads, each committing one row per transaction."""
    query = _BASELINE_STATEMENTS[statement].replace(":client_id", "%s").rstrip(";")
    counts = [0] * clients
    connections = [psycopg.connect(url, autocommit=True) for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    deadline = 0.0

    def work(index: int) -> None:
        conn = connections[index]
        start.wait()
        done = 0
        while time.monotonic() < deadline:
            conn.execute(query, (index,))
            done += 1
        counts[index] = done

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    try:
        for thread in threads:
            thread.start()
        began = time.monotonic()
        deadline = began + seconds
        start.wait()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
    finally:
        for conn in connections:
            conn.close()
    return sum(counts), elapsed


# -- the service subprocess -----------------------------------------------------------------


@dataclass
class ServiceProcess:
    process: asyncio.subprocess.Process
    address: str
    log_tail: list[str]
    reader: asyncio.Task[None]

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def run_service(
    database_url: str, notify: bool, extra_env: Mapping[str, str] | None = None
) -> AsyncIterator[ServiceProcess]:
    """``python -m service.app`` on a free port of 127.0.0.1; SIGTERM (then SIGKILL) on exit.
    ``extra_env``: more ``LANE_*`` settings."""
    env = dict(os.environ)
    env.update(
        LANE_DATABASE_URL=database_url,
        LANE_LISTEN="127.0.0.1:0",
        LANE_NOTIFY="on" if notify else "off",
        LANE_GRACE_SECONDS="1",
    )
    env.update(extra_env or {})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service.app",
        cwd=REPO_ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    tail: list[str] = []

    async def read_log() -> None:
        # Keep draining stderr for the process's whole life so it never blocks on a full pipe.
        assert process.stderr is not None
        async for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            del tail[:-40]
            found = _LISTENING.search(line)
            if found and not listening.done():
                listening.set_result(found.group(1))
        if not listening.done():
            listening.set_exception(
                RuntimeError("the service exited before listening:\n" + "\n".join(tail))
            )

    reader = asyncio.create_task(read_log())
    try:
        async with asyncio.timeout(60):
            address = await listening
        yield ServiceProcess(process, address, tail, reader)
    finally:
        await stop_process(process)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


# -- drivers ----------------------------------------------------------------------------------


@dataclass
class Counters:
    """Cumulative counts of completed RPCs; read at the start and end of the window."""

    commits: int = 0
    rpcs: int = 0
    tool_calls: int = 0
    revisions: int = 0

    def copy(self) -> Counters:
        return dataclasses.replace(self)


@dataclass
class Stats:
    counters: Counters = field(default_factory=Counters)
    recording: bool = False
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def done(self, method: str, commits: int, seconds: float) -> None:
        self.counters.commits += commits
        self.counters.rpcs += 1
        if self.recording:
            self.latencies.setdefault(method, []).append(seconds)


def _text(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def _result(value: str) -> messages_pb2.ToolResult:
    return messages_pb2.ToolResult(content=[_text(value)])


@dataclass
class Driver:
    """One driver on its own lane, walking runs, turns and tool calls until told to stop."""

    stub: lane_service_pb2_grpc.LaneServiceAsyncStub
    lane_id: str
    stats: Stats
    stop: asyncio.Event
    calls_per_turn: int
    turns_per_run: int
    request_ids: bool
    revision: int = 0
    seq: int = 0

    def _request_id(self) -> str:
        if not self.request_ids:
            return ""
        self.seq += 1
        return f"{self.lane_id}-{self.seq}"

    async def _rpc(
        self,
        method: str,
        call: Callable[..., Awaitable[Response]],
        request: Any,
        commits: int = 1,
    ) -> Response:
        started = time.perf_counter()
        response = await call(request, timeout=RPC_TIMEOUT_SECONDS)
        self.stats.done(method, commits, time.perf_counter() - started)
        revision = int(getattr(response, "revision"))  # noqa: B009 - every answer here has one
        self.stats.counters.revisions += revision - self.revision
        self.revision = revision
        return response

    async def run(self) -> None:
        stub, lane = self.stub, self.lane_id
        await self._rpc(
            "CreateLane",
            stub.CreateLane,
            pb.CreateLaneRequest(lane_id=lane, request_id=self._request_id()),
        )
        run_no = 0
        while not self.stop.is_set():
            run_no += 1
            prompt = messages_pb2.AgentMessage(
                user=messages_pb2.UserMessage(content=[_text(f"run {run_no}: go")])
            )
            started = await self._rpc(
                "StartRun",
                stub.StartRun,
                pb.StartRunRequest(lane_id=lane, prompt=[prompt], request_id=self._request_id()),
            )
            run_id = started.operation_id
            for turn_no in range(self.turns_per_run):
                calls = [f"r{run_no}t{turn_no}c{i}" for i in range(self.calls_per_turn)]
                await self._turn(run_id, calls)
                if self.stop.is_set():
                    return
            await self._turn(run_id, [])  # the final answer: text only, the run may finish
            await self._rpc(
                "EndRun",
                stub.EndRun,
                pb.EndRunRequest(
                    lane_id=lane,
                    operation_id=run_id,
                    status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
                    request_id=self._request_id(),
                ),
            )

    async def _turn(self, run_id: str, calls: Sequence[str]) -> None:
        stub, lane = self.stub, self.lane_id
        turn = await self._rpc(
            "StartTurn",
            stub.StartTurn,
            pb.StartTurnRequest(lane_id=lane, operation_id=run_id, request_id=self._request_id()),
        )
        blocks = [_text("calling tools" if calls else "all done")]
        blocks += [
            messages_pb2.ContentBlock(
                tool_call=messages_pb2.ToolCallContent(
                    id=call, name="shell", arguments_json='{"cmd": "ls", "n": 1}'
                )
            )
            for call in calls
        ]
        message = messages_pb2.AssistantMessage(
            content=blocks,
            api="bench",
            provider="scripted",
            model="m1",
            stop_reason=(
                messages_pb2.STOP_REASON_TOOL_USE if calls else messages_pb2.STOP_REASON_STOP
            ),
        )
        await self._rpc(
            "SettleAssistantMessage",
            stub.SettleAssistantMessage,
            pb.SettleAssistantMessageRequest(
                lane_id=lane,
                operation_id=run_id,
                turn_id=turn.turn_id,
                message=message,
                request_id=self._request_id(),
            ),
        )
        for call in calls:
            await self._tool_call(run_id, call)

    async def _tool_call(self, run_id: str, call: str) -> None:
        stub, lane = self.stub, self.lane_id
        await self._rpc(
            "StartToolCall",
            stub.StartToolCall,
            pb.StartToolCallRequest(
                lane_id=lane,
                operation_id=run_id,
                tool_call_id=call,
                arguments_json='{"cmd": "ls", "n": 1, "cwd": "/tmp"}',
                request_id=self._request_id(),
            ),
        )
        for n, checkpoint in ((1, False), (2, True)):
            await self._rpc(
                "UpdateToolCall",
                stub.UpdateToolCall,
                pb.UpdateToolCallRequest(
                    lane_id=lane,
                    operation_id=run_id,
                    tool_call_id=call,
                    partial_result=_result(f"line {n}"),
                    checkpoint=checkpoint,
                    request_id=self._request_id(),
                ),
            )
        staged = await self._rpc(
            "StageToolOutcome",
            stub.StageToolOutcome,
            pb.StageToolOutcomeRequest(
                lane_id=lane,
                operation_id=run_id,
                tool_call_id=call,
                executed=pb.ExecutedOutcome(result=_result(f"{call} done")),
                request_id=self._request_id(),
            ),
            commits=2,  # staging, then placement in its own transaction
        )
        if list(staged.placed_tool_call_ids) != [call]:
            raise RuntimeError(f"{lane}: {call} was not placed at once: {staged}")
        self.stats.counters.tool_calls += 1


@dataclass(frozen=True)
class ServiceResult:
    window: Counters
    seconds: float
    total: Counters
    lanes_checked: int
    snapshot_revisions: int
    mismatches: list[str]
    postgres_counted: int
    cpu: CpuUse
    latencies: dict[str, list[float]]
    grpc_ceiling: float
    #: With ``--watchers``: what the watchers saw, and how long they took to attach.
    fleet: FleetResult | None = None
    fleet_ready_seconds: float = 0.0

    @property
    def commits_per_second(self) -> float:
        return self.window.commits / self.seconds


async def start_profiler(
    output: Path, pid: int, seconds: float
) -> asyncio.subprocess.Process | None:
    """``py-spy record`` of the server for the window (flame graph for .svg, speedscope for
    .json, else collapsed stacks); None when py-spy is not installed."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        print("--py-spy: py-spy is not on PATH (pip install py-spy); not profiling", flush=True)
        return None
    formats = {".svg": "flamegraph", ".json": "speedscope"}
    return await asyncio.create_subprocess_exec(
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, math.floor(seconds))),
        "--rate",
        "100",
        "--format",
        formats.get(output.suffix, "raw"),
        "--output",
        str(output),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish_profiler(profiler: asyncio.subprocess.Process | None) -> None:
    if profiler is None:
        return
    try:
        async with asyncio.timeout(30):
            _, err = await profiler.communicate()
    except TimeoutError:
        profiler.kill()
        await profiler.wait()
        print("py-spy did not finish in time; killed", flush=True)
        return
    if profiler.returncode != 0:
        print(f"py-spy failed: {err.decode(errors='replace').strip()}", flush=True)


async def grpc_ceiling(channel: grpc.aio.Channel, concurrency: int, seconds: float) -> float:
    """Trivial RPCs/s the server answers (Health.Check: no database, no lane) at the drivers'
    concurrency: what the gRPC layer alone allows on this machine, client included."""
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="")
    done = 0
    deadline = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await stub.Check(request, timeout=RPC_TIMEOUT_SECONDS)
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return done / (time.monotonic() - started)


async def run_service_load(
    db: Database,
    args: argparse.Namespace,
    cpu_processes: dict[str, int],
    address: str,
    watchers: int = 0,
) -> ServiceResult:
    """N drivers against the running service: warm up, then count over the window.

    ``watchers`` > 0: that many WatchLane streams (:mod:`bench.watchers`, a process of their
    own) are attached before the drivers start, spread evenly over the drivers' lanes (or, with
    ``--watch-lanes idle``, one on each of as many lanes nobody commits to); each must end at
    its lane's last revision."""
    stats = Stats()
    stop = asyncio.Event()
    profiler: asyncio.subprocess.Process | None = None
    fleet: Fleet | None = None
    before_commits = await committed_transactions(db.url)
    options = [("grpc.max_receive_message_length", 4 * 1024 * 1024)]
    async with (
        grpc.aio.insecure_channel(address, options=options) as channel,
        contextlib.AsyncExitStack() as watching,
    ):
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        ceiling = await grpc_ceiling(channel, args.drivers, min(args.seconds, 3.0))
        drivers = [
            Driver(
                stub=stub,
                lane_id=f"bench-{uuid.uuid4().hex[:12]}",
                stats=stats,
                stop=stop,
                calls_per_turn=args.calls,
                turns_per_run=args.turns,
                request_ids=args.request_ids,
            )
            for _ in range(args.drivers)
        ]
        if watchers:
            fleet = await _attach_watchers(watching, stub, address, args, drivers, watchers)
            cpu_processes = {**cpu_processes, "watchers": fleet.pid}
        tasks = [asyncio.create_task(d.run(), name=d.lane_id) for d in drivers]
        watcher = asyncio.gather(*tasks)
        try:
            # A failing driver must end the benchmark at once, not after the window.
            await _sleep_unless_failed(watcher, args.warmup)
            first, t0 = stats.counters.copy(), time.monotonic()
            cpu_before = cpu_sample(cpu_processes, db.postmaster)
            stats.recording = True
            if fleet is not None:
                await fleet.window_start()
            if args.py_spy is not None:
                profiler = await start_profiler(args.py_spy, cpu_processes["server"], args.seconds)
            await _sleep_unless_failed(watcher, args.seconds)
            last, t1 = stats.counters.copy(), time.monotonic()
            cpu_after = cpu_sample(cpu_processes, db.postmaster)
            stats.recording = False
            if fleet is not None:
                await fleet.window_end()
            stop.set()
            async with asyncio.timeout(RPC_TIMEOUT_SECONDS):
                await watcher
        finally:
            if not watcher.done():
                # Failed or interrupted: stop the drivers and do not wait for the profile.
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
                if profiler is not None and profiler.returncode is None:
                    profiler.kill()
            await finish_profiler(profiler)
        # Cross-check: every lane's head revision equals the last revision its driver saw.
        mismatches = []
        snapshot_revisions = 0
        for driver in drivers:
            response = await stub.GetLaneSnapshot(
                pb.GetLaneSnapshotRequest(lane_id=driver.lane_id), timeout=RPC_TIMEOUT_SECONDS
            )
            snapshot_revisions += response.snapshot.revision
            if response.snapshot.revision != driver.revision:
                mismatches.append(
                    f"{driver.lane_id}: snapshot revision {response.snapshot.revision},"
                    f" driver saw {driver.revision}"
                )
        watched: FleetResult | None = None
        if fleet is not None:
            print("waiting for every watcher to reach its lane's last revision ...", flush=True)
            expect = {d.lane_id: d.revision for d in drivers}
            watched = await fleet.finish(expect, args.drain_seconds)
    counted = await counted_commits(db.url, before_commits)
    window = Counters(
        commits=last.commits - first.commits,
        rpcs=last.rpcs - first.rpcs,
        tool_calls=last.tool_calls - first.tool_calls,
        revisions=last.revisions - first.revisions,
    )
    return ServiceResult(
        window=window,
        seconds=t1 - t0,
        total=stats.counters.copy(),
        lanes_checked=len(drivers),
        snapshot_revisions=snapshot_revisions,
        mismatches=mismatches,
        postgres_counted=counted,
        cpu=cpu_use(cpu_before, cpu_after),
        latencies=stats.latencies,
        grpc_ceiling=ceiling,
        fleet=watched,
        fleet_ready_seconds=fleet.ready_seconds if fleet is not None else 0.0,
    )


async def _attach_watchers(
    stack: contextlib.AsyncExitStack,
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub,
    address: str,
    args: argparse.Namespace,
    drivers: Sequence[Driver],
    watchers: int,
) -> Fleet:
    """Create the lanes the watchers watch and attach them (every snapshot received)."""
    if args.watch_lanes == "driven":
        # The drivers' own CreateLane then finds the lane (get-or-create, revision 1 either way).
        lanes = [d.lane_id for d in drivers]
    else:
        lanes = [f"bench-idle-{uuid.uuid4().hex[:12]}" for _ in range(watchers)]
    for lane in lanes:
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane), timeout=RPC_TIMEOUT_SECONDS)
    print(f"attaching {watchers:,} watchers to {len(lanes):,} lanes ...", flush=True)
    fleet = await stack.enter_async_context(
        start_fleet(
            address,
            [lanes[i % len(lanes)] for i in range(watchers)],
            channels=args.watcher_channels,
            records=False,
        )
    )
    print(f"{watchers:,} watchers attached in {fleet.ready_seconds:.1f} s", flush=True)
    return fleet


async def _sleep_unless_failed(watcher: asyncio.Future[Any], seconds: float) -> None:
    done, _ = await asyncio.wait({watcher}, timeout=seconds)
    if done:
        watcher.result()  # raises the driver's error
        raise RuntimeError("every driver stopped before the window ended")


# -- report -----------------------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def report(
    args: argparse.Namespace,
    db: Database,
    service_pid: int,
    baselines: Sequence[Baseline],
    service: ServiceResult,
) -> str:
    baseline_rate = sum(b.commits_per_second for b in baselines) / len(baselines)
    ratio = service.commits_per_second / baseline_rate
    met = "met" if ratio >= TARGET_RATIO else "NOT met"
    each = " / ".join(f"{b.commits_per_second:,.0f}" for b in baselines)
    window = service.window
    mismatches = "\n    ".join(service.mismatches)
    rows = [
        (f"baseline: PostgreSQL single-row commits/s ({each})", f"{baseline_rate:,.0f}"),
        ("service: lifecycle commits/s through gRPC", f"{service.commits_per_second:,.0f}"),
        ("service: tool calls/s (full life each)", f"{window.tool_calls / service.seconds:,.1f}"),
        ("service: RPCs/s", f"{window.rpcs / service.seconds:,.0f}"),
        ("service: lane revisions (events)/s", f"{window.revisions / service.seconds:,.0f}"),
        ("gRPC ceiling: Health.Check RPCs/s (no database)", f"{service.grpc_ceiling:,.0f}"),
        ("ratio service / baseline", f"{ratio:.3f}"),
        (f"DESIGN.md §8 target: ratio >= {TARGET_RATIO}", met),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [
        f"commit throughput: N={args.drivers} drivers, window {service.seconds:.1f} s"
        f" after {args.warmup:g} s warm-up; {args.turns} turns x {args.calls} tool calls per run;"
        f" request ids {'on' if args.request_ids else 'off'}; NOTIFY {args.notify}",
        f"PostgreSQL {db.version} ({db.description}); fsync={db.fsync},"
        f" synchronous_commit={db.synchronous_commit}; {os.cpu_count()} CPUs;"
        f" service pid {service_pid} (subprocess)",
        "",
        f"  {'':<{width}}  value",
    ]
    lines += [f"  {label:<{width}}  {value:>12}" for label, value in rows]
    lines += [
        "",
        *(
            line
            for when, b in zip(("before", "after"), baselines, strict=False)
            for line in (
                f"baseline {when} the service: {b.method}: {b.transactions:,} transactions;"
                f" PostgreSQL counted {b.postgres_counted:,} commits",
                f"  {b.cpu.describe()}",
                f"  {b.cpu.per_commit(b.commits_per_second, *b.cpu.processes)}",
            )
        ),
        f"service: {service.window.commits:,} commits, {service.window.rpcs:,} RPCs,"
        f" {service.window.tool_calls:,} tool calls in the window;"
        f" {service.window.revisions / max(service.window.commits, 1):.2f} revisions per commit",
        f"  {service.cpu.describe()}",
        "  "
        + service.cpu.per_commit(service.commits_per_second, "server", "PostgreSQL", "drivers"),
        f"  whole phase: drivers counted {service.total.commits:,} lifecycle commits,"
        f" PostgreSQL counted {service.postgres_counted:,} commits in the bench database"
        f" (+{service.postgres_counted - service.total.commits:,}: the pool's check query per"
        f" checkout, NOTIFY doorbells, hub polls, the final snapshots)",
        f"  cross-check: {service.lanes_checked} lanes, sum of snapshot revisions"
        f" {service.snapshot_revisions:,}, sum of revisions seen by drivers"
        f" {service.total.revisions:,}: "
        + ("OK" if not service.mismatches else "MISMATCH\n    " + mismatches),
        "",
        "  RPC latency in the window (ms):        count     p50     p90     p99",
    ]
    for method, values in sorted(service.latencies.items()):
        lines.append(
            f"    {method:<32} {len(values):>9,} {_percentile(values, 0.5) * 1e3:>7.2f}"
            f" {_percentile(values, 0.9) * 1e3:>7.2f} {_percentile(values, 0.99) * 1e3:>7.2f}"
        )
    return "\n".join(lines)


def _watchers_ok(result: ServiceResult) -> bool:
    fleet = result.fleet
    return fleet is not None and not fleet.errors and not fleet.behind


def watchers_report(
    args: argparse.Namespace, without: ServiceResult, watched: ServiceResult
) -> str:
    """The service phase with watchers beside the one without, and the drop."""
    fleet = watched.fleet
    assert fleet is not None
    drop = 1.0 - watched.commits_per_second / without.commits_per_second
    met = "met" if drop <= TARGET_WATCHER_DROP else "NOT met"
    if args.watchers < TARGET_WATCHERS:
        met += f" (with {args.watchers:,} watchers, not the target's {TARGET_WATCHERS:,})"
    lanes = (
        f"spread over the {args.drivers} drivers' lanes"
        if args.watch_lanes == "driven"
        else f"one each on {args.watchers:,} idle lanes"
    )
    width = 46

    def per_commit(result: ServiceResult, name: str) -> str:
        cores = result.cpu.processes.get(name)
        if cores is None or not result.commits_per_second:
            return "-"
        return f"{cores / result.commits_per_second * 1e6:,.0f} µs"

    rows = [
        (
            "service: lifecycle commits/s",
            f"{without.commits_per_second:,.0f}",
            f"{watched.commits_per_second:,.0f}",
        ),
        (
            "service: tool calls/s",
            f"{without.window.tool_calls / without.seconds:,.1f}",
            f"{watched.window.tool_calls / watched.seconds:,.1f}",
        ),
        (
            "server CPU (cores)",
            f"{without.cpu.processes['server']:.2f}",
            f"{watched.cpu.processes['server']:.2f}",
        ),
        ("server CPU per commit", per_commit(without, "server"), per_commit(watched, "server")),
        (
            "PostgreSQL CPU per commit",
            per_commit(without, "PostgreSQL"),
            per_commit(watched, "PostgreSQL"),
        ),
        (
            "gRPC ceiling: Health.Check RPCs/s",
            f"{without.grpc_ceiling:,.0f}",
            f"{watched.grpc_ceiling:,.0f}",
        ),
    ]
    lines = [
        f"with watchers: {args.watchers:,} WatchLane streams {lanes}, over"
        f" {args.watcher_channels} channels, in a process of their own; a fresh service process",
        "",
        f"  {'':<{width}} {'0 watchers':>14} {f'{args.watchers:,} watchers':>16}",
        *(f"  {label:<{width}} {a:>14} {b:>16}" for label, a, b in rows),
        f"  {'drop of commits/s':<{width}} {'':>14} {drop * 100:>15.1f}%",
        f"  DESIGN.md §8 target: drop <= {TARGET_WATCHER_DROP * 100:.0f} %: {met}",
        "",
        f"  watchers attached in {watched.fleet_ready_seconds:.1f} s; in the window they received"
        f" {fleet.window_groups:,} event groups ({fleet.window_events:,} events),"
        f" {fleet.window_groups / max(fleet.window_seconds, 1e-9):,.0f} groups/s",
        "  delivery in the window, commit_time -> receive (ms): "
        + (
            f"p50 {fleet.latency['p50'] * 1e3:.1f}, p90 {fleet.latency['p90'] * 1e3:.1f},"
            f" p99 {fleet.latency['p99'] * 1e3:.1f}, max {fleet.latency['max'] * 1e3:.1f}"
            if fleet.latency["count"]
            else "nothing was received"
        )
        + f"; watchers' event-loop lag p99 {fleet.loop_lag['p99'] * 1e3:.1f} ms",
        f"  convergence: {len(fleet.watchers) - len(fleet.behind) - len(fleet.errors):,} of"
        f" {len(fleet.watchers):,} watchers reached their lane's last revision"
        f" ({fleet.drain_seconds:.1f} s after the drivers stopped); {len(fleet.errors)} failed: "
        + ("OK" if _watchers_ok(watched) else "FAILED"),
        *(f"    {error}" for error in fleet.errors[:10]),
        *(
            f"    {w.lane_id}: at revision {w.revision}, expected {w.expect}"
            for w in fleet.behind[:10]
        ),
        f"  cross-check: {watched.lanes_checked} lanes, sum of snapshot revisions"
        f" {watched.snapshot_revisions:,}, sum seen by drivers {watched.total.revisions:,}: "
        + ("OK" if not watched.mismatches else "MISMATCH"),
        f"  {watched.cpu.describe()}",
        "  "
        + watched.cpu.per_commit(
            watched.commits_per_second, "server", "PostgreSQL", "drivers", "watchers"
        ),
        f"  PostgreSQL counted {watched.postgres_counted:,} commits over the whole phase"
        f" ({watched.postgres_counted / max(watched.total.commits, 1):.1f} per lifecycle commit;"
        f" without watchers {without.postgres_counted / max(without.total.commits, 1):.1f};"
        " this includes creating the watched lanes and the watchers' snapshots)",
        "",
        "  RPC latency in the window (ms):        count     p50     p90     p99",
    ]
    for method, values in sorted(watched.latencies.items()):
        lines.append(
            f"    {method:<32} {len(values):>9,} {_percentile(values, 0.5) * 1e3:>7.2f}"
            f" {_percentile(values, 0.9) * 1e3:>7.2f} {_percentile(values, 0.99) * 1e3:>7.2f}"
        )
    return "\n".join(lines)


# -- entry point ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.commit_throughput",
        description="Lifecycle commits/s through gRPC versus PostgreSQL's single-row commit rate.",
    )
    parser.add_argument("--drivers", type=int, default=8, help="concurrency N (default 8)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="measured window per phase (default 10)"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="service warm-up before the window (default 2)"
    )
    add_database_url(parser)
    parser.add_argument(
        "--baseline",
        choices=sorted(_BASELINE_STATEMENTS),
        default="insert",
        help="the baseline's single-row statement (default insert)",
    )
    parser.add_argument("--calls", type=int, default=4, help="tool calls per turn (default 4)")
    parser.add_argument(
        "--turns", type=int, default=5, help="tool turns per run before EndRun (default 5)"
    )
    parser.add_argument(
        "--request-ids",
        action="store_true",
        help="send a request_id with every command (idempotent retries cost a read and a write)",
    )
    parser.add_argument(
        "--notify", choices=("on", "off"), default="on", help="the service's LANE_NOTIFY"
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="profile the server with py-spy during the window (FILE.svg: flame graph,"
        " FILE.json: speedscope, else collapsed stacks); profiling slows the server",
    )
    parser.add_argument(
        "--single-baseline",
        action="store_true",
        help="measure the baseline only before the service (default: before and after)",
    )
    parser.add_argument(
        "--watchers",
        type=int,
        default=0,
        metavar="W",
        help="also measure the service with W WatchLane streams attached (a second service"
        " phase after the one without) and print the drop (default 0: not)",
    )
    parser.add_argument(
        "--watch-lanes",
        choices=("driven", "idle"),
        default="driven",
        help="the watchers' lanes: spread evenly over the drivers' lanes (driven, the default),"
        " or one each on lanes nobody commits to (idle)",
    )
    parser.add_argument(
        "--watcher-channels",
        type=int,
        default=8,
        help="channels (connections) the watchers are spread over (default 8)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=120.0,
        help="how long the watchers may take to catch up after the window (default 120)",
    )
    args = parser.parse_args(argv)
    if args.drivers < 1 or args.calls < 1 or args.turns < 1:
        parser.error("--drivers, --calls and --turns must be at least 1")
    if args.watchers < 0 or args.watcher_channels < 1:
        parser.error("--watchers must be >= 0 and --watcher-channels >= 1")
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be > 0 and --warmup >= 0")
    return args


async def run(args: argparse.Namespace) -> int:
    async with contextlib.AsyncExitStack() as stack:
        work_dir = Path(tempfile.mkdtemp(prefix="lane-bench-"))
        stack.callback(shutil.rmtree, work_dir, ignore_errors=True)
        db = await stack.enter_async_context(provision_database(args.database_url))
        print(f"PostgreSQL {db.version} ready ({db.description}); baseline first ...", flush=True)
        baselines = [await run_baseline(db, args.drivers, args.seconds, args.baseline, work_dir)]
        rate = baselines[0].commits_per_second
        print(f"baseline: {rate:,.0f} commits/s; service ...", flush=True)
        async with run_service(db.url, args.notify == "on") as service:
            cpu_processes = {"server": service.pid, "drivers": os.getpid()}
            result = await run_service_load(db, args, cpu_processes, service.address)
            rate = result.commits_per_second
            print(f"service: {rate:,.0f} commits/s; stopping it ...", flush=True)
        watched: ServiceResult | None = None
        if args.watchers:
            # A fresh service process, so the second phase inherits nothing from the first.
            print(f"service again, with {args.watchers:,} watchers ...", flush=True)
            async with run_service(
                db.url, args.notify == "on", _watcher_limits(args.watchers, args.drivers)
            ) as watched_service:
                cpu_processes = {"server": watched_service.pid, "drivers": os.getpid()}
                watched = await run_service_load(
                    db, args, cpu_processes, watched_service.address, watchers=args.watchers
                )
                rate = watched.commits_per_second
                print(f"service with watchers: {rate:,.0f} commits/s; stopping it ...", flush=True)
        if not args.single_baseline:
            # Again after the service stopped: the machine's load drifts (a shared machine),
            # and the mean of before and after brackets the service's window.
            print("baseline again ...", flush=True)
            baselines.append(
                await run_baseline(db, args.drivers, args.seconds, args.baseline, work_dir)
            )
        print()
        print(report(args, db, service.pid, baselines, result))
        if watched is not None:
            print()
            print(watchers_report(args, result, watched))
    failed = bool(result.mismatches)
    if watched is not None:
        failed = failed or bool(watched.mismatches) or not _watchers_ok(watched)
    return 1 if failed else 0


def _watcher_limits(watchers: int, drivers: int) -> dict[str, str]:
    """The service's watcher limits, raised when the run needs more than the defaults."""
    return {
        "LANE_MAX_WATCHERS": str(max(10_000, watchers)),
        "LANE_MAX_WATCHERS_PER_LANE": str(max(1000, math.ceil(watchers / drivers))),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
