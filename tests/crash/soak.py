"""Soak run of the crash harness: kill -9 of service and drivers, hundreds of times, and
nothing lost, doubled or unsafely replayed.

Run from the repository root (virtualenv active)::

    python -m tests.crash.soak --kills 200 [--seed N] [--lanes 4] [--services 2]
                               [--database-url URL]

Target (docs/contract.md): "Kill -9 of service or driver at random points: no staged result
lost, no entry placed twice, no unsafe replay, every watcher converges (fold == capture)".
``test_crash.py`` runs the harness of :mod:`tests.crash.harness` (real ``python -m
lane.server.app`` processes and real driver processes, SIGKILLed at random with a seeded RNG)
once, for a couple of dozen kills; this runs it for ``--kills`` kills, lets every run finish,
checks every lane, and prints the counts: kills of services and of drivers, takeovers, safe
replays, interruptions, reconciliations by the service, the violations of the crash
invariants, and the service errors that retries hid (INTERNAL answers). No timing is asserted.
The exit status is 0 when there is neither, else 1. It lives beside the suite it extends, not
among the benchmarks: it measures nothing.

PostgreSQL is the one at ``--database-url`` (its role needs CREATEDB: a scratch database is
created and dropped), else an embedded pgserver in a temporary directory removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from lane.server.app.embedded import start_embedded
from lane.server.testing import scratch_database
from tests.crash.harness import HarnessConfig, run_harness


async def soak(args: argparse.Namespace, server_url: str, workdir: Path) -> int:
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", flush=True)

    async with scratch_database(server_url, prefix="lane_crash") as url:
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
    parser = argparse.ArgumentParser(prog="python -m tests.crash.soak", description=__doc__)
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
        return asyncio.run(soak(args, server_url, workdir / "logs"))
    except KeyboardInterrupt:
        return 130
    finally:
        if embedded is not None:
            embedded.stop()
        if not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
