"""Commit throughput: lifecycle commits/s through gRPC versus PostgreSQL's own commit rate.

Run from the repository root (virtualenv active)::

    python -m bench.commit_throughput [--drivers N] [--seconds S] [--workers K] [--compare REF]

The target: "lifecycle commits/s through gRPC >= 0.5 x PostgreSQL's own single-row commit rate
(pgbench) at the same concurrency on the same machine". One run measures both, one after the
other, on the same PostgreSQL:

1. **Baseline.** ``pgbench -n -c N -j N -T S -f script`` where the script is one single-row
   ``INSERT`` (or, with ``--baseline update``, an ``UPDATE`` of the client's own row) per
   transaction. Without ``pgbench`` on PATH, N threads with one psycopg connection each run the
   same statement in autocommit for S seconds. Measured before the service phase and again
   after it (``--single-baseline``: before only); the ratio uses their mean, since the load
   of a shared machine drifts.
2. **Service.** The real service runs as a **subprocess** (``python -m lane.server.app`` with
   ``LANE_DATABASE_URL``, ``LANE_LISTEN`` and ``LANE_WORKERS=K``, ``--workers``: with K > 1 a
   supervisor and K worker processes on one port), so the load generator does not share its
   event loop or GIL; the measured figure is the service's, not the service's minus the
   driver's Python time. N drivers (``grpc.aio`` tasks in this process, on one channel, or
   with K > 1 one channel each so the kernel spreads their connections over the workers), each
   on its own lane, repeat a run: StartRun, then ``--turns`` turns of StartTurn,
   SettleAssistantMessage with ``--calls`` tool calls, and for each call StartToolCall,
   UpdateToolCall x 2, StageToolOutcome; then a final turn with a text-only answer and EndRun.
   Every RPC is one commit, StageToolOutcome two (staging, then placement in a second
   transaction). After a warm-up the counters are read at the start and end of an S-second
   window. Before the drivers start, a short burst of Health.Check RPCs at the same
   concurrency gives the gRPC ceiling: what the service answers with no database work at all.

3. **Replay** (``--replay``, on by default; ``--no-replay`` skips it). After the first
   baseline, pgbench replays the service's own statements for the same lifecycle with no
   Python in the loop: :mod:`bench.replay` runs the domain functions in this process and
   records each commit's statement with the store's ``commit_statement`` (the optimistic path:
   one statement per commit), and ``pgbench -M prepared`` runs them, one run of the lifecycle
   per pgbench transaction, each statement in autocommit, on a lane and in a namespace of its
   own per run, on a scratch database with the service's schema. Replayed commits/s beside the
   service's and the single-row baseline's split the service's cost into its SQL's (replay /
   baseline) and its own (service / replay); PostgreSQL CPU per commit is printed for all
   three.

Cross-checks printed with the result: the lane revisions advanced (from the RPC answers, and
at the end from GetLaneSnapshot of every lane: they must agree, else the exit status is 1),
and PostgreSQL's own count of committed transactions in the bench database over each whole
phase (``pg_stat_database.xact_commit``), which also shows the transactions the service runs
besides the lifecycle commits (doorbells when another process listens, upkeep, the final
snapshots). Over the window itself: PostgreSQL transactions and rows written per lifecycle
commit (``pg_stat_database``) and, when the server has ``pg_stat_statements`` (preloaded for
an embedded server whose build ships it), statements per lifecycle commit. CPU use (the
server's whole process tree, drivers or pgbench, the PostgreSQL cluster, the rest of the
machine) is read from /proc over each window, also as CPU time per commit, which varies less
than the rates when other work shares the machine. ``--py-spy FILE`` profiles the server
during the window.

``--compare REF`` measures the service of a git ref too, in the same run, before the working
tree's: ``git archive REF`` into a temporary directory and the ref's server started there,
``python -m lane.server.app`` from its ``service/`` directory (or, for a ref from before the
server package was renamed, ``python -m service.app`` from its root): its own server package
wins, as ``-m`` puts the working directory first on ``sys.path``; the ``lane`` client packages
are the working tree's. It runs on a scratch database of its own on the same server, given only
the ``LANE_*`` settings its code knows. Both phases are printed side by side with the ratio
current / ref.

``--watchers W`` (target: "with 1,000 watchers attached it drops by <= 10 %") adds a further
service phase, on a fresh service process, with W WatchLane streams attached before the
drivers start: spread evenly over the drivers' lanes (``--watch-lanes driven``, the default),
or one each on W lanes nobody commits to (``idle``). The watchers run in a process of their own
(:mod:`bench.watchers`) and read everything; each must end at its lane's last revision (else
the exit status is 1). A second block shows both phases side by side and the drop of
commits/s.

PostgreSQL is the one at ``--database-url`` (its role needs CREATEDB: a scratch database is
created and dropped), else an embedded pgserver in a temporary directory that is removed after.
Every process and directory started here is stopped and removed on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.errors import lane_error
from lane.client.session import LaneSession
from lane.v1 import (
    lane_service_pb2 as pb,
)
from lane.v1 import (
    lane_service_pb2_grpc,
    snapshot_pb2,
)
from psycopg import sql

from bench import replay
from bench.entry import (
    add_database_url,
    add_server_options,
    open_channels,
    run_benchmark,
    server_tree,
    stop_process,
)
from bench.watchers import Fleet, FleetResult, start_fleet
from lane.server.testing import scratch_database as lane_scratch_database

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.5  # the target: service commits/s >= 0.5 x pgbench's
TARGET_WATCHERS = 1000  # the target: "with 1,000 watchers attached it drops by <= 10 %"
TARGET_WATCHER_DROP = 0.10
RPC_TIMEOUT_SECONDS = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# "lane service listening on ADDRESS (transport); database: ..." (older services: "ADDRESS;").
_LISTENING = re.compile(r"lane service listening on (\S+?)(?:;| \()")

Response = TypeVar("Response")
#: Codes :class:`Retries` retries: the server or its database was busy or restarting (with a
#: request id, a retry of a command that did commit returns its first answer).
RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


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


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_tree(root: int, children: Mapping[int, list[int]] | None = None) -> list[int]:
    """``root`` and its live descendants (a supervisor and its workers)."""
    children = _children_by_parent() if children is None else children
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _tree_ticks(root: int, children: Mapping[int, list[int]]) -> int:
    """CPU ticks of ``root`` and every descendant: the live ones' own, and through each one's
    cutime/cstime those it has reaped (a worker replaced during the window still counts)."""
    ticks = 0
    for pid in process_tree(root, children):
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += sum(int(v) for v in fields[11:15])
    return ticks


def cpu_sample(
    processes: Mapping[str, int],
    postmaster: int | None = None,
    trees: Mapping[str, int] | None = None,
) -> CpuSample:
    """Sample system ticks, the ticks of each named pid, of each named process tree (``trees``:
    the root and all its descendants) and of the cluster of ``postmaster`` (reported as
    "PostgreSQL")."""
    busy, total = _system_ticks()
    ticks = {name: _process_ticks(pid) for name, pid in processes.items()}
    if trees:
        children = _children_by_parent()
        ticks.update({name: _tree_ticks(pid, children) for name, pid in trees.items()})
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
    #: The server's URL (another scratch database can be made there: :func:`scratch_database`).
    server_url: str = ""
    #: None when ``pg_stat_statements`` counts this database's statements, else why it cannot.
    no_statements: str | None = None


#: The extension that counts statements; it must be in ``shared_preload_libraries``.
STATEMENTS_EXTENSION = "pg_stat_statements"


@contextlib.asynccontextmanager
async def provision_database(server_url: str | None) -> AsyncIterator[Database]:
    """A scratch database on ``server_url`` (else on an embedded pgserver in a temp dir)."""
    async with contextlib.AsyncExitStack() as stack:
        if server_url is None:
            # Imported here: the service's own helper for pgserver (unprivileged user as root,
            # quiet platformdirs warning). Only needed without a URL.
            from lane.server.app.embedded import start_embedded

            temp_dir = Path(tempfile.mkdtemp(prefix="lane-bench-pg-"))
            stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)
            embedded = await asyncio.to_thread(start_embedded, temp_dir)
            stack.push_async_callback(asyncio.to_thread, embedded.stop)
            if await _preload_statements(embedded.uri):
                # shared_preload_libraries takes effect on a restart only. stop() is
                # idempotent: the callback above then does nothing.
                await asyncio.to_thread(embedded.stop)
                embedded = await asyncio.to_thread(start_embedded, temp_dir)
                stack.push_async_callback(asyncio.to_thread, embedded.stop)
            server_url, description = embedded.uri, "embedded pgserver in a temp dir"
        else:
            description = "--database-url"
        yield await stack.enter_async_context(scratch_database(server_url, description))


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, description: str) -> AsyncIterator[Database]:
    """A database ``lane_bench_<hex>`` created on ``server_url``, dropped on exit."""
    async with lane_scratch_database(server_url, prefix="lane_bench") as url:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            settings = {}
            for setting in ("server_version", "fsync", "synchronous_commit"):
                cur = await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting)))
                row = await cur.fetchone()
                settings[setting] = str(row[0]) if row else "?"
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            postmaster = _local_postmaster(int(row[0])) if row else None
        yield Database(
            url=url,
            description=description,
            version=settings["server_version"],
            fsync=settings["fsync"],
            synchronous_commit=settings["synchronous_commit"],
            postmaster=postmaster,
            server_url=server_url,
            no_statements=await _statements_extension(url),
        )


async def _preload_statements(server_url: str) -> bool:
    """Add pg_stat_statements to ``shared_preload_libraries`` (ALTER SYSTEM) if the server
    ships it and does not load it yet; True when the server must restart for it."""
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = %s", (STATEMENTS_EXTENSION,)
        )
        if await cur.fetchone() is None:
            return False
        cur = await conn.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")
        row = await cur.fetchone()
        if row is None or not (Path(row[0]) / f"{STATEMENTS_EXTENSION}.so").exists():
            return False
        cur = await conn.execute("SELECT current_setting('shared_preload_libraries')")
        row = await cur.fetchone()
        loaded = [lib.strip() for lib in str(row[0] if row else "").split(",") if lib.strip()]
        if STATEMENTS_EXTENSION in loaded:
            return False
        await conn.execute(
            sql.SQL("ALTER SYSTEM SET shared_preload_libraries = {}").format(
                sql.Literal(", ".join([*loaded, STATEMENTS_EXTENSION]))
            )
        )
    return True


async def _statements_extension(url: str) -> str | None:
    """Create pg_stat_statements in the database ``url`` names; None when it counts there,
    else why not."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = %s", (STATEMENTS_EXTENSION,)
        )
        if await cur.fetchone() is None:
            return f"{STATEMENTS_EXTENSION} is not installed in this PostgreSQL"
        try:
            await conn.execute(
                sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(
                    sql.Identifier(STATEMENTS_EXTENSION)
                )
            )
            await conn.execute("SELECT count(*) FROM pg_stat_statements")
        except psycopg.Error as err:
            return f"{STATEMENTS_EXTENSION} unusable: {str(err).strip().splitlines()[0]}"
    return None


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


