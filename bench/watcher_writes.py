"""What one WatchLane write costs the server, and what watchers on busy lanes take from the
commit rate — of this working tree, and of a git ref beside it in the same run.

Run from the repository root (virtualenv active)::

    python -m bench.watcher_writes [--compare REF] [--watchers 1000 --drivers 8 --seconds 8]

For each tree (``--compare REF``'s first, unpacked as ``bench.commit_throughput --compare``
does, on a scratch database of its own; then the working tree's), two phases of
:func:`bench.commit_throughput.run_service_load`, each on a fresh service process: the
``--drivers`` lifecycle drivers alone, then with ``--watchers`` WatchLane streams spread over
the drivers' lanes (``W / N`` per busy lane), in a process of their own. The phases of the two
trees alternate (ref, tree, ref, tree), so a drift of the shared machine's load falls on both.

Printed per tree: lifecycle commits/s without and with the watchers and their ratio, server CPU
per commit in each, and the **server CPU per watcher write**: the difference of the two, per
commit, divided by the watchers of each lane (each commit is one event group, one write per
watcher of its lane). Every watcher must reach its lane's last revision (else exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.commit_throughput import (
    REPO_ROOT,
    Database,
    RefTree,
    ServiceResult,
    _cpu_per_commit,
    provision_database,
    ref_package_path,
    run_service,
    run_service_load,
    scratch_database,
    unpack_ref,
    verify_ref_service,
    watcher_limits,
)
from bench.commit_throughput import parse_args as throughput_args
from bench.entry import add_database_url, run_benchmark


@dataclass(frozen=True)
class Pair:
    """One tree's two phases."""

    label: str
    alone: ServiceResult
    watched: ServiceResult

    def per_write(self, per_lane: float) -> float | None:
        """Server CPU seconds per watcher write."""
        alone = _cpu_per_commit(self.alone, "server")
        watched = _cpu_per_commit(self.watched, "server")
        if alone is None or watched is None:
            return None
        return (watched - alone) / per_lane

    @property
    def ratio(self) -> float:
        return self.watched.commits_per_second / max(self.alone.commits_per_second, 1e-9)

    @property
    def ok(self) -> bool:
        fleet = self.watched.fleet
        return (
            not self.alone.mismatches
            and not self.watched.mismatches
            and fleet is not None
            and not fleet.errors
            and not fleet.behind
        )


def _micros(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f} µs"


def report(args: argparse.Namespace, pairs: Sequence[Pair]) -> str:
    per_lane = args.watchers / args.drivers
    lines = [
        f"watcher writes: {args.drivers} drivers, {args.watchers:,} watchers ({per_lane:g} per"
        f" busy lane), {args.seconds:g} s windows",
        "",
        f"  {'':<28} {'commits/s alone':>16} {'with watchers':>14} {'ratio':>7}"
        f" {'server/commit alone':>20} {'with watchers':>14} {'per watcher write':>18}",
    ]
    for pair in pairs:
        lines.append(
            f"  {pair.label:<28} {pair.alone.commits_per_second:>16,.0f}"
            f" {pair.watched.commits_per_second:>14,.0f} {pair.ratio:>7.3f}"
            f" {_micros(_cpu_per_commit(pair.alone, 'server')):>20}"
            f" {_micros(_cpu_per_commit(pair.watched, 'server')):>14}"
            f" {_micros(pair.per_write(per_lane)):>18}"
        )
    if len(pairs) == 2:
        ref, tree = (pair.per_write(per_lane) for pair in pairs)
        if ref and tree:
            lines.append(f"  per watcher write, tree ÷ ref: {tree / ref:.2f}")
        lines.append(f"  throughput ratio, tree ÷ ref: {pairs[1].ratio / pairs[0].ratio:.2f}")
    for pair in pairs:
        lines.append(f"  {pair.label}: alone {pair.alone.cpu.describe()}")
        lines.append(f"  {pair.label}: watched {pair.watched.cpu.describe()}")
        lines.append(f"  {pair.label}: checks {'OK' if pair.ok else 'FAILED'}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.watcher_writes",
        description="Server CPU per WatchLane write, and the commit rate with watchers ÷ without.",
    )
    parser.add_argument("--compare", metavar="REF", help="also measure this git ref's service")
    parser.add_argument("--watchers", type=int, default=1000, help="WatchLane streams (1000)")
    parser.add_argument("--drivers", type=int, default=8, help="lifecycle drivers (8)")
    parser.add_argument("--seconds", type=float, default=8.0, help="window per phase (8)")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up per phase (2)")
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        help="profile the server of each phase with py-spy into FILE (the last phase's stays:"
        " the working tree with watchers)",
    )
    add_database_url(parser)
    args = parser.parse_args(argv)
    if args.watchers < args.drivers or args.drivers < 1 or args.seconds <= 0:
        parser.error("--watchers must be at least --drivers, and both and --seconds positive")
    return args


async def run(args: argparse.Namespace) -> int:
    load = throughput_args(
        [
            f"--drivers={args.drivers}",
            f"--seconds={args.seconds}",
            f"--warmup={args.warmup}",
            f"--watchers={args.watchers}",
            "--no-replay",
            *([f"--py-spy={args.py_spy}"] if args.py_spy else []),
        ]
    )
    async with contextlib.AsyncExitStack() as stack:
        work_dir = Path(tempfile.mkdtemp(prefix="lane-bench-"))
        stack.callback(shutil.rmtree, work_dir, ignore_errors=True)
        db = await stack.enter_async_context(provision_database(args.database_url))
        trees: list[tuple[str, Path, Database, RefTree | None]] = []
        if args.compare:
            tree = await unpack_ref(args.compare, work_dir)
            await ref_package_path(tree)
            ref_db = await stack.enter_async_context(
                scratch_database(db.server_url, db.description)
            )
            trees.append((f"{tree.label} ({args.compare})", tree.root, ref_db, tree))
        trees.append(("working tree", REPO_ROOT, db, None))
        results: dict[str, dict[int, ServiceResult]] = {label: {} for label, *_ in trees}
        for watchers in (0, args.watchers):
            for label, root, database, ref in trees:
                print(f"{label}: {watchers:,} watchers ...", flush=True)
                limits = watcher_limits(args.watchers, args.drivers)
                async with run_service(database.url, True, limits, root=root) as service:
                    if ref is not None:
                        verify_ref_service(ref, service)
                    results[label][watchers] = await run_service_load(
                        database, load, service, watchers=watchers
                    )
        pairs = [Pair(label, got[0], got[args.watchers]) for label, got in results.items()]
    print()
    print(report(args, pairs))
    return 0 if all(pair.ok for pair in pairs) else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
