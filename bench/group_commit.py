"""Ways of committing several lanes' statements in one round trip, measured on PostgreSQL.

The store's group commit (``service/lane/server/store/group_commit.py``) sends the commit
statements of different lanes that are ready at the same moment together. This benchmark
measures what PostgreSQL and the client spend per commit for each way of doing that, on the
service's own statements (:func:`bench.replay.record`: the drivers' lifecycle, 114 commits a
run), with no gRPC and no domain in the loop:

- ``single``: one statement per round trip, each its own transaction (the store before group
  commit, and a lone command now);
- ``implicit``: K lanes' statements in one pipeline ending with one Sync: one implicit
  transaction (what the store does);
- ``explicit``: the same between BEGIN and COMMIT;
- ``sync-each``: K statements in one round trip, a Sync after each: K transactions, each
  committed (and its WAL flushed) before the next statement runs;
- ``savepoints``: BEGIN, then SAVEPOINT / statement / RELEASE per lane, COMMIT: one round trip
  (a savepoint only isolates an error with a further round trip to roll back to it);
- ``store-pipeline``: what the store's group committer sent before its one-write path: BEGIN,
  its settings, the statements prepared (``prepare=True``), COMMIT, in psycopg's pipeline (a
  write per statement);
- ``one-write``: the store's group committer now (``group_write.write_group``): the same
  transaction queued on the connection's libpq pipeline and written once.

Each of ``--clients`` connections drives K lanes of its own, each through the recorded run;
a group is the next statement of each of its K lanes, so every group touches K lanes, as a group
commit does. Every statement must write (its version check holds): the bench counts those that
did not and fails if there are any.

    python -m bench.group_commit                       # 8 clients, K=4, 5 s per mode
    python -m bench.group_commit --lanes 8 --modes single,implicit
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import replay
from bench.commit_throughput import (
    Database,
    committed_transactions,
    cpu_sample,
    cpu_use,
    provision_database,
    scratch_database,
)
from bench.entry import add_database_url, add_run_shape, run_benchmark
from lane.server.store.group_commit import PROLOGUE
from lane.server.store.group_write import write_group
from lane.server.store.lane_writes import CommitStatement

_PHASES = itertools.count()
MODES = ("single", "implicit", "explicit", "sync-each", "savepoints", "store-pipeline", "one-write")


@dataclass(frozen=True)
class ModeResult:
    mode: str
    commits: int
    #: Commits over the whole phase (warm-up and wind-down too), as ``transactions``.
    total_commits: int
    seconds: float
    transactions: int
    postgres_cores: float
    client_cores: float
    not_written: int

    @property
    def commits_per_second(self) -> float:
        return self.commits / self.seconds

    def per_commit(self, cores: float) -> float:
        return cores / self.commits_per_second if self.commits else 0.0


def _for_lane(statement: CommitStatement, namespace: str) -> tuple[str, dict[str, Any]]:
    return statement.sql, {**statement.params, "ns": namespace}


async def _create(conn: psycopg.AsyncConnection[Any], run: replay.RecordedRun, ns: str) -> None:
    """The lane's row and its first commit, in one transaction (not counted). A new lane row's
    versions start in a range of their own (schema 0008); the recorded statements count from
    0: the lane starts there, as in the replay (bench/replay.py)."""
    insert, created = run.create
    async with conn.transaction():
        await conn.execute(*_for_lane(insert, ns))
        await conn.execute(
            "UPDATE lanes SET version = 0 WHERE namespace = %(ns)s AND lane_id = %(lane)s",
            {"ns": ns, "lane": insert.params["lane"]},
        )
        await conn.execute(*_for_lane(created, ns))


async def _group(
    conn: psycopg.AsyncConnection[Any], mode: str, statements: Sequence[tuple[str, dict[str, Any]]]
) -> int:
    """Commit ``statements`` (one per lane) the way ``mode`` says; how many did not write."""
    cursors: list[psycopg.AsyncCursor[Any]] = []
    if mode == "one-write":
        group = [CommitStatement(sql, params) for sql, params in statements]
        written = await write_group(conn, group, PROLOGUE, ("COMMIT",))
        return written.count(False)
    if mode == "store-pipeline":
        async with conn.pipeline():
            for command in PROLOGUE:
                await conn.execute(command)
            for sql, params in statements:
                cursors.append(await conn.execute(sql, params, prepare=True))
            await conn.execute("COMMIT")
    elif mode == "single":
        for sql, params in statements:
            cursors.append(await conn.execute(sql, params))
    else:
        async with conn.pipeline() as pipeline:
            if mode in ("explicit", "savepoints"):
                await conn.execute("BEGIN")
            for n, (sql, params) in enumerate(statements):
                if mode == "savepoints":
                    await conn.execute("SAVEPOINT lane")
                cursors.append(await conn.execute(sql, params))
                if mode == "savepoints":
                    await conn.execute("RELEASE SAVEPOINT lane")
                if mode == "sync-each" and n < len(statements) - 1:
                    # A Sync now, read with the rest: each statement commits alone. psycopg's
                    # public sync() would wait for the results here, a round trip each.
                    pipeline._enqueue_sync()
            if mode in ("explicit", "savepoints"):
                await conn.execute("COMMIT")
    missed = 0
    for cursor in cursors:
        row = await cursor.fetchone()
        missed += row is None or row[0] != 1
    return missed


class _Client:
    def __init__(self, url: str, run: replay.RecordedRun, lanes: int, tag: str) -> None:
        self.url, self.run, self.lanes, self.tag = url, run, lanes, tag
        self.commits = 0
        self.total_commits = 0
        self.not_written = 0
        self.counting = False

    async def drive(self, mode: str, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, options="-c lane.writer=service"
        ) as conn:
            runs = 0
            while not stop.is_set():
                runs += 1
                namespaces = [f"{self.tag}-{runs}-{n}" for n in range(self.lanes)]
                for ns in namespaces:
                    await _create(conn, self.run, ns)
                for recorded in self.run.run:
                    group = [_for_lane(recorded.statement, ns) for ns in namespaces]
                    missed = await _group(conn, mode, group)
                    self.total_commits += len(group) - missed
                    if self.counting:
                        self.commits += len(group) - missed
                        self.not_written += missed
                    if stop.is_set():
                        return


async def measure(
    db: Database, url: str, run: replay.RecordedRun, mode: str, args: argparse.Namespace
) -> ModeResult:
    stop = asyncio.Event()
    # A mode given twice (to alternate modes) gets namespaces of its own each time.
    tag = f"{mode}-{next(_PHASES)}"
    clients = [_Client(url, run, args.lanes, f"{tag}-{i}") for i in range(args.clients)]
    transactions = await committed_transactions(url)
    tasks = [asyncio.create_task(client.drive(mode, stop)) for client in clients]
    await asyncio.sleep(args.warmup)
    before = cpu_sample({"client": os.getpid()}, db.postmaster)
    for client in clients:
        client.counting = True
    await asyncio.sleep(args.seconds)
    for client in clients:
        client.counting = False
    after = cpu_sample({"client": os.getpid()}, db.postmaster)
    commits = sum(client.commits for client in clients)
    stop.set()
    await asyncio.gather(*tasks)
    await asyncio.sleep(1.0)  # backends flush their transaction counts at most once a second
    transactions = await committed_transactions(url) - transactions
    use = cpu_use(before, after)
    return ModeResult(
        mode=mode,
        commits=commits,
        total_commits=sum(client.total_commits for client in clients),
        seconds=after.wall - before.wall,
        transactions=transactions,
        postgres_cores=use.processes.get("PostgreSQL", 0.0),
        client_cores=use.processes["client"],
        not_written=sum(client.not_written for client in clients),
    )


def report(args: argparse.Namespace, results: Sequence[ModeResult]) -> str:
    single = next((r for r in results if r.mode == "single"), None)
    lines = [
        f"group commit ways: {args.clients} clients, {args.lanes} lanes per group,"
        f" {args.seconds:g} s per mode; the service's lifecycle statements",
        "",
        f"  {'mode':<11} {'commits/s':>10} {'PG CPU/commit':>14} {'client CPU/commit':>18}"
        f" {'PG xacts/commit':>16} {'PG CPU vs single':>17}",
    ]
    for r in results:
        pg = r.per_commit(r.postgres_cores)
        versus = f"{pg / single.per_commit(single.postgres_cores):.2f}" if single else "-"
        xacts = r.transactions / max(r.total_commits, 1)
        lines.append(
            f"  {r.mode:<11} {r.commits_per_second:>10,.0f} {pg * 1e6:>11,.0f} µs"
            f" {r.per_commit(r.client_cores) * 1e6:>15,.0f} µs {xacts:>16.2f} {versus:>17}"
        )
    missed = sum(r.not_written for r in results)
    lines += ["", f"  statements that wrote nothing: {missed} ({'OK' if not missed else 'FAILED'})"]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    from lane.server.store.migrations import migrate

    recorded = replay.record("group-commit", args.calls, args.turns)
    async with (
        provision_database(args.database_url) as db,
        scratch_database(db.server_url, db.description) as target,
    ):
        async with await psycopg.AsyncConnection.connect(target.url, autocommit=True) as conn:
            await migrate(conn)
        results = []
        for mode in args.modes:
            print(f"{mode} ...", flush=True)
            results.append(await measure(db, target.url, recorded, mode, args))
    print()
    print(report(args, results))
    return 1 if any(r.not_written for r in results) else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.group_commit", description=__doc__)
    parser.add_argument("--clients", type=int, default=8, help="connections (default 8)")
    parser.add_argument("--lanes", type=int, default=4, help="lanes per group, K (default 4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="window per mode (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="before each window (default 1)")
    add_run_shape(parser)
    parser.add_argument(
        "--modes",
        type=lambda value: value.split(","),
        default=list(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (default: all)",
    )
    add_database_url(parser)
    args = parser.parse_args(argv)
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