@dataclass(frozen=True)
class DbCounters:
    """Cumulative counters of the bench database (read at the window's start and end)."""

    #: ``pg_stat_database.xact_commit``.
    transactions: int
    #: ``tup_inserted + tup_updated + tup_deleted``: rows written.
    rows_written: int
    #: Statements executed (``pg_stat_statements`` calls, this database), None without it.
    statements: int | None
    #: Of those, the times the planner ran, and the milliseconds spent planning and executing
    #: (``pg_stat_statements`` plans, total_plan_time, total_exec_time; 0 without it).
    plans: int = 0
    plan_ms: float = 0.0
    exec_ms: float = 0.0

    def __sub__(self, other: DbCounters) -> DbCounters:
        statements = (
            None
            if self.statements is None or other.statements is None
            else self.statements - other.statements
        )
        return DbCounters(
            self.transactions - other.transactions,
            self.rows_written - other.rows_written,
            statements,
            self.plans - other.plans,
            self.plan_ms - other.plan_ms,
            self.exec_ms - other.exec_ms,
        )


async def read_db_counters(conn: psycopg.AsyncConnection[Any], statements: bool) -> DbCounters:
    """The bench database's counters. pg_stat_database lags by up to about a second (backends
    flush their counts at most once a second); over a steady window the lag at either end
    cancels out. pg_stat_statements does not lag."""
    cur = await conn.execute(
        "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted"
        " FROM pg_stat_database WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    transactions, rows = (int(row[0]), int(row[1])) if row else (0, 0)
    if not statements:
        return DbCounters(transactions, rows, None)
    cur = await conn.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(plans), 0),"
        " coalesce(sum(total_plan_time), 0), coalesce(sum(total_exec_time), 0)"
        " FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    row = await cur.fetchone()
    if row is None:
        return DbCounters(transactions, rows, 0)
    return DbCounters(transactions, rows, int(row[0]), int(row[1]), float(row[2]), float(row[3]))


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


async def run_pgbench(
    db: Database, command: Sequence[str], label: str, env: Mapping[str, str] | None = None
) -> tuple[int, float, CpuUse]:
    """Run pgbench ``command`` to its end: the transactions it processed, its rate (its
    ``tps`` line) and the CPU it and the cluster used (sampled once the cluster's backends
    have exited, so their time is counted). ``label`` names it when it fails."""
    times_before = os.times()
    children_before = _cluster_children(db.postmaster)
    sample = cpu_sample({}, db.postmaster)
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
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
        raise RuntimeError(f"{label} failed (exit {process.returncode}):\n{output}")
    await settle_cluster(db.postmaster, children_before)
    after = cpu_sample({}, db.postmaster)
    times_after = os.times()
    child = (times_after.children_user - times_before.children_user) + (
        times_after.children_system - times_before.children_system
    )
    use = cpu_use(sample, after, {"pgbench": child})
    return int(processed.group(1)), float(tps.group(1)), use


async def run_baseline(
    db: Database, clients: int, seconds: float, statement: str, work_dir: Path
) -> Baseline:
    """PostgreSQL's single-row commit rate at ``clients`` connections for ``seconds``."""
    await _prepare_baseline_table(db.url, clients)
    pgbench = shutil.which("pgbench")
    before_commits = await committed_transactions(db.url)
    if pgbench is not None:
        script = work_dir / f"baseline_{statement}.sql"
        script.write_text(_BASELINE_STATEMENTS[statement] + "\n")
        command = [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients)]
        command += ["-T", str(max(1, round(seconds))), "-f", str(script), db.url]
        transactions, rate, use = await run_pgbench(db, command, "pgbench")
        method = f"pgbench -M prepared -c {clients} -j {clients} -T {round(seconds)}, {statement}"
    else:
        times_before = os.times()
        children_before = _cluster_children(db.postmaster)
        sample = cpu_sample({}, db.postmaster)
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


# -- replay: the service's own SQL, by pgbench --------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """pgbench replaying the statements of the drivers' lifecycle run (:mod:`bench.replay`)."""

    method: str
    #: Consecutive statements committed per transaction.
    commits_per_transaction: int
    #: Complete runs of the script (pgbench's transactions) and their lifecycle commits.
    runs: int
    commits: int
    commits_per_second: float
    #: Lifecycle commits and PostgreSQL transactions per run of the script.
    commits_per_run: int
    transactions_per_run: int
    postgres_counted: int
    cpu: CpuUse
    #: The replay database's counters over the pgbench run.
    db: DbCounters
    no_statements: str | None
    #: Lanes at the version and revision of a complete run, lanes short of it, all lanes.
    complete: int
    short: int
    lanes: int
    clients: int
    #: Bytes of the ``-D`` definitions (the recorded values) on pgbench's command line.
    define_bytes: int
    variables: int

    @property
    def ok(self) -> bool:
        """Every run pgbench counted reached the recorded run's version (so every statement
        wrote: a version check that failed would leave the lane short, and every later
        statement of the run would fail too), and at most one run per client was cut short."""
        return self.complete == self.runs and self.lanes - self.complete <= self.clients

    def per_commit(self, value: int | None) -> float | None:
        if value is None or not self.commits:
            return None
        return value / self.commits


