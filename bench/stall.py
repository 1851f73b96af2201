"""Event-loop stalls: how long other callers wait while one client sends the largest requests.

Run from the repository root (virtualenv active)::

    python -m bench.stall [--over 3000] [--idle-seconds 3] [--database-url URL]

The service is one asyncio process: whatever a command computes on its event loop, every other
caller waits for. The rule is that nothing a client can send holds the loop for more than
20 ms; this benchmark's target is that no other caller waits more than 50 ms for an answer
(its own round trip included). One run:

1. The real service runs as a subprocess (``python -m lane.server.app``, from
   ``--service-root``, default this checkout; ``python -m service.app`` for a checkout from
   before the server package was renamed), on a scratch database.
2. A **probe** process (this module with ``--probe``, a client of its own, so the load
   client's Python work cannot delay it) calls two cheap RPCs in a loop, each on its own
   channel, and times every call: ``grpc.health.v1.Health/Check`` (no database) and
   ``GetLaneSnapshot`` of a small lane nobody else touches (a database read). The longest of
   those times in a phase is the longest any other caller waited.
3. **Baseline:** the probes alone, the service idle, for ``--idle-seconds``.
4. **Scenarios**, the probes running throughout, each on a fresh lane: StartRun, StartTurn,
   then SettleAssistantMessage with

   - the largest batch the service accepts (``MAX_TOOL_CALLS`` tool calls),
   - ``--over`` tool calls (3,000: expected to be refused INVALID_ARGUMENT
     ``TOO_MANY_TOOL_CALLS``),
   - a 4 MiB message of a million empty text blocks (expected to be refused
     ``TOO_MANY_CONTENT_BLOCKS``; it shows what decoding such a request costs),

   then five more commands on that lane: StartToolCall, UpdateToolCall (checkpoint),
   StageToolOutcome (staging and placement), StartToolCall, EndRun ABORTED (which settles and
   places every unfinished call of the batch in one commit). After a refusal the five start
   with a one-call SettleAssistantMessage instead of the second StartToolCall.

Printed: per phase and probe, the calls made and their median, 99th percentile and longest
time, beside the baseline; the load client's time for each command (what it waited, its own
work included). The exit status is 0, or 1 when a scenario did not get the answer it expects
(a refusal where acceptance was expected, or the reverse) — never because of a timing.

``--service-root DIR`` runs the service from another checkout (e.g. one exported with ``git
archive``) against the same benchmark, to compare before and after a change
(``--without-count-limits`` for a service that predates the count limits). Every process and
directory started here is stopped and removed on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.testing import Aim, LaneScript, assistant, result, tool_call, user
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from bench.commit_throughput import provision_database
from bench.entry import add_database_url, run_benchmark, server_tree, stop_process
from lane.server.domain.limits import MAX_TOOL_CALLS

if TYPE_CHECKING:
    from lane.v1.lane_service_pb2_grpc import LaneServiceAsyncStub

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_WAIT_SECONDS = 0.050
RPC_TIMEOUT_SECONDS = 600.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
PROBE_PAUSE_SECONDS = 0.002  # between one probe call's answer and the next call
_LISTENING = re.compile(r"lane service listening on (\S+?)(?:;| \()")
_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


# -- the service ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def service(database_url: str, root: Path) -> AsyncIterator[str]:
    """The server of the checkout at ``root`` (``python -m lane.server.app``, or an older
    checkout's ``python -m service.app``: :func:`bench.entry.server_tree`) on a free port; its
    address."""
    server = server_tree(root)
    env = dict(os.environ)
    env.update(
        LANE_DATABASE_URL=database_url,
        LANE_LISTEN="127.0.0.1:0",
        LANE_GRACE_SECONDS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(server.cwd), env.get("PYTHONPATH", "")])),
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", server.app, cwd=server.cwd, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    tail: list[str] = []

    async def read_log() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:  # drained for the process's whole life
            line = raw.decode(errors="replace").rstrip()
            tail[:] = [*tail[-39:], line]
            found = _LISTENING.search(line)
            if found and not listening.done():
                listening.set_result(found.group(1))
        if not listening.done():
            listening.set_exception(RuntimeError("the service exited:\n" + "\n".join(tail)))

    reader = asyncio.create_task(read_log())
    try:
        async with asyncio.timeout(60):
            address = await listening
        yield address
    finally:
        await stop_process(process)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


# -- the probe process ------------------------------------------------------------------------


async def probe_main(address: str, lane_id: str) -> int:
    """The probe process: between ``start`` and ``stop`` lines on stdin, call both probes in a
    loop; after ``stop``, print each probe's call times (seconds) as one JSON line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with (
        grpc.aio.insecure_channel(address, options=_OPTIONS) as health_channel,
        grpc.aio.insecure_channel(address, options=_OPTIONS) as lane_channel,
    ):
        health = health_pb2_grpc.HealthStub(health_channel)
        lanes = lane_service_pb2_grpc.LaneServiceStub(lane_channel)
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "Health.Check": lambda: health.Check(
                health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_SECONDS
            ),
            "GetLaneSnapshot (another lane)": lambda: lanes.GetLaneSnapshot(
                pb.GetLaneSnapshotRequest(lane_id=lane_id), timeout=RPC_TIMEOUT_SECONDS
            ),
        }
        for call in calls.values():  # warm both channels
            await call()
        print("ready", flush=True)
        while line := (await reader.readline()).decode().strip():
            if line != "start":
                continue
            stop = asyncio.Event()
            times: dict[str, list[float]] = {name: [] for name in calls}

            async def loop_on(
                name: str, times: dict[str, list[float]], stop: asyncio.Event = stop
            ) -> None:
                while not stop.is_set():
                    started = time.perf_counter()
                    await calls[name]()
                    times[name].append(time.perf_counter() - started)
                    await asyncio.sleep(PROBE_PAUSE_SECONDS)

            tasks = [asyncio.create_task(loop_on(name, times)) for name in calls]
            await reader.readline()  # "stop"
            stop.set()
            await asyncio.gather(*tasks)
            print(json.dumps(times), flush=True)
    return 0


