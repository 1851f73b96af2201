"""The Python work of one command between its request and PostgreSQL, with no I/O: the domain
step, the commit statement
(``lane_writes.commit_statement``) and psycopg's conversion and dumping of its parameters, each
timed per commit over the drivers' lifecycle (:mod:`bench.replay`'s run: 114 commits of 5 turns
x 4 tool calls). The best of several passes, so a busy machine inflates the figures less; it
prints and asserts nothing. Compare a change with ``--compare``-free A/B runs of this module
before and after it (it needs no server)::

    python -m bench.command_cost [--passes 30]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from lane.v1 import snapshot_pb2
from psycopg._queries import PostgresQuery
from psycopg.abc import AdaptContext
from psycopg.adapt import Transformer

from bench import replay
from bench.entry import add_run_shape
from lane.server.domain import lanes
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store.lane_ref import LaneRef
from lane.server.store.lane_writes import commit_statement

STAGES = ("domain step", "commit_statement", "psycopg dump")


class _TimedLane(replay._Lane):
    """A lane whose commits are timed stage by stage (the optimistic path's work)."""

    def __init__(self, base: replay._Lane, context: AdaptContext | None) -> None:
        super().__init__(base.ref, base.state, base.version)
        self.context = context
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.commits = 0

    def commit(self, command: str, step: Callable[[LaneState, datetime], Transition]) -> Transition:
        clock = time.perf_counter
        now = datetime.now(UTC)
        t0 = clock()
        transition = step(self.state, now)
        t1 = clock()
        statement = commit_statement(self.ref, self.state, transition, self.version)
        t2 = clock()
        assert statement is not None
        query = PostgresQuery(Transformer.from_context(self.context))
        query.convert(statement.sql, statement.params)  # which dumps the parameters too
        t3 = clock()
        for stage, seconds in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            self.seconds[stage] += seconds
        self.commits += 1
        self.state, self.version = transition.state, self.version + 1
        return transition


def measure(passes: int, runs: int, calls: int, turns: int) -> dict[str, float]:
    """Microseconds per commit of each stage, the best pass of ``passes`` (each ``runs`` runs
    of the lifecycle on one lane), with the garbage collector as the server runs it."""
    base = replay._Lane(LaneRef("bench", "cost"), _created(), 1)
    replay._record_run(base, 1, calls, turns)  # the lane's first run: from here, steady state
    best = dict.fromkeys(STAGES, float("inf"))
    for _ in range(passes):
        lane = _TimedLane(base, None)
        for run_no in range(2, 2 + runs):
            replay._record_run(lane, run_no, calls, turns)
        for stage in STAGES:
            best[stage] = min(best[stage], lane.seconds[stage] / lane.commits * 1e6)
    return best


def _created() -> LaneState:
    return lanes.create_lane("cost", snapshot_pb2.LaneConfiguration(), datetime.now(UTC)).state


def report(best: dict[str, float], args: argparse.Namespace) -> str:
    total = sum(best.values())
    lines = [
        f"Python work per commit, no I/O (best of {args.passes} passes of {args.runs} runs,"
        f" {args.turns} turns x {args.calls} calls; gc thresholds {gc.get_threshold()},"
        f" frozen objects {gc.get_freeze_count():,}):",
    ]
    lines += [f"  {stage:<18} {value:8.1f} µs" for stage, value in best.items()]
    lines.append(f"  {'total':<18} {total:8.1f} µs")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.command_cost", description=__doc__)
    parser.add_argument("--passes", type=int, default=20, help="passes, best kept (default 20)")
    parser.add_argument("--runs", type=int, default=5, help="lifecycle runs per pass (default 5)")
    add_run_shape(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(report(measure(args.passes, args.runs, args.calls, args.turns), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
