"""Failover: how soon the service follows a promoted standby, and how it answers meanwhile.

Run from the repository root (virtualenv active)::

    python -m bench.failover [--delays 0 10 20] [--lanes 20] [--compare REF]

For each promotion delay D, a drill (``lane.server.failover_drill``, the one the CI test
``tests/outage/test_failover.py`` runs) on a fresh primary and synchronous hot standby
(``lane.server.standby_pair``: the system's PostgreSQL 15+ binaries, as the ``postgres`` user):
the service (a process of its own, one worker) on the multi-host URL with
``target_session_attrs=read-write``, ``--lanes`` drivers committing continuously with request
ids (again after UNAVAILABLE, 0.1 s later) and a watcher per lane; the primary is stopped with
``pg_ctl stop -m immediate`` and the standby promoted D seconds later.

Printed per delay:

- the time from the promotion (``pg_ctl promote -w`` returned: the standby accepts writes) to
  the first acknowledged command, and until every lane had one;
- the slowest error answer to a command sent during the gap (stop to promotion);
- the acknowledged commands lost and doubled (their text absent from the lane, or there more
  than once) and the watchers whose fold differs from a fresh snapshot;
- when readiness (gRPC health of ``lane.v1.LaneService``, and ``GET /readyz``) changed.

The baseline, in the same run, is the promotion itself (its time is the zero of the first
figure) and, with ``--compare REF``, the service of git ref ``REF`` (e.g. ``main``) on the same
drill, before this checkout's. It prints; it asserts nothing. The exit status is 1 when an
acknowledged command was lost or doubled, or a watcher differed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.commit_throughput import unpack_ref
from bench.entry import run_benchmark, server_tree
from lane.server.failover_drill import DrillPlan, DrillResult, ServerCommand, run_drill


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    parser.add_argument(
        "--delays",
        type=float,
        nargs="+",
        default=[0.0, 10.0, 20.0],
        help="seconds between the primary's stop and the promotion, one drill each",
    )
    parser.add_argument("--lanes", type=int, default=20, help="drivers, one lane each")
    parser.add_argument(
        "--compare", metavar="REF", help="also run the service of git ref REF, first"
    )
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace) -> int:
    servers = [ServerCommand()]
    with tempfile.TemporaryDirectory(prefix="lane-bench-failover-") as scratch:
        if args.compare:
            tree = await unpack_ref(args.compare, Path(scratch))
            server = server_tree(tree.root)
            label = f"{args.compare} ({tree.commit[:7]})"
            servers.insert(0, ServerCommand(server.app, server.cwd, str(server.cwd), label))
        results: list[DrillResult] = []
        for delay in args.delays:
            for command in servers:
                plan = DrillPlan(promote_after=delay, lanes=args.lanes, server=command)
                result = await run_drill(plan)
                print(result.summary(), flush=True)
                if result.driver_failures:
                    print("  driver failures:", result.driver_failures[:5], flush=True)
                results.append(result)
    failed = any(r.lost or r.doubled or r.watchers_match() for r in results)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, _run, argv)


if __name__ == "__main__":
    sys.exit(main())
