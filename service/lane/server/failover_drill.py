"""A failover drill: the service on a replicated PostgreSQL while its primary crashes and the
standby is promoted a while later. Shared by the CI test (tests/outage/test_failover.py) and the
benchmark (bench/failover.py), which asserts nothing and prints the figures.

:func:`run_drill`:

1. builds a primary and a synchronous hot standby (:mod:`lane.server.standby_pair`) and starts
   the service as a process of its own (``python -m lane.server.app``, one worker) on their
   multi-host URL (``target_session_attrs=read-write``), with its HTTP port;
2. creates the lanes and drives each one continuously: EnqueueMessage, then a small run
   (StartRun, StartTurn, SettleAssistantMessage, EndRun), every command with a request id and
   sent again with it after UNAVAILABLE; a ``watch_lane`` watcher follows every lane;
3. samples the health service (readiness: ``lane.v1.LaneService``; liveness) over gRPC, and the
   HTTP port's readiness path, every 0.1 s;
4. stops the primary with ``pg_ctl stop -m immediate``, promotes the standby ``promote_after``
   seconds later (``pg_ctl promote -w``: it returns once the standby accepts writes), waits
   until every lane committed again, lets the drivers run on, then stops them;
5. reads every lane back: each acknowledged command's text is in it exactly once (none lost,
   none doubled), and each watcher's fold equals the lane's fresh snapshot.

Times are ``time.monotonic()`` in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.errors import lane_error
from lane.client.retry import RetryPolicy
from lane.client.testing import assistant, text, user
from lane.client.watch import watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from lane.server.standby_pair import StandbyPair

__all__ = [
    "Ack",
    "DrillPlan",
    "DrillResult",
    "ServerCommand",
    "drive_cycles",
    "run_drill",
    "transcript_texts",
]

READINESS_SERVICE = "lane.v1.LaneService"
LIVENESS_SERVICE = "liveness"
READINESS_PATH = "/readyz"
_LISTENING = re.compile(r"lane service listening on 127\.0\.0\.1:(\d+)")
_HTTP_LISTENING = re.compile(r"Connect and gRPC-Web on https?://127\.0\.0\.1:(\d+)")
#: The watchers resume quickly (the client's default backs off up to 10 s).
_WATCH_RETRY = RetryPolicy(initial_backoff=0.05, max_backoff=0.5)


@dataclass(frozen=True)
class ServerCommand:
    """How to start the service: ``python -m {module}`` in ``cwd`` (None: here), with
    ``pythonpath`` first on ``PYTHONPATH`` (a checkout's own server package)."""

    module: str = "lane.server.app"
    cwd: Path | None = None
    pythonpath: str | None = None
    label: str = "this checkout"


@dataclass(frozen=True)
class DrillPlan:
    """What the drill does."""

    #: Seconds between the primary's stop and the standby's promotion.
    promote_after: float = 0.0
    lanes: int = 20
    warm_up: float = 2.0
    #: After every lane committed again, the drivers run on this long.
    settle: float = 2.0
    #: A driver's pause between commands, and before sending a refused one again.
    command_pause: float = 0.05
    retry_pause: float = 0.1
    #: The gRPC deadline of one attempt (long: a command held for long shows as a long attempt).
    attempt_deadline: float = 60.0
    #: Every lane must commit again within this after the promotion (else the drill says so).
    recover_within: float = 60.0
    health_every: float = 0.1
    server: ServerCommand = field(default_factory=ServerCommand)
    #: Extra ``LANE_*`` variables for the service.
    environment: tuple[tuple[str, str], ...] = ()


@dataclass
class Attempt:
    """One RPC attempt of a driver."""

    lane: str
    method: str
    start: float
    end: float
    code: str
    reason: str = ""
    #: The google.rpc.RetryInfo delay of a refusal (None: it had none).
    retry_after: float | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Ack:
    """A command the service acknowledged."""

    lane: str
    method: str
    request_id: str
    revision: int
    #: The unique text the command put in the lane ('' when none).
    marker: str
    time: float


@dataclass
class HealthSample:
    """One sample of the health service and the HTTP readiness path."""

    time: float
    readiness: str
    liveness: str
    #: The HTTP status of ``GET /readyz`` (0: no answer).
    http_readiness: int


@dataclass
class DrillResult:
    """What the drill saw; the figures are properties."""

    plan: DrillPlan
    postgres: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    health: list[HealthSample] = field(default_factory=list)
    stop_began: float = 0.0
    stopped: float = 0.0
    promotion_began: float = 0.0
    #: When ``pg_ctl promote -w`` returned: the standby accepts writes.
    writable: float = 0.0
    #: Attempts to connect the standby received before its promotion (the service's, during
    #: the gap; the URL names the primary first, so none before the stop).
    standby_connections: int = 0
    #: Per lane: its fresh snapshot at the end (None: could not be read).
    captures: dict[str, snapshot_pb2.LaneSnapshot | None] = field(default_factory=dict)
    #: Per lane: its watcher's fold at the end, or the watcher's failure.
    folds: dict[str, snapshot_pb2.LaneSnapshot | str | None] = field(default_factory=dict)
    #: Acknowledged commands whose text is not in the lane / is there more than once.
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    driver_failures: list[str] = field(default_factory=list)
    service_log: str = ""

    @property
    def gap_attempts(self) -> list[Attempt]:
        """Attempts that started while no server accepted writes."""
        return [a for a in self.attempts if self.stop_began <= a.start < self.writable]

    @property
    def slowest_gap_error(self) -> float:
        """Seconds of the slowest refusal of an attempt started during the gap."""
        return max((a.seconds for a in self.gap_attempts if a.code != "OK"), default=0.0)

    @property
    def slowest_gap_answer(self) -> Attempt | None:
        """The attempt started during the gap that took longest to be answered, either way."""
        return max(self.gap_attempts, key=lambda a: a.seconds, default=None)

    @property
    def first_ack_after_promotion(self) -> float | None:
        """Seconds from the standby accepting writes to the first acknowledged attempt that
        started after the primary stopped (None: none)."""
        acked = [a.end for a in self.attempts if a.code == "OK" and a.start >= self.stopped]
        return min(acked) - self.writable if acked else None

    @property
    def every_lane_back_after_promotion(self) -> float | None:
        """Seconds from the standby accepting writes until every lane had an acknowledged
        attempt started after the stop (None: some lane never had one)."""
        firsts = []
        for lane in self.captures:
            acked = [
                a.end
                for a in self.attempts
                if a.lane == lane and a.code == "OK" and a.start >= self.stopped
            ]
            if not acked:
                return None
            firsts.append(min(acked))
        return max(firsts) - self.writable if firsts else None

    def watchers_match(self) -> list[str]:
        """The lanes whose watcher's fold differs from the fresh snapshot (with why)."""
        problems = []
        for lane, capture in self.captures.items():
            fold = self.folds.get(lane)
            if capture is None:
                problems.append(f"{lane}: no snapshot could be read")
            elif not isinstance(fold, snapshot_pb2.LaneSnapshot):
                problems.append(f"{lane}: watcher {fold or 'saw nothing'}")
            elif fold != capture:
                problems.append(
                    f"{lane}: watcher at revision {fold.revision}, lane at {capture.revision}"
                )
        return problems

    def summary(self) -> str:
        """The figures in a few lines."""
        codes: dict[str, int] = {}
        for attempt in self.gap_attempts:
            codes[attempt.code] = codes.get(attempt.code, 0) + 1
        first = self.first_ack_after_promotion
        slowest = self.slowest_gap_answer
        held = (
            "none"
            if slowest is None
            else f"{slowest.seconds:.2f} s ({slowest.code}, sent "
            f"{slowest.start - self.stop_began:+.1f} s after the stop)"
        )
        every = self.every_lane_back_after_promotion
        gap = max(self.writable - self.stopped, 0.001)
        return "\n".join(
            [
                f"promotion {self.plan.promote_after:g} s after the stop ({self.postgres}; "
                f"{self.plan.lanes} drivers; {self.plan.server.label})",
                f"  first acknowledged command {_seconds(first)} after the standby accepted "
                f"writes; every lane {_seconds(every)} after",
                f"  during the gap: {len(self.gap_attempts)} attempts {codes}, slowest error "
                f"answer {self.slowest_gap_error:.2f} s; longest answer {held}",
                f"  attempts to connect to the standby during the gap: "
                f"{self.standby_connections} ({self.standby_connections / gap:.1f}/s)",
                f"  acknowledged {len(self.acks)}, lost {len(self.lost)}, doubled "
                f"{len(self.doubled)}; watchers differing {len(self.watchers_match())}",
                f"  readiness: {self.readiness_story()}",
            ]
        )

    def readiness_story(self) -> str:
        """When readiness changed, relative to the stop."""
        changes = []
        last = None
        for sample in self.health:
            state = (sample.readiness, sample.http_readiness)
            if state != last:
                when = sample.time - self.stop_began
                changes.append(f"{when:+.1f}s {sample.readiness}/{sample.http_readiness}")
                last = state
        return ", ".join(changes) + (
            f" (promotion done at +{self.writable - self.stop_began:.1f}s)"
        )


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def transcript_texts(snapshot: snapshot_pb2.LaneSnapshot) -> list[tuple[str, int]]:
    """Every text block of a lane's transcript messages with its entry's seq (the revision that
    placed it), and of its queued messages (seq 0)."""
    found: list[tuple[str, int]] = []

    def message_texts(message: messages_pb2.AgentMessage, seq: int) -> None:
        kind = message.WhichOneof("message")
        if kind in ("user", "assistant"):
            for block in getattr(message, kind).content:
                if block.WhichOneof("block") == "text":
                    found.append((block.text.text, seq))

    for entry in snapshot.transcript:
        if entry.WhichOneof("payload") == "message":
            message_texts(entry.message.message, entry.seq)
    for item in snapshot.queues:
        if item.WhichOneof("item") == "message":
            message_texts(item.message, 0)
    return found


# -- the service ---------------------------------------------------------------------------------


@dataclass
class _Service:
    process: asyncio.subprocess.Process
    port: int
    http_port: int | None
    log: Path


@contextlib.asynccontextmanager
async def _service(plan: DrillPlan, url: str, log: Path) -> AsyncIterator[_Service]:
    server = plan.server
    env = {
        **os.environ,
        "LANE_DATABASE_URL": url,
        "LANE_LISTEN": "127.0.0.1:0",
        "LANE_HTTP_LISTEN": "127.0.0.1:0",
        "LANE_WORKERS": "1",
        "LANE_GRACE_SECONDS": "1",
        **dict(plan.environment),
    }
    if server.pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [server.pythonpath, env.get("PYTHONPATH")])
        )
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", server.module, cwd=server.cwd, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        port = http_port = None
        give_up = time.monotonic() + 60
        while port is None or http_port is None:
            written = await asyncio.to_thread(log.read_text, errors="replace")
            found, found_http = _LISTENING.search(written), _HTTP_LISTENING.search(written)
            port = int(found.group(1)) if found else None
            http_port = int(found_http.group(1)) if found_http else None
            if process.returncode is not None or time.monotonic() > give_up:
                raise RuntimeError(f"the service did not start:\n{written[-3000:]}")
            await asyncio.sleep(0.05)
        yield _Service(process, port, http_port, log)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(15):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def _http_status(port: int, path: str) -> int:
    """The status of ``GET path`` on the HTTP port (0: no answer within a second)."""
    try:
        async with asyncio.timeout(1.0):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(
                    f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                await writer.drain()
                status_line = await reader.readline()
            finally:
                writer.close()
        return int(status_line.split()[1])
    except (OSError, TimeoutError, IndexError, ValueError):
        return 0


# -- the actors ----------------------------------------------------------------------------------


class _Drill:
    def __init__(self, plan: DrillPlan, result: DrillResult, stub: Any, health: Any) -> None:
        self.plan = plan
        self.result = result
        self.stub = stub
        self.health = health
        self.stopping = asyncio.Event()

    async def attempt(self, lane: str, method: str, request: Any) -> Any:
        start = time.monotonic()
        try:
            answer = await getattr(self.stub, method)(request, timeout=self.plan.attempt_deadline)
        except grpc.aio.AioRpcError as error:
            info = lane_error(error)
            self.result.attempts.append(
                Attempt(
                    lane,
                    method,
                    start,
                    time.monotonic(),
                    error.code().name,
                    info.reason,
                    info.retry_after,
                )
            )
            return None
        self.result.attempts.append(Attempt(lane, method, start, time.monotonic(), "OK"))
        return answer

    async def command(self, lane: str, method: str, request: Any, marker: str = "") -> Any:
        """Send ``request`` until acknowledged, again with its request id after UNAVAILABLE."""
        while True:
            answer = await self.attempt(lane, method, request)
            if answer is not None:
                self.result.acks.append(
                    Ack(lane, method, request.request_id, answer.revision, marker, time.monotonic())
                )
                await asyncio.sleep(self.plan.command_pause)
                return answer
            last = self.result.attempts[-1]
            if last.code != "UNAVAILABLE":
                raise _GaveUp(f"{method} on {lane}: {last.code} {last.reason}")
            await asyncio.sleep(self.plan.retry_pause)

    async def drive(self, lane: str) -> None:
        async def send(method: str, request: Any, marker: str) -> Any:
            return await self.command(lane, method, request, marker)

        try:
            await drive_cycles(lane, send, self.stopping)
        except _GaveUp as failure:
            self.result.driver_failures.append(str(failure))

    async def follow(self, lane: str) -> None:
        folds = self.result.folds
        try:
            async for view in watch_lane(self.stub, lane, retry=_WATCH_RETRY, idle_timeout=20.0):
                folds[lane] = view.snapshot
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the watch gave up or broke its contract: a finding
            folds[lane] = f"failed: {exc!r}"

    async def sample_health(self, http_port: int | None) -> None:
        while True:
            readiness, liveness = await asyncio.gather(
                self._health(READINESS_SERVICE), self._health(LIVENESS_SERVICE)
            )
            http = 0 if http_port is None else await _http_status(http_port, READINESS_PATH)
            self.result.health.append(HealthSample(time.monotonic(), readiness, liveness, http))
            await asyncio.sleep(self.plan.health_every)

    async def _health(self, service: str) -> str:
        try:
            answer = await self.health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1.0
            )
        except grpc.aio.AioRpcError as error:
            return str(error.code().name)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))

    async def read_back(self, lane: str) -> snapshot_pb2.LaneSnapshot | None:
        for _ in range(100):
            try:
                answer = await self.stub.GetLaneSnapshot(
                    pb.GetLaneSnapshotRequest(lane_id=lane), timeout=10
                )
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    return None
                await asyncio.sleep(0.2)
                continue
            snapshot: snapshot_pb2.LaneSnapshot = answer.snapshot
            return snapshot
        return None