async def run_replay(
    db: Database, args: argparse.Namespace, work_dir: Path, commits_per_transaction: int = 1
) -> Replay | str:
    """pgbench replaying the service's statements for the drivers' lifecycle at
    ``--drivers`` clients for ``--seconds``, ``commits_per_transaction`` consecutive statements
    per transaction, on a scratch database of its own with the service's schema; or why it
    cannot run."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return "no pgbench on PATH"
    # Imported here: only the replay needs the service's migrations in this process.
    from lane.server.store.migrations import migrate

    recorded = replay.record(f"bench-{uuid.uuid4().hex[:12]}", args.calls, args.turns)
    script = replay.replay_script(recorded, commits_per_transaction)
    path = work_dir / "replay.sql"
    path.write_text(script.text)
    clients = args.drivers
    async with scratch_database(db.server_url, db.description) as replay_db:
        async with await psycopg.AsyncConnection.connect(replay_db.url, autocommit=True) as conn:
            await migrate(conn)
        env = dict(os.environ)
        # The service's connections say they bump lane versions themselves (schema 0005);
        # without it the triggers would bump them again and the version checks would fail.
        env["PGOPTIONS"] = " ".join(
            part for part in (env.get("PGOPTIONS", ""), "-c lane.writer=service") if part
        )
        command = [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients)]
        command += ["-T", str(max(1, round(args.seconds))), *script.arguments()]
        command += ["-f", str(path), replay_db.url]
        statements = replay_db.no_statements is None
        async with await psycopg.AsyncConnection.connect(replay_db.url, autocommit=True) as conn:
            counters_before = await read_db_counters(conn, statements)
            perf = asyncio.ensure_future(
                start_perf(
                    args.perf_postgres,
                    f"replay-{commits_per_transaction}",
                    args.seconds - 2,
                    db.postmaster,
                    delay=1.0,
                )
            )
            runs, tps, use = await run_pgbench(db, command, "pgbench (replay)", env)
            recording = await perf
            if recording is not None:
                await recording.wait()
            await asyncio.sleep(1.5)  # as counted_commits: let the stats settle
            counters = await read_db_counters(conn, statements) - counters_before
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE version = %s AND revision = %s), count(*)"
                " FROM lanes",
                (script.version_after, script.revision_after),
            )
            row = await cur.fetchone()
            complete, lanes = (int(row[0]), int(row[1])) if row else (0, 0)
    return Replay(
        commits_per_transaction=commits_per_transaction,
        method=f"pgbench -M prepared -c {clients} -j {clients} -T {round(args.seconds)}"
        + (
            f", {commits_per_transaction} commits per transaction"
            if commits_per_transaction > 1
            else ""
        ),
        runs=runs,
        commits=runs * script.commits,
        commits_per_second=tps * script.commits,
        commits_per_run=script.commits,
        transactions_per_run=script.transactions,
        postgres_counted=counters.transactions,
        cpu=use,
        db=counters,
        no_statements=replay_db.no_statements,
        complete=complete,
        short=lanes - complete,
        lanes=lanes,
        clients=clients,
        define_bytes=script.define_bytes,
        variables=len(script.variables),
    )


def replay_lines(result: Replay) -> list[str]:
    """The replay's block of the report."""
    db = result.db
    statements = (
        f"statements {_ratio(result.per_commit(db.statements))} (pg_stat_statements calls),"
        f" planned {_ratio(result.per_commit(db.plans))} times, planning"
        f" {_ratio(result.per_commit(round(db.plan_ms * 1000)), 0)} µs and executing"
        f" {_ratio(result.per_commit(round(db.exec_ms * 1000)), 0)} µs (wall time)"
        if result.no_statements is None
        else f"statements: unavailable ({result.no_statements})"
    )
    extra = result.postgres_counted - result.runs * result.transactions_per_run
    transactions = _ratio(result.per_commit(db.transactions))
    rows = _ratio(result.per_commit(db.rows_written))
    verdict = "OK" if result.ok else "FAILED (a statement wrote nothing: the replay is not valid)"
    return [
        f"replay of the service's SQL: {result.method}; one run of the script = the run's lane"
        f" created (1 transaction) and {result.commits_per_run} statements, each its own commit:"
        f" {result.runs:,} runs, {result.commits:,} lifecycle commits; PostgreSQL counted"
        f" {result.postgres_counted:,} commits ({result.transactions_per_run} per run, +{extra:,}:"
        " pgbench preparing each statement once per connection, each an implicit transaction,"
        " and the bench's own queries)",
        f"  {result.cpu.describe()}",
        f"  {result.cpu.per_commit(result.commits_per_second, *result.cpu.processes)}"
        " (per lifecycle commit, the lane's creation included)",
        f"  per lifecycle commit: PostgreSQL transactions {transactions}, rows written {rows};"
        f" {statements}",
        f"  recorded values: {result.variables:,} pgbench variables, {result.define_bytes:,} bytes"
        " of -D arguments",
        f"  check: {result.complete:,} lanes at the recorded run's version and revision, pgbench"
        f" counted {result.runs:,} runs; {result.short} lanes short of it (runs cut by the end,"
        f" at most {result.clients}): {verdict}",
    ]


# -- the service subprocess -----------------------------------------------------------------


@dataclass
class ServiceProcess:
    process: asyncio.subprocess.Process
    address: str
    log_tail: list[str]
    reader: asyncio.Task[None]
    #: The directory it runs in (the working tree, or a ref's archive).
    root: Path
    #: Server processes: K workers under a supervisor, or 1 (a single process).
    workers: int
    #: Settings this service's code does not know, so they were not passed.
    not_passed: list[str]

    @property
    def pid(self) -> int:
        """The process started: the single server process, or the supervisor."""
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def worker_pids(self) -> list[int]:
        """The server processes that serve: the workers (the supervisor's children), or the
        single process."""
        if self.workers == 1:
            return [self.pid]
        return sorted(_children_by_parent().get(self.pid, []))


_SETTING = re.compile(r"\bLANE_[A-Z][A-Z0-9_]*")
#: "[worker K pid P]", the tag of a worker's log lines (text format).
_WORKER_TAG = re.compile(r"\[worker (\d+) pid (\d+)\]")


def known_settings(root: Path) -> frozenset[str]:
    """The ``LANE_*`` names the service code under ``root`` mentions (the settings it knows)."""
    names: set[str] = set()
    for path in server_tree(root).directory.rglob("*.py"):
        names.update(_SETTING.findall(path.read_text(errors="replace")))
    return frozenset(names)


@contextlib.asynccontextmanager
async def run_service(
    database_url: str,
    notify: bool,
    extra_env: Mapping[str, str] | None = None,
    *,
    workers: int = 1,
    root: Path = REPO_ROOT,
    python: str = sys.executable,
) -> AsyncIterator[ServiceProcess]:
    """The server of the checkout at ``root`` (``python -m lane.server.app``, or an older
    checkout's ``python -m service.app``: :func:`bench.entry.server_tree`) on a free port of
    127.0.0.1; SIGTERM (then SIGKILL) on exit. ``extra_env``: more ``LANE_*`` settings; ``workers``:
    ``LANE_WORKERS``; ``python``: the interpreter it runs on (this one unless given). Only the
    settings the code in ``root`` knows are passed (an older ref's service does not know the
    newer ones); yields once every server process listens."""
    settings = {
        "LANE_DATABASE_URL": database_url,
        "LANE_LISTEN": "127.0.0.1:0",
        "LANE_NOTIFY": "on" if notify else "off",
        "LANE_GRACE_SECONDS": "1",
        "LANE_LOG_FORMAT": "text",  # the start-up lines are read below
        "LANE_WORKERS": str(workers),
        **(extra_env or {}),
    }
    server = server_tree(root)
    known = known_settings(root)
    env = dict(os.environ)
    not_passed = []
    for name, value in settings.items():
        if name in known:
            env[name] = value
        else:
            not_passed.append(name)
            env.pop(name, None)
    if root != REPO_ROOT:
        # Let the ref's service write bytecode into its (temporary) tree: the proof that its
        # modules came from there (verify_ref_service).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # And its own generated code and client package (lane.v1, lane.limits), not the
        # installed working tree's: the contract may have grown since (new methods).
        env["PYTHONPATH"] = os.pathsep.join(
            part for part in (str(root / "clients" / "python"), env.get("PYTHONPATH")) if part
        )
    # LANE_WORKERS defaults to the number of CPUs where it is known: always pass it there.
    servers = workers if "LANE_WORKERS" in known else 1
    process = await asyncio.create_subprocess_exec(
        python,
        "-m",
        server.app,
        cwd=server.cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    tail: list[str] = []

    async def read_log() -> None:
        # Keep draining stderr for the process's whole life so it never blocks on a full pipe.
        # A single process logs "lane service listening on ADDRESS"; a supervisor logs that it
        # starts K workers, then each worker logs the same line tagged [worker K pid P].
        assert process.stderr is not None
        serving: set[str] = set()
        async for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            del tail[:-40]
            found = _LISTENING.search(line)
            if found and not listening.done():
                tag = _WORKER_TAG.search(line)
                serving.add(tag.group(1) if tag else "")
                if len(serving) >= servers:
                    listening.set_result(found.group(1))
        if not listening.done():
            listening.set_exception(
                RuntimeError("the service exited before listening:\n" + "\n".join(tail))
            )

    reader = asyncio.create_task(read_log())
    try:
        async with asyncio.timeout(60):
            address = await listening
        yield ServiceProcess(process, address, tail, reader, root, servers, not_passed)
    finally:
        await stop_process(process)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


def connections_per_worker(service: ServiceProcess) -> list[int]:
    """Established TCP connections to the service's port held by each server process (how
    the kernel spread the clients' connections over the workers)."""
    sockets: dict[int, int] = {}  # socket inode -> worker index
    pids = service.worker_pids()
    for index, pid in enumerate(pids):
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        sockets[int(target[8:-1])] = index
    counts = [0] * len(pids)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines, None)
            for line in lines:
                fields = line.split()
                # local_address is HEXIP:HEXPORT; state 01 is ESTABLISHED; inode is field 9.
                if fields[3] != "01" or int(fields[1].rpartition(":")[2], 16) != service.port:
                    continue
                index = sockets.get(int(fields[9]), -1)
                if index >= 0:
                    counts[index] += 1
    return counts


# -- a git ref's service ----------------------------------------------------------------------


@dataclass(frozen=True)
class RefTree:
    """A ref's tree, unpacked from ``git archive``."""

    ref: str
    commit: str
    subject: str
    root: Path

    @property
    def label(self) -> str:
        return f"ref {self.commit[:7]}"


async def _git(*args: str) -> bytes:
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {err.decode(errors='replace').strip()}")
    return out


