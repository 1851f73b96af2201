"""kill -9 of service and drivers, hundreds of times: nothing lost, doubled or unsafely replayed.

Run from the repository root (virtualenv active)::

    python -m bench.crash_kills --kills 200 [--seed N] [--lanes 4] [--services 2]
                                [--database-url URL]

Target (docs/contract.md): "Kill -9 of service or driver at random points: no staged result
lost, no entry placed twice, no unsafe replay, every watcher converges (fold == capture)". This
runs the harness of ``tests/crash/harness.py`` (real ``python -m lane.server.app`` processes and
real driver processes, SIGKILLed at random with a seeded RNG) for ``--kills`` kills, lets every
run finish, checks every lane, and prints the counts: kills of services and of drivers,
takeovers, safe replays, interruptions, reconciliations by the service, the violations of the
crash invariants, and the service errors that retries hid (INTERNAL answers). No timing is
asserted. The exit status is 0 when there is neither, else 1.

PostgreSQL is the one at ``--database-url`` (its role needs CREATEDB: a scratch database is
created and dropped), else an embedded pgserver in a temporary directory removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lane.server.app.embedded import start_embedded
from tests.crash.harness import HarnessConfig, run_harness


@contextlib.asynccontextmanager
async def scratch_database(server_url: str) -> AsyncIterator[str]:
    name = f"lane_crash_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def bench(args: argparse.Namespace, server_url: str, workdir: Path) -> int:
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", flush=True)

    async with scratch_database(server_url) as url:
        config = HarnessConfig(
            database_url=url,
            workdir=workdir,
            seed=args.seed,
            kills=args.kills,
            lanes=args.lanes,
            services=args.services,
            chaos_seconds=args.max_seconds,
            progress=progress,
        )
        report = await run_harness(config)
    print(f"seed {args.seed}, {args.lanes} lanes, {args.services} service processes")
    print(report.summary())
    print(f"logs: {workdir}" if args.keep_logs else "", end="")
    return 0 if not report.violations and not report.service_errors else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crash_kills", description=__doc__)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--services", type=int, default=2)
    parser.add_argument(
        "--max-seconds", type=float, default=1800.0, help="stop killing after this long"
    )
    parser.add_argument("--database-url", default="", help="a server whose role has CREATEDB")
    parser.add_argument("--keep-logs", action="store_true", help="keep the process logs")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="lane-crash-"))
    embedded = None
    try:
        if args.database_url:
            server_url = args.database_url
        else:
            embedded = start_embedded(workdir / "pg")
            server_url = embedded.uri
        return asyncio.run(bench(args, server_url, workdir / "logs"))
    except KeyboardInterrupt:
        return 130
    finally:
        if embedded is not None:
            embedded.stop()
        if not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