class _GaveUp(Exception):
    pass


#: Sends one command (method name, request, the unique text it puts in the lane or '') until
#: acknowledged, and returns the answer.
Send = Callable[[str, Any, str], Awaitable[Any]]


async def drive_cycles(lane: str, send: Send, stopping: asyncio.Event) -> None:
    """Drive ``lane`` until ``stopping``, in whole cycles: EnqueueMessage, then a small run
    (StartRun, StartTurn, SettleAssistantMessage, EndRun). Each command has a request id
    ``{lane}-{cycle}-{step}``, and each text (``{lane}/{cycle}/queued``, ``.../prompt``,
    ``.../answer``) is unique, so a lane read back shows each acknowledged command once."""
    cycle = 0
    while not stopping.is_set():
        cycle += 1
        rid = f"{lane}-{cycle}"
        queued = f"{lane}/{cycle}/queued"
        await send(
            "EnqueueMessage",
            pb.EnqueueMessageRequest(
                lane_id=lane,
                kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                message=user(queued),
                request_id=f"{rid}-enqueue",
            ),
            queued,
        )
        prompt = f"{lane}/{cycle}/prompt"
        run = await send(
            "StartRun",
            pb.StartRunRequest(lane_id=lane, prompt=[user(prompt)], request_id=f"{rid}-run"),
            prompt,
        )
        turn = await send(
            "StartTurn",
            pb.StartTurnRequest(
                lane_id=lane, operation_id=run.operation_id, request_id=f"{rid}-turn"
            ),
            "",
        )
        answer = f"{lane}/{cycle}/answer"
        await send(
            "SettleAssistantMessage",
            pb.SettleAssistantMessageRequest(
                lane_id=lane,
                operation_id=run.operation_id,
                turn_id=turn.turn_id,
                message=assistant(text(answer), stop=messages_pb2.STOP_REASON_STOP),
                request_id=f"{rid}-settle",
            ),
            answer,
        )
        await send(
            "EndRun",
            pb.EndRunRequest(
                lane_id=lane,
                operation_id=run.operation_id,
                status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
                request_id=f"{rid}-end",
            ),
            "",
        )