@dataclass
class Probe:
    """The probe process, driven over its stdin and stdout."""

    process: asyncio.subprocess.Process

    async def _line(self) -> str:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("the probe process ended")
        return line.decode()

    async def ready(self) -> None:
        while (await self._line()).strip() != "ready":
            pass

    async def start(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"start\n")
        await self.process.stdin.drain()

    async def stop(self) -> dict[str, list[float]]:
        assert self.process.stdin is not None
        self.process.stdin.write(b"stop\n")
        await self.process.stdin.drain()
        times: dict[str, list[float]] = json.loads(await self._line())
        return times


@contextlib.asynccontextmanager
async def probe_process(address: str, lane_id: str) -> AsyncIterator[Probe]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.stall", "--probe", address, lane_id, cwd=REPO_ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        probe = Probe(process)
        async with asyncio.timeout(60):
            await probe.ready()
        yield probe
    finally:
        if process.stdin is not None:
            process.stdin.close()
        await stop_process(process)


# -- the load ---------------------------------------------------------------------------------


def tool_calls(count: int) -> messages_pb2.AssistantMessage:
    """An assistant message asking for ``count`` shell calls, ``call-0`` on."""
    return assistant(*(tool_call(f"call-{i}", "shell", {"cmd": f"echo {i}"}) for i in range(count)))


@dataclass(frozen=True)
class Scenario:
    name: str
    #: The settled message, built before the phase starts (a million blocks take a while).
    message: Callable[[], messages_pb2.AssistantMessage]
    #: The refusal reason expected, or None when the message must be accepted.
    refusal: str | None


@dataclass
class Outcome:
    name: str
    commands: list[tuple[str, float, str]] = field(default_factory=list)  # name, seconds, answer
    probes: dict[str, list[float]] = field(default_factory=dict)
    problem: str | None = None


async def timed(
    outcome: Outcome, label: str, call: Awaitable[Any]
) -> tuple[Any, grpc.aio.AioRpcError | None]:
    started = time.perf_counter()
    try:
        answer = await call
    except grpc.aio.AioRpcError as error:
        outcome.commands.append((label, time.perf_counter() - started, _refusal(error)))
        return None, error
    outcome.commands.append((label, time.perf_counter() - started, "OK"))
    return answer, None


def _refusal(error: grpc.aio.AioRpcError) -> str:
    from google.rpc import error_details_pb2, status_pb2

    code = error.code().name if error.code() is not None else "?"
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return f"{code} {info.reason}"
    return code