async def unpack_ref(ref: str, work_dir: Path) -> RefTree:
    """``git archive REF`` unpacked under ``work_dir`` (read-only git commands only)."""
    commit = (await _git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")).decode()
    commit = commit.strip()
    subject = (await _git("log", "-1", "--format=%s", commit)).decode().strip()
    root = work_dir / f"ref-{commit[:12]}"
    root.mkdir()
    archive = await _git("archive", "--format=tar", commit)
    tar = await asyncio.create_subprocess_exec(
        "tar",
        "-x",
        "-C",
        str(root),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await tar.communicate(archive)
    if tar.returncode != 0:
        raise RuntimeError(f"unpacking {ref}: {err.decode(errors='replace').strip()}")
    try:
        server_tree(root)
    except RuntimeError as error:
        raise RuntimeError(f"{ref} ({commit[:7]}): {error}") from None
    return RefTree(ref, commit, subject, root)


async def ref_package_path(tree: RefTree) -> str:
    """Where the ref's server package (``lane.server``, or ``service`` before the rename)
    resolves from the directory its server is started in, as it does for ``python -m
    {package}.app`` started there; it must be the ref's tree."""
    server = server_tree(tree.root)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"import sys, {server.package} as p; sys.stdout.write(p.__file__ or '')",
        cwd=server.cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    path = out.decode().strip()
    if not _inside(path, tree.root):
        raise RuntimeError(
            f"{tree.label}: `import {server.package}` there finds {path!r}, not the ref's"
        )
    return path


def _inside(path: str, root: Path) -> bool:
    return bool(path) and Path(path).resolve().is_relative_to(root.resolve())


def verify_ref_service(tree: RefTree, service: ServiceProcess) -> str:
    """Check that the running ref service is the ref's code; describe it for the log."""
    server = server_tree(tree.root)
    cwd = os.readlink(f"/proc/{service.pid}/cwd")
    if Path(cwd).resolve() != server.cwd.resolve():
        raise RuntimeError(f"{tree.label}: the service runs in {cwd}, not in {server.cwd}")
    # Nothing but that process imports {package}.app.* from the ref's tree (run_service lets it
    # write bytecode): bytecode written there means its modules came from there.
    compiled = list((server.directory / "app" / "__pycache__").glob("*.pyc"))
    if not compiled:
        raise RuntimeError(f"{tree.label}: the service compiled nothing under {tree.root}")
    modules = len(list(server.directory.rglob("*.pyc")))
    return f"runs in {cwd}, on its own code: it imported {modules} modules from there"


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


@dataclass
class Retries:
    """Retrying the commands refused with one of :data:`RETRY_CODES`, with capped exponential
    backoff, for at most ``give_up_seconds`` per command. Safe only with request ids: a retry
    of a command that did commit returns its first answer. Counts the retries and the codes."""

    give_up_seconds: float = 30.0
    attempt_timeout: float = RPC_TIMEOUT_SECONDS
    count: int = 0
    #: "CODE REASON" (the ErrorInfo reason, if any) of every failed attempt -> how many.
    codes: collections.Counter[str] = field(default_factory=collections.Counter)

    async def call(self, call: Callable[..., Awaitable[Response]], request: Any) -> Response:
        deadline = time.monotonic() + self.give_up_seconds
        attempt = 0
        while True:
            try:
                return await call(request, timeout=self.attempt_timeout)
            except grpc.aio.AioRpcError as err:
                error = lane_error(err)
                self.codes[f"{error.code.name} {error.reason}".strip()] += 1
                if error.code not in RETRY_CODES or time.monotonic() >= deadline:
                    raise
            attempt += 1
            self.count += 1
            delay = min(1.0, 0.02 * 2 ** min(attempt - 1, 8)) * (0.5 + random.random() / 2)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))


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
    #: Retry refused commands (same request, same request id): see :class:`Retries`.
    retries: Retries | None = None
    #: Send the commands over this DriveLane session instead of unary RPCs (``--sessions``).
    session: LaneSession | None = None
    #: The lane revision of the last acknowledged command.
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
        response: Response
        if self.session is not None:
            response = await self.session.call(
                request, retry_seconds=0.0, attempt_timeout=RPC_TIMEOUT_SECONDS
            )
        elif self.retries is None:
            response = await call(request, timeout=RPC_TIMEOUT_SECONDS)
        else:
            response = await self.retries.call(call, request)
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
            prompt = replay.prompt_message(run_no)
            started = await self._rpc(
                "StartRun",
                stub.StartRun,
                pb.StartRunRequest(lane_id=lane, prompt=[prompt], request_id=self._request_id()),
            )
            run_id = started.operation_id
            for turn_no in range(self.turns_per_run):
                calls = replay.call_ids(run_no, turn_no, self.calls_per_turn)
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
        message = replay.assistant_message(calls)
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
                arguments_json=replay.START_ARGUMENTS,
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
                    partial_result=replay.partial_result(n),
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
                executed=pb.ExecutedOutcome(result=replay.outcome_result(call)),
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
    #: The bench database's counters over the window.
    db_window: DbCounters
    #: Why statements are not counted (None: they are, in ``db_window``).
    no_statements: str | None
    #: Server processes, and each one's established connections from the clients at the
    #: window's end (with workers: how the kernel spread them).
    workers: int
    connections: list[int]
    #: With ``--watchers``: what the watchers saw, and how long they took to attach.
    fleet: FleetResult | None = None
    fleet_ready_seconds: float = 0.0
    #: How the drivers sent their commands: "unary", "sessions" (a DriveLane stream per
    #: driver) or "batched sessions" (every driver's lane on one stream per server process).
    transport: str = "unary"
    #: Over sessions: commands per DriveLane message the drivers wrote, over the whole phase.
    commands_per_message: float | None = None

    @property
    def commits_per_second(self) -> float:
        return self.window.commits / self.seconds

    def per_commit(self, value: int | None) -> float | None:
        """``value`` (counted over the window) per lifecycle commit of the window."""
        if value is None or not self.window.commits:
            return None
        return value / self.window.commits


def profile_path(output: Path, phase: str) -> Path:
    """Where the profile of ``phase`` goes: ``output`` with the phase before its suffix
    (``prof.svg`` -> ``prof-sessions-1w.svg``), so every phase of a run keeps its own."""
    return output.with_name(f"{output.stem}-{phase}{output.suffix}")


async def start_profiler(
    output: Path, pid: int, seconds: float, subprocesses: bool = False
) -> asyncio.subprocess.Process | None:
    """``py-spy record --native`` of the server for the window (flame graph for .svg,
    speedscope for .json, else collapsed stacks); None when py-spy is not installed. Native
    frames show the C time (libpq, gRPC core, protobuf) under the Python calls."""
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
        "--native",
        *(["--subprocesses"] if subprocesses else []),
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


async def start_perf(
    directory: Path | None, phase: str, seconds: float, postmaster: int | None, delay: float = 0
) -> asyncio.subprocess.Process | None:
    """``perf record -g`` of the cluster's backends (the postmaster's children, ``delay``
    seconds from now: a client's backends must have started) for ``seconds`` into
    ``directory/phase.data`` (``--perf-postgres``); None when not asked for, perf is not on
    PATH, or the cluster is not local."""
    if directory is None or postmaster is None:
        return None
    await asyncio.sleep(delay)
    pids = sorted(_cluster_children(postmaster))
    perf = shutil.which("perf")
    if perf is None:
        print("--perf-postgres: perf is not on PATH; not profiling", flush=True)
        return None
    return await asyncio.create_subprocess_exec(
        perf, "record", "-g", "-F", "999", "-o", str(directory / f"{phase}.data"),
        "-p", ",".join(str(pid) for pid in pids), "--", "sleep", str(max(1, math.floor(seconds))),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def grpc_ceiling(
    channels: Sequence[grpc.aio.Channel], concurrency: int, seconds: float
) -> float:
    """Trivial RPCs/s the server answers (Health.Check: no database, no lane) at the drivers'
    concurrency, caller i on channel i: what the gRPC layer alone allows on this machine,
    client included."""
    stubs = [health_pb2_grpc.HealthStub(channel) for channel in channels]
    request = health_pb2.HealthCheckRequest(service="")
    done = 0
    deadline = time.monotonic() + seconds

    async def caller(stub: health_pb2_grpc.HealthStub) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await stub.Check(request, timeout=RPC_TIMEOUT_SECONDS)
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(caller(stubs[i % len(stubs)]) for i in range(concurrency)))
    return done / (time.monotonic() - started)


def channel_count(args: argparse.Namespace, workers: int | None = None) -> int:
    """``--channels``, else one with a single server process and one per driver with workers
    (``workers``: the phase's server processes, default ``--workers``)."""
    if args.channels:
        return int(args.channels)
    return 1 if (workers or args.workers) == 1 else int(args.drivers)


