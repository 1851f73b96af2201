"""A crash-test driver process: the shipped ``lane.client`` Driver on one lane, until the lane
has ``--runs`` ended runs, killed (or not) by the tests.

    python -m tests.crash.driver --target HOST:PORT[,HOST:PORT...] --lane L --driver-id D \\
        --database-url URL [--runs N] [--seed S] [--lease-seconds 3] [--plan JSON]

Each round: if the lane has an open run, :meth:`Driver.recover` takes it over (the SDK's
recovery: it waits out a dead driver's lease, finishes the open batch — safe replay,
interruption, placement by the takeover — and continues the run); otherwise
:meth:`Driver.run` starts the lane's next run, ``<lane>.r<ended runs>``. The driver sends its
commands over its default DriveLane session, on one channel to every ``--target`` (gRPC's
pick_first: when the service it talks to dies, the channel moves on to another).

The model is a :class:`ScriptedModel` whose script is the run's plan, a pure function of (seed,
operation id) or ``--plan``, so a driver taking a run over answers as its predecessor would
have. The tools are :mod:`tests.crash.recording`'s, which record every execution.

Exit status: 0 done, 3 the lease was lost (:class:`LeaseLost`), 4 the service stayed
unreachable, 1 anything else (the traceback is in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import grpc
import psycopg
from lane.client.connect import open_channel
from lane.client.driver import Driver, LeaseLost
from lane.client.errors import LaneBusy, LaneError, OperationNotOpen
from lane.client.hooks import Hooks
from lane.client.model import ScriptedCall, ScriptedModel, ScriptStep
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from tests.crash.recording import (
    NEVER_TOOL,
    SAFE_TOOL,
    UNKNOWN_TOOL,
    ensure_executions_table,
    hold_start,
    recording_tools,
)

EXIT_DONE = 0
EXIT_LEASE_LOST = 3
EXIT_UNREACHABLE = 4

#: How long a command is retried while no service answers (services are restarted at once).
RETRY_SECONDS = 120.0

_log = logging.getLogger("tests.crash.driver")


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallSpec:
    """One tool call of a planned assistant message; its arguments say how it behaves."""

    name: str
    steps: int = 2
    delay: float = 0.2
    checkpoint: bool = True
    start_delay: float = 0.0


@dataclass(frozen=True)
class RunPlan:
    """What a run does: its tool execution mode and one list of calls per tool turn."""

    mode: pb.ToolExecution.ValueType
    turns: tuple[tuple[CallSpec, ...], ...]

    def model(self, operation_id: str) -> ScriptedModel:
        """The run's model. Call ids are unique in the lane (the checks rely on it):
        ``<operation id>.t<turn>.c<index>``."""
        steps = [
            ScriptStep(
                f"turn {k} of {operation_id}",
                calls=[
                    ScriptedCall(spec.name, _arguments(spec), id=f"{operation_id}.t{k}.c{index}")
                    for index, spec in enumerate(calls)
                ],
            )
            for k, calls in enumerate(self.turns)
        ]
        return ScriptedModel(steps, final_text=f"{operation_id} done")


def _arguments(spec: CallSpec) -> dict[str, Any]:
    arguments = asdict(spec)
    del arguments["name"]
    return arguments


def plan_for(seed: int, operation_id: str, override: dict[str, Any] | None) -> RunPlan:
    """The plan of ``operation_id``: from ``override`` (``--plan``) or drawn at random."""
    if override is not None:
        mode = (
            pb.TOOL_EXECUTION_SEQUENTIAL
            if override.get("mode") == "sequential"
            else pb.TOOL_EXECUTION_PARALLEL
        )
        return RunPlan(
            mode, tuple(tuple(CallSpec(**call) for call in turn) for turn in override["turns"])
        )
    rng = random.Random(f"{seed}:{operation_id}")
    mode = pb.TOOL_EXECUTION_PARALLEL if rng.random() < 0.6 else pb.TOOL_EXECUTION_SEQUENTIAL
    drawn: list[tuple[CallSpec, ...]] = []
    for _ in range(rng.choice((2, 3))):
        calls: list[CallSpec] = []
        for _ in range(rng.randint(1, 4)):
            name = rng.choice((SAFE_TOOL,) * 4 + (NEVER_TOOL,) * 5 + (UNKNOWN_TOOL,))
            calls.append(
                CallSpec(
                    name=name,
                    steps=rng.randint(1, 4),
                    delay=round(rng.uniform(0.1, 0.45), 2),
                    checkpoint=rng.random() < 0.7,
                )
            )
        drawn.append(tuple(calls))
    return RunPlan(mode, tuple(drawn))


# -- the process ---------------------------------------------------------------------------------


def channel_target(targets: Sequence[str]) -> str:
    """One gRPC target for every ``host:port`` (IPv4 addresses when there are several)."""
    return targets[0] if len(targets) == 1 else "ipv4:" + ",".join(targets)


async def lane_runs(conn: psycopg.AsyncConnection[Any], lane_id: str) -> tuple[int, str]:
    """The lane's ended runs, and its open run's id ('' when none), as stored."""
    cur = await conn.execute(
        "SELECT count(*) FILTER (WHERE phase = 'ended'),"
        " coalesce(max(operation_id) FILTER (WHERE phase <> 'ended'), '')"
        " FROM operations WHERE lane_id = %s",
        (lane_id,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


async def drive_lane(args: argparse.Namespace) -> int:
    """Drive runs on the lane until it has ``args.runs`` ended runs; the exit status."""
    override = json.loads(args.plan) if args.plan else None
    targets = [t for t in args.target.split(",") if t]
    async with (
        await psycopg.AsyncConnection.connect(args.database_url, autocommit=True) as conn,
        open_channel(channel_target(targets)) as channel,
    ):
        await ensure_executions_table(conn)
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        tools = recording_tools(conn, args.driver_id)
        while True:
            ended, open_id = await lane_runs(conn, args.lane)
            if not open_id and ended >= args.runs:
                _log.info("lane %s: %d runs ended; done", args.lane, ended)
                return EXIT_DONE
            operation_id = open_id or f"{args.lane}.r{ended}"
            plan = plan_for(args.seed, operation_id, override)
            driver = Driver(
                stub,
                args.lane,
                tools,
                driver_id=args.driver_id,
                lease_seconds=args.lease_seconds,
                hooks=Hooks(before_tool=[hold_start]),
                settings=pb.RunSettings(tool_execution=plan.mode),
                retry_seconds=RETRY_SECONDS,
                model=plan.model(operation_id),
            )
            try:
                if open_id:
                    result = await driver.recover(open_id, wait_seconds=RETRY_SECONDS)
                else:
                    result = await driver.run(f"prompt {operation_id}", operation_id=operation_id)
            except LeaseLost:
                _log.warning("lane %s: lease of %s lost; giving up", args.lane, operation_id)
                return EXIT_LEASE_LOST
            except (OperationNotOpen, LaneBusy) as error:
                # The run ended meanwhile (the service reconciled it), or another run began
                # after this round looked: look again.
                _log.info("lane %s: %s; looking again", args.lane, error)
                continue
            except LaneError as error:
                if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    _log.error("lane %s: no service answers: %s", args.lane, error)
                    return EXIT_UNREACHABLE
                raise
            _log.info("lane %s: run %s %s", args.lane, result.operation_id, result.status_name)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.crash.driver", description=__doc__)
    parser.add_argument("--target", required=True, help="HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--lane", required=True)
    parser.add_argument("--driver-id", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--runs", type=int, default=1, help="stop once the lane has N ended runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease-seconds", type=int, default=3)
    parser.add_argument("--plan", default="", help="JSON: {mode, turns: [[call spec...]...]}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the driver process; its exit status."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(drive_lane(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