async def _until(condition: Callable[[], bool], within: float) -> bool:
    give_up = time.monotonic() + within
    while not condition():
        if time.monotonic() > give_up:
            return False
        await asyncio.sleep(0.05)
    return True


def _check_acks(result: DrillResult) -> None:
    for lane, capture in result.captures.items():
        if capture is None:
            continue
        counts: dict[str, int] = {}
        for value, _ in transcript_texts(capture):
            counts[value] = counts.get(value, 0) + 1
        for ack in result.acks:
            if ack.lane != lane or not ack.marker:
                continue
            count = counts.get(ack.marker, 0)
            if count == 0:
                result.lost.append(f"{ack.method} {ack.request_id} (revision {ack.revision})")
            elif count > 1:
                result.doubled.append(f"{ack.method} {ack.request_id} ({count} times)")


async def run_drill(plan: DrillPlan, pair: StandbyPair | None = None) -> DrillResult:
    """Run the drill (see the module docstring) on ``pair``, or on a pair of its own."""
    result = DrillResult(plan)
    own = pair is None
    if pair is None:
        pair = await asyncio.to_thread(StandbyPair.create)
    try:
        result.postgres = await asyncio.to_thread(pair.version)
        with tempfile.TemporaryDirectory(prefix="lane-failover-drill-") as scratch:
            async with _service(plan, pair.url, Path(scratch) / "service.log") as service:
                try:
                    await _drill(plan, pair, service, result)
                finally:
                    result.service_log = service.log.read_text(errors="replace")
    finally:
        if own:
            await asyncio.to_thread(pair.destroy)
    return result