async def run_service_load(
    db: Database,
    args: argparse.Namespace,
    service: ServiceProcess,
    watchers: int = 0,
    sessions: bool = False,
    phase: str = "unary",
    batched: bool = False,
    session_type: type[LaneSession] = LaneSession,
) -> ServiceResult:
    """N drivers against the running service: warm up, then count over the window.

    ``sessions``: each driver sends its commands over a DriveLane stream of its own
    (:class:`~lane.client.session.LaneSession`, request ids as ``--request-ids`` says), not
    as unary RPCs.

    ``batched``: one DriveLane stream per server process carries every driver's lane, as one
    agent process driving many lanes uses the SDK: each lane's lifecycle is a task of its own,
    and the commands the tasks issue in one event-loop turn (typically each lane's next command
    once a message of answers arrived) go out as one message (``session_type``: the
    LaneSession class, the working tree's or a ref's).

    ``watchers`` > 0: that many WatchLane streams (:mod:`bench.watchers`, a process of their
    own) are attached before the drivers start, spread evenly over the drivers' lanes (or, with
    ``--watch-lanes idle``, one on each of as many lanes nobody commits to); each must end at
    its lane's last revision."""
    stats = Stats()
    stop = asyncio.Event()
    profiler: asyncio.subprocess.Process | None = None
    drivers_profiler: asyncio.subprocess.Process | None = None
    fleet: Fleet | None = None
    processes = {"drivers": os.getpid()}
    trees = {"server": service.pid}  # a supervisor and its workers, or the single process
    before_commits = await committed_transactions(db.url)
    opened = (
        channels_per_worker(service)
        if batched
        else open_channels(service.address, channel_count(args, service.workers))
    )
    async with (
        opened as channels,
        await psycopg.AsyncConnection.connect(db.url, autocommit=True) as stats_conn,
        contextlib.AsyncExitStack() as watching,
    ):
        stubs = [lane_service_pb2_grpc.LaneServiceStub(channel) for channel in channels]
        ceiling = await grpc_ceiling(channels, args.drivers, min(args.seconds, 3.0))
        shared = [session_type(stub, request_ids=args.request_ids) for stub in stubs]
        for session in shared if batched else ():
            watching.push_async_callback(session.aclose)
        drivers = [
            Driver(
                stub=stubs[i % len(stubs)],
                lane_id=f"bench-{uuid.uuid4().hex[:12]}",
                stats=stats,
                stop=stop,
                calls_per_turn=args.calls,
                turns_per_run=args.turns,
                request_ids=args.request_ids,
                session=(
                    shared[i % len(shared)]
                    if batched
                    else session_type(stubs[i % len(stubs)], request_ids=args.request_ids)
                    if sessions
                    else None
                ),
            )
            for i in range(args.drivers)
        ]
        for driver in drivers if not batched else ():
            if driver.session is not None:
                watching.push_async_callback(driver.session.aclose)
        if watchers:
            fleet = await _attach_watchers(
                watching, stubs[0], service.address, args, drivers, watchers
            )
            processes["watchers"] = fleet.pid
        tasks = [asyncio.create_task(d.run(), name=d.lane_id) for d in drivers]
        watcher = asyncio.gather(*tasks)
        statements = db.no_statements is None
        try:
            # A failing driver must end the benchmark at once, not after the window.
            await _sleep_unless_failed(watcher, args.warmup)
            first, t0 = stats.counters.copy(), time.monotonic()
            cpu_before = cpu_sample(processes, db.postmaster, trees)
            db_before = await read_db_counters(stats_conn, statements)
            stats.recording = True
            if fleet is not None:
                await fleet.window_start()
            perf = await start_perf(args.perf_postgres, phase, args.seconds, db.postmaster)
            if perf is not None:
                watching.push_async_callback(perf.wait)
            if args.py_spy is not None:
                profiler = await start_profiler(
                    profile_path(args.py_spy, phase),
                    service.pid,
                    args.seconds,
                    subprocesses=service.workers > 1,
                )
                if sessions:
                    # The drivers' side too: what the SDK costs per command.
                    drivers_profiler = await start_profiler(
                        profile_path(args.py_spy, f"{phase}-drivers"), os.getpid(), args.seconds
                    )
            await _sleep_unless_failed(watcher, args.seconds)
            last, t1 = stats.counters.copy(), time.monotonic()
            cpu_after = cpu_sample(processes, db.postmaster, trees)
            db_after = await read_db_counters(stats_conn, statements)
            stats.recording = False
            connections = connections_per_worker(service)
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
                for spy in (profiler, drivers_profiler):
                    if spy is not None and spy.returncode is None:
                        spy.kill()
            await finish_profiler(profiler)
            await finish_profiler(drivers_profiler)
        # Cross-check: every lane's head revision equals the last revision its driver saw.
        mismatches = []
        snapshot_revisions = 0
        for driver in drivers:
            response = await driver.stub.GetLaneSnapshot(
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
        db_window=db_after - db_before,
        no_statements=db.no_statements,
        workers=service.workers,
        connections=connections,
        fleet=watched,
        fleet_ready_seconds=fleet.ready_seconds if fleet is not None else 0.0,
        transport="batched sessions" if batched else "sessions" if sessions else "unary",
        commands_per_message=_commands_per_message({d.session for d in drivers} - {None}),
    )


def _commands_per_message(sessions: Collection[LaneSession | None]) -> float | None:
    """Commands per DriveLane message written by ``sessions`` (None: no sessions)."""
    messages = sum(s.messages_sent for s in sessions if s is not None)
    commands = sum(s.commands_sent for s in sessions if s is not None)
    return commands / messages if messages else None


@contextlib.asynccontextmanager
async def channels_per_worker(service: ServiceProcess) -> AsyncIterator[list[grpc.aio.Channel]]:
    """One channel (TCP connection) on each server process of ``service``: channels are
    opened one at a time, and one the kernel handed to a process that has one already is kept
    aside (open, idle) and another opened, up to 16 tries a process; the rest are closed at the
    end. With one server process, one channel."""
    wanted = service.workers
    kept: list[grpc.aio.Channel] = []
    aside: list[grpc.aio.Channel] = []
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    try:
        served: set[int] = set()
        for _ in range(16 * wanted):
            if len(kept) == wanted:
                break
            before = connections_per_worker(service) if wanted > 1 else [0]
            channel = grpc.aio.insecure_channel(service.address, options=options)
            async with asyncio.timeout(RPC_TIMEOUT_SECONDS):
                await channel.channel_ready()
            grown = [0]
            for _ in range(100):  # the server process may take a moment to accept it
                after = connections_per_worker(service) if wanted > 1 else [1]
                grown = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
                if grown:
                    break
                await asyncio.sleep(0.01)
            if grown and grown[0] not in served:
                served.add(grown[0])
                kept.append(channel)
            else:
                aside.append(channel)
        if len(kept) < wanted:
            print(f"note: only {len(kept)} of {wanted} server processes got a connection")
            kept += aside[: wanted - len(kept)]
        yield kept
    finally:
        await asyncio.gather(*(channel.close(None) for channel in kept + aside))


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


def _cpu_per_commit(result: ServiceResult, name: str) -> float | None:
    """CPU seconds of ``name`` per lifecycle commit in the window."""
    cores = result.cpu.processes.get(name)
    if cores is None or not result.commits_per_second:
        return None
    return cores / result.commits_per_second


def _replay_cpu_per_commit(result: Replay, name: str) -> float | None:
    """CPU seconds of ``name`` per lifecycle commit of the replay."""
    cores = result.cpu.processes.get(name)
    if cores is None or not result.commits_per_second:
        return None
    return cores / result.commits_per_second


def _micros(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.0f} µs"


def _ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def describe_service(service: ServiceProcess) -> str:
    """``service pid P (subprocess)`` or the supervisor and its workers."""
    if service.workers == 1:
        return f"service pid {service.pid} (subprocess, one server process)"
    return (
        f"service: supervisor pid {service.pid} and {service.workers} worker processes"
        " (LANE_WORKERS; CPU counted over the whole process tree)"
    )


def window_lines(result: ServiceResult) -> list[str]:
    """What PostgreSQL counted over the window, per lifecycle commit, and the connections."""
    db = result.db_window
    statements = (
        f"statements {_ratio(result.per_commit(db.statements))} (pg_stat_statements calls,"
        f" BEGIN and COMMIT included), planned {_ratio(result.per_commit(db.plans))} times,"
        f" planning {_ratio(result.per_commit(round(db.plan_ms * 1000)), 0)} µs and executing"
        f" {_ratio(result.per_commit(round(db.exec_ms * 1000)), 0)} µs (wall time)"
        if result.no_statements is None
        else f"statements: unavailable ({result.no_statements})"
    )
    lines = [
        f"  in the window, per lifecycle commit: PostgreSQL transactions"
        f" {_ratio(result.per_commit(db.transactions))}, rows written"
        f" {_ratio(result.per_commit(db.rows_written))}; {statements}"
    ]
    if result.workers > 1:
        spread = ", ".join(str(n) for n in result.connections)
        lines.append(
            f"  client connections per worker at the window's end: {spread}"
            " (the kernel spreads connections, not calls)"
        )
    return lines