async def run_scenario(stub: LaneServiceAsyncStub, scenario: Scenario, probe: Probe) -> Outcome:
    outcome = Outcome(scenario.name)
    message = scenario.message()
    lane = await LaneScript.create(stub, prefix="stall")
    wait = RPC_TIMEOUT_SECONDS
    await probe.start()
    await asyncio.sleep(0.3)  # the probes' steady state before the load
    try:
        # Every command below is timed, so each request is built from the ids and sent here,
        # with its timeout, rather than through the script's steps.
        start = Aim(lane.lane_id).request(pb.StartRunRequest, prompt=[user("go")])
        run, _ = await timed(outcome, "StartRun", stub.StartRun(start, timeout=wait))
        aim = Aim(lane.lane_id, run.operation_id)
        turn_request = aim.request(pb.StartTurnRequest)
        turn, _ = await timed(outcome, "StartTurn", stub.StartTurn(turn_request, timeout=wait))
        in_turn = replace(aim, turn_id=turn.turn_id)
        settle = in_turn.request(pb.SettleAssistantMessageRequest, message=message)
        label = f"SettleAssistantMessage ({_describe(message)})"
        _, error = await timed(outcome, label, stub.SettleAssistantMessage(settle, timeout=wait))
        got = None if error is None else _refusal(error)
        if scenario.refusal is None and got is not None:
            outcome.problem = f"expected acceptance, got {got}"
        elif scenario.refusal is not None and (got is None or scenario.refusal not in got):
            outcome.problem = f"expected {scenario.refusal}, got {got or 'OK'}"

        call_0 = replace(aim, tool_call_id="call-0")
        commands: list[tuple[str, Callable[..., Awaitable[Any]], Message]] = []
        if error is not None:  # the batch was refused: settle a one-call message instead
            settle_one = in_turn.request(pb.SettleAssistantMessageRequest, message=tool_calls(1))
            commands.append(
                ("SettleAssistantMessage (1 call)", stub.SettleAssistantMessage, settle_one)
            )
        commands += [
            (
                "StartToolCall",
                stub.StartToolCall,
                call_0.request(pb.StartToolCallRequest, arguments_json="{}"),
            ),
            (
                "UpdateToolCall (checkpoint)",
                stub.UpdateToolCall,
                call_0.request(
                    pb.UpdateToolCallRequest, partial_result=result("half"), checkpoint=True
                ),
            ),
            (
                "StageToolOutcome",
                stub.StageToolOutcome,
                call_0.request(
                    pb.StageToolOutcomeRequest, executed=pb.ExecutedOutcome(result=result("done"))
                ),
            ),
        ]
        if error is None:
            start_1 = replace(aim, tool_call_id="call-1").request(
                pb.StartToolCallRequest, arguments_json="{}"
            )
            commands.append(("StartToolCall", stub.StartToolCall, start_1))
        aborted = aim.request(pb.EndRunRequest, status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
        commands.append(("EndRun ABORTED", stub.EndRun, aborted))
        for label, method, request in commands:
            _, failed = await timed(outcome, label, method(request, timeout=wait))
            if failed is not None and outcome.problem is None:
                outcome.problem = f"{label} was refused: {_refusal(failed)}"
        await asyncio.sleep(0.3)  # anything the service still does after the last answer
    finally:
        outcome.probes = await probe.stop()
    return outcome


def _describe(message: messages_pb2.AssistantMessage) -> str:
    calls = sum(1 for block in message.content if block.WhichOneof("block") == "tool_call")
    size = message.ByteSize()
    if calls:
        return f"{calls:,} tool calls, {size / 1024:,.0f} KiB"
    return f"{len(message.content):,} empty text blocks, {size / 2**20:,.1f} MiB"


# -- report -----------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(baseline: dict[str, list[float]], outcomes: Sequence[Outcome], root: Path) -> str:
    lines = [
        f"event-loop stalls: service from {root}; probes Health.Check and GetLaneSnapshot of an"
        f" idle lane, each in a loop ({PROBE_PAUSE_SECONDS * 1e3:g} ms pause), from a process"
        " of their own",
        f"target: no other caller waits more than {TARGET_WAIT_SECONDS * 1e3:g} ms",
        "",
        f"  {'phase':<46} {'probe':<31} {'calls':>6} {'median':>8} {'p99':>8} {'longest':>9}",
    ]
    rows = [("idle (baseline)", baseline), *((o.name, o.probes) for o in outcomes)]
    for phase, probes in rows:
        for name, times in probes.items():
            if not times:
                lines.append(f"  {phase:<46} {name:<31} {0:>6}")
                continue
            lines.append(
                f"  {phase:<46} {name:<31} {len(times):>6} {_ms(statistics.median(times)):>8}"
                f" {_ms(_percentile(times, 0.99)):>8} {_ms(max(times)):>9}"
            )
    lines.append("  (times in ms)")
    idle = max((max(t) for t in baseline.values() if t), default=0.0)
    for outcome in outcomes:
        longest = max((max(t) for t in outcome.probes.values() if t), default=0.0)
        verdict = "met" if longest <= TARGET_WAIT_SECONDS else "NOT met"
        lines += [
            "",
            f"{outcome.name}: longest wait of another caller {_ms(longest)} ms (idle:"
            f" {_ms(idle)} ms) — target {verdict}"
            + (f"; UNEXPECTED: {outcome.problem}" if outcome.problem else ""),
        ]
        lines += [
            f"    {label:<62} {_ms(seconds):>10} ms  {answer}"
            for label, seconds, answer in outcome.commands
        ]
    return "\n".join(lines)


# -- entry point ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stall",
        description="How long other callers wait while one client sends the largest requests.",
    )
    parser.add_argument(
        "--over", type=int, default=3000, help="tool calls of the refused batch (3000)"
    )
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="baseline length (3 s)")
    parser.add_argument(
        "--largest",
        type=int,
        default=MAX_TOOL_CALLS,
        help=f"tool calls of the accepted batch ({MAX_TOOL_CALLS})",
    )
    parser.add_argument(
        "--without-count-limits",
        action="store_true",
        help="the service predates the count limits: the --over batch is expected to be"
        " accepted, the million blocks refused PAYLOAD_TOO_LARGE",
    )
    parser.add_argument(
        "--service-root",
        type=Path,
        default=REPO_ROOT,
        help="checkout to run the service from (default: this one)",
    )
    parser.add_argument("--probe", nargs=2, metavar=("ADDRESS", "LANE"), help=argparse.SUPPRESS)
    add_database_url(parser)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    if args.probe:
        return await probe_main(*args.probe)
    root = args.service_root.resolve()
    before = args.without_count_limits
    over = None if before else "TOO_MANY_TOOL_CALLS"
    huge = "PAYLOAD_TOO_LARGE" if before else "TOO_MANY_CONTENT_BLOCKS"
    scenarios = [
        Scenario(
            f"largest allowed batch ({args.largest} calls)",
            lambda: tool_calls(args.largest),
            None,
        ),
        Scenario(
            f"{args.over:,} tool calls (over the limit)",
            lambda: tool_calls(args.over),
            over,
        ),
        Scenario("a million empty text blocks (4 MiB)", _million_blocks, huge),
    ]
    async with provision_database(args.database_url) as db:
        print(
            f"PostgreSQL {db.version} ready ({db.description}); starting the service ...",
            flush=True,
        )
        async with (
            service(db.url, root) as address,
            grpc.aio.insecure_channel(address, options=_OPTIONS) as channel,
        ):
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            idle = await LaneScript.create(stub, prefix="idle")
            await idle.start_run("hello")
            async with probe_process(address, idle.lane_id) as probe:
                await run_scenario(stub, Scenario("warm-up", lambda: tool_calls(4), None), probe)
                print(f"baseline: probes alone for {args.idle_seconds:g} s ...", flush=True)
                await probe.start()
                await asyncio.sleep(args.idle_seconds)
                baseline = await probe.stop()
                outcomes = []
                for scenario in scenarios:
                    print(f"scenario: {scenario.name} ...", flush=True)
                    outcomes.append(await run_scenario(stub, scenario, probe))
    print()
    print(report(baseline, outcomes, root))
    return 1 if any(o.problem for o in outcomes) else 0


def _million_blocks() -> messages_pb2.AssistantMessage:
    message = assistant(stop=messages_pb2.STOP_REASON_STOP)
    empty = messages_pb2.ContentBlock(text=messages_pb2.TextContent())
    message.content.extend([empty] * 1_000_000)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