async def _drill(
    plan: DrillPlan, pair: StandbyPair, service: _Service, result: DrillResult
) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.port}")
    tasks: list[asyncio.Task[None]] = []
    try:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        drill = _Drill(plan, result, stub, health)
        token = uuid.uuid4().hex[:8]
        lanes = [f"failover-{token}-{n}" for n in range(plan.lanes)]
        for lane in lanes:
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane), timeout=30)
        tasks.append(asyncio.create_task(drill.sample_health(service.http_port)))
        tasks.extend(asyncio.create_task(drill.follow(lane)) for lane in lanes)
        drivers = [asyncio.create_task(drill.drive(lane)) for lane in lanes]
        tasks.extend(drivers)
        await asyncio.sleep(plan.warm_up)

        result.stop_began = time.monotonic()
        await asyncio.to_thread(pair.stop_primary, "immediate")
        result.stopped = time.monotonic()
        await asyncio.sleep(max(0.0, result.stop_began + plan.promote_after - time.monotonic()))
        result.promotion_began = time.monotonic()
        await asyncio.to_thread(pair.promote)
        result.writable = time.monotonic()
        result.standby_connections = await asyncio.to_thread(
            pair.standby_connections_before_promotion
        )

        def every_lane_back() -> bool:
            back = {a.lane for a in result.acks if a.time > result.writable}
            return len(back) == len(lanes)

        await _until(every_lane_back, plan.recover_within)
        await asyncio.sleep(plan.settle)
        drill.stopping.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(plan.attempt_deadline + 10):
                await asyncio.gather(*drivers)

        for lane in lanes:
            result.captures[lane] = await drill.read_back(lane)

        def watchers_caught_up() -> bool:
            return not result.watchers_match()

        await _until(watchers_caught_up, 15.0)
        _check_acks(result)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await channel.close()