def report(
    args: argparse.Namespace,
    db: Database,
    service_process: ServiceProcess,
    baselines: Sequence[Baseline],
    service: ServiceResult,
    replayed: Replay | str | None = None,
) -> str:
    baseline_rate = sum(b.commits_per_second for b in baselines) / len(baselines)
    ratio = service.commits_per_second / baseline_rate
    met = "met" if ratio >= TARGET_RATIO else "NOT met"
    each = " / ".join(f"{b.commits_per_second:,.0f}" for b in baselines)
    window = service.window
    mismatches = "\n    ".join(service.mismatches)
    baseline_cpu = sum(
        b.cpu.processes.get("PostgreSQL", 0.0) / b.commits_per_second for b in baselines
    ) / len(baselines)
    rows = [
        (f"baseline: PostgreSQL single-row commits/s ({each})", f"{baseline_rate:,.0f}"),
    ]
    if isinstance(replayed, Replay):
        rows.append(
            (
                "replay: the service's SQL by pgbench, commits/s",
                f"{replayed.commits_per_second:,.0f}",
            )
        )
    rows += [
        ("service: lifecycle commits/s through gRPC", f"{service.commits_per_second:,.0f}"),
        ("service: tool calls/s (full life each)", f"{window.tool_calls / service.seconds:,.1f}"),
        ("service: RPCs/s", f"{window.rpcs / service.seconds:,.0f}"),
        ("service: lane revisions (events)/s", f"{window.revisions / service.seconds:,.0f}"),
        ("gRPC ceiling: Health.Check RPCs/s (no database)", f"{service.grpc_ceiling:,.0f}"),
        ("PostgreSQL CPU per commit: single-row baseline", _micros(baseline_cpu)),
    ]
    if isinstance(replayed, Replay):
        rows.append(
            (
                "PostgreSQL CPU per commit: replay of the service's SQL",
                _micros(_replay_cpu_per_commit(replayed, "PostgreSQL")),
            )
        )
    rows += [
        ("PostgreSQL CPU per commit: service", _micros(_cpu_per_commit(service, "PostgreSQL"))),
        ("ratio service / baseline", f"{ratio:.3f}"),
        (f"target: ratio >= {TARGET_RATIO}", met),
    ]
    if isinstance(replayed, Replay):
        rows += [
            (
                "ratio replay / baseline (the SQL's shape)",
                f"{replayed.commits_per_second / baseline_rate:.3f}",
            ),
            (
                "ratio service / replay (the service around its SQL)",
                f"{service.commits_per_second / replayed.commits_per_second:.3f}",
            ),
        ]
    width = max(len(label) for label, _ in rows)
    channels = channel_count(args)
    lines = [
        f"commit throughput: N={args.drivers} drivers on {channels} channel"
        f"{'s' if channels > 1 else ''}, window {service.seconds:.1f} s"
        f" after {args.warmup:g} s warm-up; {args.turns} turns x {args.calls} tool calls per run;"
        f" request ids {'on' if args.request_ids else 'off'}; NOTIFY {args.notify}",
        f"PostgreSQL {db.version} ({db.description}); fsync={db.fsync},"
        f" synchronous_commit={db.synchronous_commit}; {os.cpu_count()} CPUs;"
        f" {describe_service(service_process)}",
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
        *(
            replay_lines(replayed)
            if isinstance(replayed, Replay)
            else [f"replay of the service's SQL: not run ({replayed})"]
            if replayed is not None
            else []
        ),
        f"service: {service.window.commits:,} commits, {service.window.rpcs:,} RPCs,"
        f" {service.window.tool_calls:,} tool calls in the window;"
        f" {service.window.revisions / max(service.window.commits, 1):.2f} revisions per commit",
        f"  {service.cpu.describe()}",
        "  "
        + service.cpu.per_commit(service.commits_per_second, "server", "PostgreSQL", "drivers"),
        *window_lines(service),
        f"  whole phase: drivers counted {service.total.commits:,} lifecycle commits,"
        f" PostgreSQL counted {service.postgres_counted:,} commits in the bench database"
        f" (+{service.postgres_counted - service.total.commits:,}: the service's other"
        " transactions (doorbells when another process listens, the hub's check for listeners,"
        " upkeep) and the final snapshots)",
        f"  cross-check: {service.lanes_checked} lanes, sum of snapshot revisions"
        f" {service.snapshot_revisions:,}, sum of revisions seen by drivers"
        f" {service.total.revisions:,}: "
        + ("OK" if not service.mismatches else "MISMATCH\n    " + mismatches),
        "",
        *latency_table(service.latencies),
    ]
    return "\n".join(lines)


def latency_table(latencies: Mapping[str, list[float]]) -> list[str]:
    lines = ["  RPC latency in the window (ms):        count     p50     p90     p99"]
    for method, values in sorted(latencies.items()):
        lines.append(
            f"    {method:<32} {len(values):>9,} {_percentile(values, 0.5) * 1e3:>7.2f}"
            f" {_percentile(values, 0.9) * 1e3:>7.2f} {_percentile(values, 0.99) * 1e3:>7.2f}"
        )
    return lines


def _per_command(result: ServiceResult, name: str) -> float | None:
    """CPU seconds of ``name`` per command (RPC or session call) in the window."""
    cores = result.cpu.processes.get(name)
    if cores is None or not result.window.rpcs:
        return None
    return cores * result.seconds / result.window.rpcs


def _interpreter(python: str) -> str:
    """``Python 3.12.1`` for an interpreter's path (the path itself if it does not answer)."""
    try:
        done = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return python
    return f"Python {done.stdout.strip()}"


def _phase_label(result: ServiceResult) -> str:
    workers = f"{result.workers} worker{'s' if result.workers > 1 else ''}"
    return f"{result.transport}, {workers}"


def sessions_report(
    args: argparse.Namespace, unary: ServiceResult, sessions: Sequence[ServiceResult]
) -> str:
    """The drivers over DriveLane sessions (one phase per worker count) beside the same drivers
    over unary RPCs (``--sessions``): throughput, and CPU per lifecycle commit and per command
    of the server, the drivers and PostgreSQL, each with its ratio to unary."""

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None or not a else f"{b / a:.2f}"

    columns = [unary, *sessions]
    headers = [_phase_label(r) for r in columns]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, values: list[float | None], show: Callable[[float | None], str]) -> None:
        cells = [show(values[0])]
        for value in values[1:]:
            cells += [show(value), ratio(values[0], value)]
        rows.append((label, cells))

    row("lifecycle commits/s", [r.commits_per_second for r in columns], lambda v: f"{v or 0:,.0f}")
    row(
        "commands/s",
        [r.window.rpcs / r.seconds for r in columns],
        lambda v: f"{v or 0:,.0f}",
    )
    for name in ("server", "drivers", "PostgreSQL"):
        row(f"{name} CPU per commit", [_cpu_per_commit(r, name) for r in columns], _micros)
    for name in ("server", "drivers"):
        row(f"{name} CPU per command", [_per_command(r, name) for r in columns], _micros)
    row(
        "commands per message",
        [r.commands_per_message for r in columns],
        lambda v: "-" if v is None else f"{v:.2f}",
    )
    rows.append(
        (
            "revision cross-check",
            [("OK" if not r.mismatches else "MISMATCH") for r in columns[:1]]
            + [
                cell for r in columns[1:] for cell in ("OK" if not r.mismatches else "MISMATCH", "")
            ],
        )
    )
    width = max(len(label) for label, _ in rows)
    head = f"  {'':<{width}} {headers[0]:>18}"
    for header in headers[1:]:
        head += f" {header:>20} {'/ unary':>8}"
    lines = [
        f"sessions: the same {args.drivers} drivers, each sending its commands over one DriveLane"
        " stream of its own (LaneSession) instead of unary RPCs; batched sessions: every"
        " driver's lane on one stream per server process (one LaneSession each), so the"
        " commands the drivers issue in one event-loop turn go as one message; a fresh"
        " service process per phase, after the unary phase, in this run; the drivers' loop:"
        f" {args.driver_loop}",
        "",
        head,
    ]
    for label, cells in rows:
        line = f"  {label:<{width}} {cells[0]:>18}"
        for n in range(1, len(cells), 2):
            line += f" {cells[n]:>20} {cells[n + 1]:>8}"
        lines.append(line)
    for result in sessions:
        lines += [
            "",
            f"  {_phase_label(result)}: {result.cpu.describe()}",
            *(f"  {line}" for line in window_lines(result)),
            "",
            *latency_table(result.latencies),
        ]
    return "\n".join(lines)


def summary_report(
    baselines: Sequence[Baseline],
    replays: Sequence[Replay],
    services: Sequence[tuple[str, ServiceResult]],
) -> str:
    """One line per phase of the run: commits/s and CPU per commit of the server, PostgreSQL
    and the load (drivers or pgbench), and the host's CPU per commit (their sum), each beside
    pgbench's single-row commits (the mean of the baselines)."""
    base_rate = sum(b.commits_per_second for b in baselines) / len(baselines)
    base_pg = sum(b.cpu.processes.get("PostgreSQL", 0.0) / b.commits_per_second for b in baselines)
    base_load = sum(b.cpu.processes.get("pgbench", 0.0) / b.commits_per_second for b in baselines)
    base_pg, base_load = base_pg / len(baselines), base_load / len(baselines)
    base_host = base_pg + base_load
    Line = tuple[str, float, float | None, float, float]
    lines_in: list[Line] = [
        ("pgbench, prepared single-row commits", base_rate, None, base_pg, base_load)
    ]
    for r in replays:
        label = f"replay of the service's SQL, {r.commits_per_transaction} per transaction"
        pg = _replay_cpu_per_commit(r, "PostgreSQL") or 0.0
        load = _replay_cpu_per_commit(r, "pgbench") or 0.0
        lines_in.append((label, r.commits_per_second, None, pg, load))
    for label, result in services:
        lines_in.append(
            (
                label,
                result.commits_per_second,
                _cpu_per_commit(result, "server") or 0.0,
                _cpu_per_commit(result, "PostgreSQL") or 0.0,
                _cpu_per_commit(result, "drivers") or 0.0,
            )
        )
    width = max(len(line[0]) for line in lines_in)
    lines = [
        "summary: every phase of this run beside pgbench's single-row commits (CPU per lifecycle"
        " commit; host = server + PostgreSQL + load, the load being the drivers or pgbench)",
        "",
        f"  {'':<{width}} {'commits/s':>10} {'÷ pgbench':>10} {'server':>9} {'PostgreSQL':>11}"
        f" {'load':>9} {'host':>9} {'host ÷ pgbench':>15}",
    ]
    for label, rate, server, pg, load in lines_in:
        host = (server or 0.0) + pg + load
        lines.append(
            f"  {label:<{width}} {rate:>10,.0f} {rate / base_rate:>10.3f}"
            f" {_micros(server):>9} {_micros(pg):>11} {_micros(load):>9} {_micros(host):>9}"
            f" {host / base_host if base_host else 0.0:>15.1f}"
        )
    return "\n".join(lines)


def compare_report(
    tree: RefTree,
    ref_service: ServiceProcess,
    ref: ServiceResult,
    current_service: ServiceProcess,
    current: ServiceResult,
    ref_note: str,
    replayed: Replay | None = None,
) -> str:
    """The ref's service phase beside the working tree's, with the ratios current / ref (and,
    with ``replayed``, each one's commits/s over the replay of the working tree's SQL)."""

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None or not b else f"{a / b:.2f}"

    def statements(result: ServiceResult) -> float | None:
        return result.per_commit(result.db_window.statements)

    rows: list[tuple[str, str, str, str]] = [
        (
            "lifecycle commits/s",
            f"{ref.commits_per_second:,.0f}",
            f"{current.commits_per_second:,.0f}",
            ratio(current.commits_per_second, ref.commits_per_second),
        ),
        (
            "gRPC ceiling: Health.Check RPCs/s",
            f"{ref.grpc_ceiling:,.0f}",
            f"{current.grpc_ceiling:,.0f}",
            ratio(current.grpc_ceiling, ref.grpc_ceiling),
        ),
    ]
    if replayed is not None:
        rows.append(
            (
                "commits/s / replay of the current SQL",
                ratio(ref.commits_per_second, replayed.commits_per_second),
                ratio(current.commits_per_second, replayed.commits_per_second),
                ratio(current.commits_per_second, ref.commits_per_second),
            )
        )
    for label, name in (
        ("server CPU per commit", "server"),
        ("PostgreSQL CPU per commit", "PostgreSQL"),
        ("drivers CPU per commit", "drivers"),
    ):
        a, b = _cpu_per_commit(ref, name), _cpu_per_commit(current, name)
        rows.append((label, _micros(a), _micros(b), ratio(b, a)))
    for label, counter in (
        ("PostgreSQL transactions per lifecycle commit", "transactions"),
        ("rows written per lifecycle commit", "rows_written"),
    ):
        a = ref.per_commit(getattr(ref.db_window, counter))
        b = current.per_commit(getattr(current.db_window, counter))
        rows.append((label, _ratio(a), _ratio(b), ratio(b, a)))
    a, b = statements(ref), statements(current)
    rows.append(("statements per lifecycle commit", _ratio(a), _ratio(b), ratio(b, a)))
    rows.append(("server processes", str(ref.workers), str(current.workers), ""))
    rows.append(
        (
            "revision cross-check",
            "OK" if not ref.mismatches else "MISMATCH",
            "OK" if not current.mismatches else "MISMATCH",
            "",
        )
    )
    width = max(len(row[0]) for row in rows)
    ref_label = tree.label
    lines = [
        f"compare: {ref_label} ({tree.ref}: {tree.subject[:60]}) against the working tree,"
        " in this run, the ref first, each on a fresh scratch database of the same server",
        f"  {ref_label}: {ref_note}",
        f"  {ref_label}: {describe_service(ref_service)}",
    ]
    if ref_service.not_passed:
        unknown = ", ".join(ref_service.not_passed)
        lines.append(f"  {ref_label}: its code does not know {unknown}: not passed")
    lines += [
        "",
        f"  {'':<{width}} {ref_label:>12} {'current':>12} {'current/ref':>12}",
        *(f"  {label:<{width}} {a:>12} {b:>12} {r:>12}" for label, a, b, r in rows),
    ]
    if ref.no_statements is not None:
        lines.append(f"  statements: unavailable ({ref.no_statements})")
    lines += [
        "",
        f"  {ref_label}:",
        *(f"  {line}" for line in window_lines(ref)),
        f"    {ref.cpu.describe()}",
    ]
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
        return _micros(_cpu_per_commit(result, name))

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
        f"  target: drop <= {TARGET_WATCHER_DROP * 100:.0f} %: {met}",
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
        *window_lines(watched),
        "",
        *latency_table(watched.latencies),
    ]
    return "\n".join(lines)


# -- entry point ------------------------------------------------------------------------------


def _counts(value: str) -> list[int]:
    """A comma-separated list of counts, each at least 1."""
    try:
        counts = [int(part) for part in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {value!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"every count must be at least 1: {value!r}")
    return counts


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
        help="send a request_id with every command (the answer is stored for retries)",
    )
    add_server_options(parser)
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="K",
        help="server processes: LANE_WORKERS=K (K > 1: a supervisor and K workers on one port;"
        " the server CPU is the whole process tree's) (default 1)",
    )
    parser.add_argument(
        "--channels",
        type=int,
        default=0,
        metavar="C",
        help="channels (TCP connections) the drivers are spread over (default: 1 with one server"
        " process, one per driver with --workers above 1)",
    )
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="also measure the service of git ref REF (git archive into a temp dir), before the"
        " working tree's, and print both side by side",
    )
    parser.add_argument(
        "--replay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the baseline, pgbench replays the service's own statements for the drivers'"
        " lifecycle (no Python in the loop) for --seconds on a scratch database of its own"
        " (default: on; --no-replay skips it)",
    )
    parser.add_argument(
        "--replay-commits-per-transaction",
        type=_counts,
        default=[1],
        metavar="K[,K...]",
        help="a replay per K, each committing K consecutive statements per transaction"
        " (default 1, a command alone): K > 1 is PostgreSQL's side of a group commit of K"
        " commands",
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
        "--sessions",
        action="store_true",
        help="also run the drivers over DriveLane sessions (one stream per driver) on a fresh"
        " service process after the unary phase, and print both side by side: throughput and"
        " CPU per commit and per command of the server, the drivers and PostgreSQL",
    )
    parser.add_argument(
        "--session-workers",
        type=_counts,
        default=None,
        metavar="K[,K...]",
        help="with --sessions: a sessions phase per K, with LANE_WORKERS=K (default: --workers)",
    )
    parser.add_argument(
        "--driver-loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop of this process, where the drivers run (default asyncio's own;"
        " the service runs on uvloop)",
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="also run the drivers over batched sessions: every driver's lane on one DriveLane"
        " stream per server process, each lane's lifecycle a task, so commands issued in one"
        " event-loop turn share a message (with --session-workers' worker counts)",
    )
    parser.add_argument(
        "--perf-postgres",
        type=Path,
        metavar="DIR",
        help="record the bench's PostgreSQL backends with perf (-g) during each replay and"
        " service window, into DIR/PHASE.data, to compare where PostgreSQL's CPU goes (perf"
        " report -i DIR/PHASE.data --sort sym); needs perf and the permission to record them",
    )
    parser.add_argument(
        "--compare-python",
        action="append",
        metavar="PYTHON",
        help="also run the working tree's service (unary, and sessions with --sessions) on this"
        " interpreter, in the same run, before the usual phases (a virtualenv's python with the"
        " service installed); may be given more than once",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="every figure in one run: the replay at 1 and 4 commits per transaction, and"
        " sessions and batched sessions with 1 and 2 workers besides unary (as --sessions"
        " --batched --session-workers 1,2 --replay-commits-per-transaction 1,4)",
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
    if args.all:
        args.sessions = args.batched = True
        args.session_workers = args.session_workers or [1, 2]
        if args.replay_commits_per_transaction == [1]:
            args.replay_commits_per_transaction = [1, 4]
    if args.session_workers is None:
        args.session_workers = [args.workers]
    if args.perf_postgres is not None:
        args.perf_postgres.mkdir(parents=True, exist_ok=True)
    if args.drivers < 1 or args.calls < 1 or args.turns < 1:
        parser.error("--drivers, --calls and --turns must be at least 1")
    if args.workers < 1 or args.channels < 0:
        parser.error("--workers must be at least 1 and --channels at least 0")
    if args.watchers < 0 or args.watcher_channels < 1:
        parser.error("--watchers must be >= 0 and --watcher-channels >= 1")
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be > 0 and --warmup >= 0")
    return args


async def run(args: argparse.Namespace) -> int:
    async with contextlib.AsyncExitStack() as stack:
        work_dir = Path(tempfile.mkdtemp(prefix="lane-bench-"))
        stack.callback(shutil.rmtree, work_dir, ignore_errors=True)
        tree: RefTree | None = None
        if args.compare:
            tree = await unpack_ref(args.compare, work_dir)
            package = await ref_package_path(tree)
            print(
                f"{tree.label} ({args.compare}): {tree.subject[:72]}; its service package:"
                f" {package}",
                flush=True,
            )
        db = await stack.enter_async_context(provision_database(args.database_url))
        print(f"PostgreSQL {db.version} ready ({db.description}); baseline first ...", flush=True)
        if db.no_statements is not None:
            print(f"statements per commit: unavailable ({db.no_statements})", flush=True)
        baselines = [await run_baseline(db, args.drivers, args.seconds, args.baseline, work_dir)]
        rate = baselines[0].commits_per_second
        print(f"baseline: {rate:,.0f} commits/s", flush=True)
        replayed: Replay | str | None = None
        replays: list[Replay] = []
        if args.replay:
            for k in args.replay_commits_per_transaction:
                print(
                    f"replay of the service's SQL by pgbench, {k} per transaction ...", flush=True
                )
                done = await run_replay(db, args, work_dir, k)
                if isinstance(done, Replay):
                    replays.append(done)
                    rate = done.commits_per_second
                    print(f"replay: {rate:,.0f} commits/s", flush=True)
                else:
                    print(f"replay: not run ({done})", flush=True)
                if replayed is None:
                    replayed = done  # the first K's is the one the report compares with
        compared: tuple[ServiceProcess, ServiceResult, str] | None = None
        ref_sessions: list[ServiceResult] = []
        if tree is not None:
            # Its own scratch database: the ref's schema may be older (or newer) than ours.
            print(f"{tree.label}'s service ...", flush=True)
            async with (
                scratch_database(db.server_url, db.description) as ref_db,
                run_service(
                    ref_db.url, args.notify == "on", workers=args.workers, root=tree.root
                ) as ref_service,
            ):
                ref_note = verify_ref_service(tree, ref_service)
                print(f"{tree.label}'s service {ref_note}", flush=True)
                ref_result = await run_service_load(ref_db, args, ref_service, phase="ref")
                rate = ref_result.commits_per_second
                print(f"{tree.label}: {rate:,.0f} commits/s; stopping it ...", flush=True)
            compared = (ref_service, ref_result, ref_note)
            ref_session, session_note = ref_session_type(tree)
            print(f"{tree.label}'s sessions: {session_note}", flush=True)
            for workers, batched in session_phases(args):
                how = "batched sessions" if batched else "sessions"
                print(f"{tree.label}'s service ({workers} workers) over {how} ...", flush=True)
                async with (
                    scratch_database(db.server_url, db.description) as ref_db,
                    run_service(
                        ref_db.url, args.notify == "on", workers=workers, root=tree.root
                    ) as ref_service,
                ):
                    done_ref = await run_service_load(
                        ref_db,
                        args,
                        ref_service,
                        sessions=True,
                        batched=batched,
                        session_type=ref_session,
                        phase=f"ref-{how.replace(' ', '-')}-{workers}w",
                    )
                ref_sessions.append(done_ref)
                print(f"{tree.label} over {how}: {done_ref.commits_per_second:,.0f} commits/s")
        other_python: list[tuple[str, ServiceResult]] = []
        for python in args.compare_python or ():
            for sessions, workers, batched in [(False, args.workers, False)] + [
                (True, w, b) for w, b in session_phases(args)
            ]:
                print(f"service on {python} ({workers} workers, sessions {sessions}) ...")
                async with run_service(
                    db.url, args.notify == "on", workers=workers, python=python
                ) as other:
                    done_other = await run_service_load(
                        db,
                        args,
                        other,
                        sessions=sessions,
                        batched=batched,
                        phase=f"python-{len(other_python)}",
                    )
                label = f"{_interpreter(python)}: {_phase_label(done_other)}"
                other_python.append((label, done_other))
        print("service ...", flush=True)
        async with run_service(db.url, args.notify == "on", workers=args.workers) as service:
            result = await run_service_load(db, args, service)
            rate = result.commits_per_second
            print(f"service: {rate:,.0f} commits/s; stopping it ...", flush=True)
        sessioned: list[ServiceResult] = []
        for workers, batched in session_phases(args):
            # A fresh service process, so the session phase inherits nothing from the unary one.
            how = "batched sessions" if batched else "sessions"
            print(f"service again ({workers} workers), drivers over DriveLane {how} ...")
            async with run_service(db.url, args.notify == "on", workers=workers) as session_service:
                done_sessions = await run_service_load(
                    db,
                    args,
                    session_service,
                    sessions=True,
                    batched=batched,
                    phase=f"{how.replace(' ', '-')}-{workers}w",
                )
                sessioned.append(done_sessions)
                rate = done_sessions.commits_per_second
                print(f"service over sessions: {rate:,.0f} commits/s; stopping it ...", flush=True)
        watched: ServiceResult | None = None
        if args.watchers:
            # A fresh service process, so the second phase inherits nothing from the first.
            print(f"service again, with {args.watchers:,} watchers ...", flush=True)
            async with run_service(
                db.url,
                args.notify == "on",
                watcher_limits(args.watchers, args.drivers),
                workers=args.workers,
            ) as watched_service:
                watched = await run_service_load(
                    db, args, watched_service, watchers=args.watchers, phase="watchers"
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
        print(report(args, db, service, baselines, result, replayed))
        if tree is not None and compared is not None:
            print()
            print(
                compare_report(
                    tree,
                    compared[0],
                    compared[1],
                    service,
                    result,
                    compared[2],
                    replayed if isinstance(replayed, Replay) else None,
                )
            )
        if sessioned:
            print()
            print(sessions_report(args, result, sessioned))
        if watched is not None:
            print()
            print(watchers_report(args, result, watched))
        mine = _interpreter(sys.executable) + ": " if other_python else ""
        services = [*other_python, (mine + _phase_label(result), result)]
        services += [(mine + _phase_label(r), r) for r in sessioned]
        if tree is not None and compared is not None:
            services[:0] = [
                (f"{tree.label}: {_phase_label(r)}", r) for r in [compared[1], *ref_sessions]
            ]
        ref_labelled = [] if tree is None else [(tree.label, r) for r in ref_sessions]
        for label, other_result in [*other_python, *ref_labelled]:
            print()
            print(f"{label}, {_phase_label(other_result)}: {other_result.cpu.describe()}")
            print("\n".join(window_lines(other_result)))
            if other_result.commands_per_message is not None:
                print(f"  commands per message: {other_result.commands_per_message:.2f}")
            print("\n".join(latency_table(other_result.latencies)))
        print()
        print(summary_report(baselines, replays, services))
    failed = bool(result.mismatches)
    if isinstance(replayed, Replay):
        failed = failed or not replayed.ok
    if compared is not None:
        failed = failed or bool(compared[1].mismatches)
    if watched is not None:
        failed = failed or bool(watched.mismatches) or not _watchers_ok(watched)
    failed = failed or any(r.mismatches for r in [*sessioned, *ref_sessions])
    failed = failed or any(r.mismatches for _, r in other_python)
    failed = failed or any(not r.ok for r in replays)
    return 1 if failed else 0


def session_phases(args: argparse.Namespace) -> list[tuple[int, bool]]:
    """(server processes, batched) of each sessions phase the options ask for: sessions per
    ``--session-workers`` count with ``--sessions``, then batched sessions per count with
    ``--batched``."""
    phases = [(w, False) for w in args.session_workers if args.sessions]
    return phases + [(w, True) for w in args.session_workers if args.batched]


def ref_session_type(tree: RefTree) -> tuple[type[LaneSession], str]:
    """The ref's own ``LaneSession`` (its clients/python/lane/client/session.py, loaded as a
    module of its own beside the working tree's client packages), so that the ref's phases
    over sessions measure its SDK too; the working tree's when the ref has none or it does
    not load. Also says which."""
    path = tree.root / "clients" / "python" / "lane" / "client" / "session.py"
    if not path.exists():
        return LaneSession, "the working tree's LaneSession (the ref has none)"
    spec = importlib.util.spec_from_file_location("bench_ref_session", path)
    if spec is None or spec.loader is None:
        return LaneSession, "the working tree's LaneSession (the ref's would not load)"
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # an older SDK importing what the tree no longer has
        return LaneSession, f"the working tree's LaneSession (the ref's failed: {exc!r})"
    session: type[LaneSession] = module.LaneSession
    return session, f"the ref's own LaneSession ({path.relative_to(tree.root)})"


def watcher_limits(watchers: int, drivers: int) -> dict[str, str]:
    """The service's watcher limits, raised when the run needs more than the defaults."""
    return {
        "LANE_MAX_WATCHERS": str(max(10_000, watchers)),
        "LANE_MAX_WATCHERS_PER_LANE": str(max(1000, math.ceil(watchers / drivers))),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
