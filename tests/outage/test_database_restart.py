"""PostgreSQL restarts mid-workload (docs/contract.md, Targets: "PostgreSQL restart and killed
LISTEN connection: service recovers on its own, no watcher gap").

One scenario, run once for the module (:func:`scenario`), observed by the tests below:

* a **dedicated** PostgreSQL (pgserver in a temporary directory: the session's server is shared,
  this one gets stopped), see :mod:`tests.outage.restartable_postgres`;
* service **A** in this process (``start_server``; its hub polls only every 30 s, so a commit
  made elsewhere reaches A's watchers promptly only through NOTIFY and A's LISTEN connection)
  and service **B**, a separate ``python -m lane.server.app`` process on the same database;
* drivers committing continuously on lanes through A and through B: EnqueueMessage, then a
  small run (StartRun, StartTurn, SettleAssistantMessage, EndRun), every command with a
  request_id and retried with the same id after UNAVAILABLE; a reader taking snapshots; while
  PostgreSQL is down, a fresh snapshot request through each service every 0.5 s;
* a ``watch_lane`` watcher in this process on A for every lane;
* two outages: ``pg_ctl stop -m fast`` (PostgreSQL down 8 s) and ``-m immediate`` (a crash:
  down 5 s, crash recovery at start), each followed by a start on the same data directory and
  socket; neither service is restarted.

Afterwards every lane is read whole: its capture, its event log from revision 1, and what its
watcher folded. The tests assert: only OK or UNAVAILABLE ever answered, and within a bound
(nothing hangs); commands succeed again soon after PostgreSQL is back, with A's LISTEN
connection re-established; watchers never saw a gap and fold to the capture; every
acknowledged command's effect is in the capture exactly once and its revision in the log; a
commit through B after the outages reaches A's watcher through NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.errors import lane_error
from lane.client.reducer import fold
from lane.client.watch import RetryPolicy, watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import LANE_SERVICE_NAME, RunningServer, start_server
from lane.server.failover_drill import Ack, drive_cycles, transcript_texts
from lane.server.store.pool import DEFAULT_CHECKOUT_TIMEOUT_SECONDS
from tests.integration.lanes import events_between, user
from tests.outage.restartable_postgres import RestartablePostgres

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)
Code = grpc.StatusCode
REPO_ROOT = Path(__file__).resolve().parents[2]

A_LANES = 4  # lanes driven through service A (in this process)
B_LANES = 2  # lanes driven through service B (another process)
#: (pg_ctl stop mode, seconds PostgreSQL stays down)
OUTAGES = (("fast", 8.0), ("immediate", 5.0))
WARM_UP_SECONDS = 3.0
BETWEEN_OUTAGES_SECONDS = 3.0
AFTER_OUTAGES_SECONDS = 2.0
#: Pause between a driver's commands (keeps the transcripts small) and before a retry.
COMMAND_PAUSE = 0.05
RETRY_PAUSE = 0.1
#: gRPC deadline of one attempt: well above the pool's checkout timeout (both services keep the
#: default), so a command that waits for a connection shows up as a long attempt, not as
#: DEADLINE_EXCEEDED.
ATTEMPT_DEADLINE = DEFAULT_CHECKOUT_TIMEOUT_SECONDS + 35.0
#: A driver gives up on one command (a violation) after retrying this long.
GIVE_UP_SECONDS = 60.0
#: Every attempt, also while PostgreSQL is down, answers within this (nothing hangs).
ANSWER_WITHIN = 5.0
#: After PostgreSQL is back, every lane commits again within this.
RECOVER_WITHIN = 12.0
#: At the end, every watcher reaches the lane's head within this.
CATCH_UP_WITHIN = 15.0
#: A's hub polls this rarely (the configuration allows up to 60 s), so prompt delivery of a
#: commit made through B can only come through NOTIFY.
A_POLL_SECONDS = 30.0
#: A commit through B reaches A's watcher within this (NOTIFY, not the 30 s poll).
NOTIFY_WITHIN = 1.0
NOTIFY_PROBES = 3
#: The watchers resume quickly (the client's default backs off up to 10 s).
WATCH_RETRY = RetryPolicy(initial_backoff=0.05, max_backoff=0.5)


# -- what the scenario records ------------------------------------------------------------------


@dataclass
class Attempt:
    """One RPC attempt of a driver or reader."""

    lane: str
    via: str
    method: str
    request_id: str
    start: float
    end: float
    code: str
    reason: str = ""
    message: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def describe(self) -> str:
        return (
            f"{self.method} on {self.lane} via {self.via} (request {self.request_id}): "
            f"{self.code} {self.reason} after {self.seconds:.2f}s {self.message[:120]}"
        )


@dataclass
class Outage:
    mode: str
    down_seconds: float
    stop_begin: float = 0.0
    stop_done: float = 0.0
    start_begin: float = 0.0
    start_done: float = 0.0
    #: Per lane: seconds from PostgreSQL ready to the lane's first OK command (None: never).
    recovery: dict[str, float | None] = field(default_factory=dict)
    #: Seconds from PostgreSQL ready until A's LISTEN connection was up again (None: never).
    listen_recovery: float | None = None


@dataclass
class Follower:
    """What one watch_lane watcher (on service A) saw."""

    lane: str
    snapshot: snapshot_pb2.LaneSnapshot | None = None
    first_revision: int | None = None
    revisions: list[int] = field(default_factory=list)
    seen_at: dict[int, float] = field(default_factory=dict)
    resnapshots: int = 0
    error: str | None = None


@dataclass
class LaneEnd:
    """A lane as read at the end."""

    capture: snapshot_pb2.LaneSnapshot | None
    events: list[Any]
    problem: str = ""


@dataclass
class Observations:
    lanes_a: list[str] = field(default_factory=list)
    lanes_b: list[str] = field(default_factory=list)
    probe_lane: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    followers: dict[str, Follower] = field(default_factory=dict)
    ends: dict[str, LaneEnd] = field(default_factory=dict)
    #: Each lane's capture right after it was created (the base its event log folds onto).
    initial: dict[str, snapshot_pb2.LaneSnapshot] = field(default_factory=dict)
    #: Latency (s) of commits through B reaching A's watcher: before the outages, after them.
    notify_before: list[float | None] = field(default_factory=list)
    notify_after: list[float | None] = field(default_factory=list)
    driver_failures: list[str] = field(default_factory=list)
    b_alive_at_end: bool = False
    b_pid: int = 0
    a_listening_at_end: bool = False
    caught_up: dict[str, bool] = field(default_factory=dict)

    @property
    def all_lanes(self) -> list[str]:
        return [*self.lanes_a, *self.lanes_b, self.probe_lane]


class _GaveUp(Exception):
    pass


# -- actors -------------------------------------------------------------------------------------


async def _attempt(
    obs: Observations, stub: Stub, via: str, lane: str, method: str, request: Any, request_id: str
) -> tuple[Any, Attempt]:
    start = time.monotonic()
    try:
        answer = await getattr(stub, method)(request, timeout=ATTEMPT_DEADLINE)
    except grpc.aio.AioRpcError as error:
        info = lane_error(error)
        attempt = Attempt(
            lane,
            via,
            method,
            request_id,
            start,
            time.monotonic(),
            error.code().name,
            info.reason,
            info.message,
        )
        obs.attempts.append(attempt)
        return None, attempt
    attempt = Attempt(lane, via, method, request_id, start, time.monotonic(), "OK")
    obs.attempts.append(attempt)
    return answer, attempt


async def _command(
    obs: Observations,
    stub: Stub,
    via: str,
    lane: str,
    method: str,
    request: Any,
    marker: str = "",
) -> Any:
    """Send ``request`` until acknowledged, retrying the same request_id after UNAVAILABLE."""
    request_id: str = request.request_id
    give_up = time.monotonic() + GIVE_UP_SECONDS
    while True:
        answer, attempt = await _attempt(obs, stub, via, lane, method, request, request_id)
        if answer is not None:
            obs.acks.append(
                Ack(lane, method, request_id, answer.revision, marker, time.monotonic())
            )
            return answer
        if attempt.code != Code.UNAVAILABLE.name or time.monotonic() > give_up:
            obs.driver_failures.append(f"driver gave up: {attempt.describe()}")
            raise _GaveUp
        await asyncio.sleep(RETRY_PAUSE)


async def _drive(
    obs: Observations, stub: Stub, via: str, lane: str, stopping: asyncio.Event
) -> None:
    """Cycles of EnqueueMessage + a small run until ``stopping``; each cycle is finished."""

    async def send(method: str, request: Any, marker: str) -> Any:
        answer = await _command(obs, stub, via, lane, method, request, marker)
        await asyncio.sleep(COMMAND_PAUSE)
        return answer

    with contextlib.suppress(_GaveUp):
        await drive_cycles(lane, send, stopping)


async def _read(obs: Observations, stub: Stub, lanes: list[str], stopping: asyncio.Event) -> None:
    """Snapshots of the lanes in turn: reads are held to the same codes and bound."""
    index = 0
    while not stopping.is_set():
        lane = lanes[index % len(lanes)]
        index += 1
        await _attempt(
            obs, stub, "A", lane, "GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane), ""
        )
        await asyncio.sleep(COMMAND_PAUSE)


async def _follow(stub: Stub, follower: Follower) -> None:
    try:
        async for view in watch_lane(stub, follower.lane, retry=WATCH_RETRY, idle_timeout=20.0):
            now = time.monotonic()
            if follower.snapshot is None:
                follower.first_revision = view.snapshot.revision
            elif view.resnapshotted:
                follower.resnapshots += 1
            for event in view.events:
                follower.revisions.append(event.revision)
                follower.seen_at.setdefault(event.revision, now)
            follower.snapshot = view.snapshot
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the watch gave up or broke its contract: a finding
        follower.error = repr(exc)


async def _until(condition: Callable[[], bool], within: float, step: float = 0.02) -> float | None:
    """Seconds until ``condition()`` held (polled), or None if it did not within ``within``."""
    start = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - start
        if time.monotonic() - start > within:
            return None
        await asyncio.sleep(step)


async def _notify_probe(
    obs: Observations, stub_b: Stub, follower: Follower, label: str
) -> float | None:
    """One commit through B on the probe lane; seconds until A's watcher folded it."""
    request = pb.EnqueueMessageRequest(
        lane_id=obs.probe_lane,
        kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
        message=user(label),
        request_id=label,
    )
    answer = await _command(obs, stub_b, "B", obs.probe_lane, "EnqueueMessage", request, label)
    acked = time.monotonic()
    waited = await _until(lambda: answer.revision in follower.seen_at, within=5.0)
    if waited is None:
        return None
    return follower.seen_at[answer.revision] - acked


# -- service B, another process -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def _service_process(
    dsn: str, log_path: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    env = {
        **os.environ,
        "LANE_DATABASE_URL": dsn,
        "LANE_LISTEN": "127.0.0.1:0",
        "LANE_GRACE_SECONDS": "1",
    }
    process = await asyncio.to_thread(_spawn_service, env, log_path)
    try:
        port = await _listening_port(process, log_path)
        yield process, port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 15)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)


def _spawn_service(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lane.server.app"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def _listening_port(process: subprocess.Popen[bytes], log_path: Path) -> int:
    """The port service B logs at start-up (it listens on port 0: a free one)."""
    pattern = re.compile(rb"lane service listening on 127\.0\.0\.1:(\d+)")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = pattern.search(await asyncio.to_thread(log_path.read_bytes))
        if found:
            return int(found.group(1))
        if process.poll() is not None:
            break
        await asyncio.sleep(0.05)
    log = await asyncio.to_thread(log_path.read_text, errors="replace")
    raise RuntimeError(f"service B did not start:\n{log[-3000:]}")


async def _serving(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    answer = await health.Check(
        health_pb2.HealthCheckRequest(service=LANE_SERVICE_NAME), timeout=10
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


# -- the scenario -------------------------------------------------------------------------------


async def _outage(
    obs: Observations,
    pg: RestartablePostgres,
    running_a: RunningServer,
    stubs: dict[str, Stub],
    mode: str,
    down: float,
) -> None:
    outage = Outage(mode, down)
    obs.outages.append(outage)
    outage.stop_begin = time.monotonic()
    await asyncio.to_thread(pg.stop, mode)
    outage.stop_done = time.monotonic()
    # Fresh attempts while PostgreSQL is down, whatever the drivers are doing (they may all be
    # waiting on attempts started before): a snapshot through each service every 0.5 s, each
    # in a task of its own so that one that hangs does not hold back the next.
    probes: list[asyncio.Task[Any]] = []
    while time.monotonic() - outage.stop_done < down:
        for via, stub in stubs.items():
            lane = obs.lanes_a[0] if via == "A" else obs.lanes_b[0]
            request = pb.GetLaneSnapshotRequest(lane_id=lane)
            probes.append(
                asyncio.create_task(
                    _attempt(obs, stub, via, lane, "GetLaneSnapshot", request, "probe")
                )
            )
        await asyncio.sleep(0.5)
    outage.start_begin = time.monotonic()
    await asyncio.to_thread(pg.start)
    outage.start_done = ready = time.monotonic()
    driven = [*obs.lanes_a, *obs.lanes_b]

    def recovered(lane: str) -> bool:
        return any(
            a.lane == lane and a.code == "OK" and a.start >= ready for a in reversed(obs.attempts)
        )

    lanes_back, listen_back = await asyncio.gather(
        _until(lambda: all(recovered(lane) for lane in driven), RECOVER_WITHIN, step=0.05),
        _until(running_a.hub.listening.is_set, RECOVER_WITHIN),
    )
    del lanes_back  # each lane's own figure is below
    for lane in driven:
        first_ok = [
            a.end for a in obs.attempts if a.lane == lane and a.code == "OK" and a.start >= ready
        ]
        outage.recovery[lane] = min(first_ok) - ready if first_ok else None
    outage.listen_recovery = listen_back
    await asyncio.gather(*probes)


async def _read_lane_end(stub: Stub, lane: str) -> LaneEnd:
    for _ in range(50):
        try:
            response = await stub.GetLaneSnapshot(
                pb.GetLaneSnapshotRequest(lane_id=lane), timeout=10
            )
        except grpc.aio.AioRpcError as error:
            if error.code() != Code.UNAVAILABLE:
                return LaneEnd(None, [], f"GetLaneSnapshot: {error.code().name} {error.details()}")
            await asyncio.sleep(0.2)
            continue
        capture = response.snapshot
        try:
            events = await asyncio.wait_for(
                events_between(stub, lane, 0, capture.revision), timeout=20
            )
        except (grpc.aio.AioRpcError, TimeoutError) as error:
            return LaneEnd(capture, [], f"reading the event log failed: {error!r}")
        return LaneEnd(capture, events)
    return LaneEnd(None, [], "GetLaneSnapshot stayed UNAVAILABLE")


async def _run_scenario(tmp: Path) -> Observations:
    obs = Observations()
    pg = await asyncio.to_thread(RestartablePostgres.create, tmp / "pg")
    try:
        running_a = await start_server(
            Settings(database_url=pg.uri, poll_interval_seconds=A_POLL_SECONDS),
            listen="127.0.0.1:0",
        )
        try:
            async with _service_process(pg.uri, tmp / "service-b.log") as (process_b, port_b):
                obs.b_pid = process_b.pid
                await _with_services(obs, pg, running_a, port_b)
                obs.b_alive_at_end = process_b.poll() is None
        finally:
            await running_a.stop(grace=0.5)
    finally:
        await asyncio.to_thread(pg.destroy)
    return obs


async def _with_services(
    obs: Observations, pg: RestartablePostgres, running_a: RunningServer, port_b: int
) -> None:
    channel_a = grpc.aio.insecure_channel(f"127.0.0.1:{running_a.port}")
    channel_b = grpc.aio.insecure_channel(f"127.0.0.1:{port_b}")
    tasks: list[asyncio.Task[None]] = []
    try:
        await _serving(channel_b)
        stub_a: Stub = lane_service_pb2_grpc.LaneServiceStub(channel_a)
        stub_b: Stub = lane_service_pb2_grpc.LaneServiceStub(channel_b)
        obs.lanes_a = [f"outage-a{i}-{os.getpid()}" for i in range(A_LANES)]
        obs.lanes_b = [f"outage-b{i}-{os.getpid()}" for i in range(B_LANES)]
        obs.probe_lane = f"outage-probe-{os.getpid()}"
        for lane in obs.lanes_a:
            await stub_a.CreateLane(pb.CreateLaneRequest(lane_id=lane))
        for lane in [*obs.lanes_b, obs.probe_lane]:
            await stub_b.CreateLane(pb.CreateLaneRequest(lane_id=lane))
        for lane in obs.all_lanes:
            answer = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))
            obs.initial[lane] = answer.snapshot
        await _until(running_a.hub.listening.is_set, 10)

        for lane in obs.all_lanes:
            obs.followers[lane] = Follower(lane)
            tasks.append(asyncio.create_task(_follow(stub_a, obs.followers[lane])))
        probe = obs.followers[obs.probe_lane]
        await _until(lambda: all(f.snapshot is not None for f in obs.followers.values()), 10)
        for index in range(NOTIFY_PROBES):
            obs.notify_before.append(await _notify_probe(obs, stub_b, probe, f"before-{index}"))

        stopping = asyncio.Event()
        drivers = [
            *(
                asyncio.create_task(_drive(obs, stub_a, "A", lane, stopping))
                for lane in obs.lanes_a
            ),
            *(
                asyncio.create_task(_drive(obs, stub_b, "B", lane, stopping))
                for lane in obs.lanes_b
            ),
            asyncio.create_task(_read(obs, stub_a, obs.lanes_a, stopping)),
        ]
        tasks.extend(drivers)
        await asyncio.sleep(WARM_UP_SECONDS)
        for index, (mode, down) in enumerate(OUTAGES):
            if index:
                await asyncio.sleep(BETWEEN_OUTAGES_SECONDS)
            await _outage(obs, pg, running_a, {"A": stub_a, "B": stub_b}, mode, down)
        await asyncio.sleep(AFTER_OUTAGES_SECONDS)
        stopping.set()
        await asyncio.wait_for(asyncio.gather(*drivers), timeout=GIVE_UP_SECONDS + 30)

        obs.a_listening_at_end = running_a.hub.listening.is_set()
        for index in range(NOTIFY_PROBES):
            obs.notify_after.append(await _notify_probe(obs, stub_b, probe, f"after-{index}"))

        for lane in obs.all_lanes:
            obs.ends[lane] = end = await _read_lane_end(stub_a, lane)
            follower = obs.followers[lane]
            head = end.capture.revision if end.capture is not None else -1

            def reached(follower: Follower = follower, head: int = head) -> bool:
                return follower.snapshot is not None and follower.snapshot.revision >= head

            obs.caught_up[lane] = await _until(reached, CATCH_UP_WITHIN) is not None
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await channel_a.close()
        await channel_b.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def scenario(tmp_path_factory: pytest.TempPathFactory) -> Observations:
    started = time.monotonic()
    obs = await _run_scenario(tmp_path_factory.mktemp("outage"))
    print(_summary(obs, time.monotonic() - started))
    return obs


def _summary(obs: Observations, seconds: float) -> str:
    codes: dict[str, int] = {}
    for attempt in obs.attempts:
        codes[attempt.code] = codes.get(attempt.code, 0) + 1
    lines = [
        f"\noutage scenario: {seconds:.1f}s, {len(obs.attempts)} attempts {codes}, "
        f"{len(obs.acks)} acknowledged",
        f"  longest attempt: {max((a.seconds for a in obs.attempts), default=0):.2f}s",
        f"  NOTIFY latency before {obs.notify_before} after {obs.notify_after}",
    ]
    for outage in obs.outages:
        recovery = [v for v in outage.recovery.values() if v is not None]
        lines.append(
            f"  outage {outage.mode}: down {outage.start_begin - outage.stop_done:.1f}s, "
            f"lanes committing again after {max(recovery, default=float('nan')):.2f}s "
            f"(missing: {[k for k, v in outage.recovery.items() if v is None]}), "
            f"LISTEN back after {outage.listen_recovery}"
        )
    return "\n".join(lines)


def _started_while_down(obs: Observations, attempt: Attempt) -> Outage | None:
    for outage in obs.outages:
        if outage.stop_begin <= attempt.start < outage.start_done:
            return outage
    return None


# -- the properties -----------------------------------------------------------------------------


async def test_only_ok_or_unavailable_is_ever_answered(scenario: Observations) -> None:
    wrong = [a.describe() for a in scenario.attempts if a.code not in ("OK", "UNAVAILABLE")]
    assert not wrong, f"{len(wrong)} answers other than OK/UNAVAILABLE:\n" + "\n".join(wrong[:20])
    unavailable = [a for a in scenario.attempts if a.code == "UNAVAILABLE"]
    assert all(a.reason == "UNAVAILABLE" for a in unavailable), [
        a.describe() for a in unavailable if a.reason != "UNAVAILABLE"
    ][:10]
    assert not scenario.driver_failures, scenario.driver_failures


async def test_commands_fail_with_unavailable_while_postgres_is_down(
    scenario: Observations,
) -> None:
    # docs/errors.md (UNAVAILABLE): restarting PostgreSQL mid-workload makes commands fail
    # with UNAVAILABLE while it is down. Commands are refused while it is down, not held until
    # it is back: an attempt that starts while it is down, at least ANSWER_WITHIN before it
    # comes back, must be answered UNAVAILABLE before it comes back. (Later ones may see it
    # back and succeed.)
    problems = []
    for outage in scenario.outages:
        during = [a for a in scenario.attempts if outage.stop_done <= a.start < outage.start_begin]
        assert during, f"no attempt started while PostgreSQL was down ({outage.mode})"
        refused = [a for a in during if a.code == "UNAVAILABLE" and a.end < outage.start_begin]
        early = [a for a in during if a.start < outage.start_begin - ANSWER_WITHIN]
        held = [a for a in early if a not in refused]
        if not refused or held:
            longest = max(during, key=lambda a: a.seconds)
            problems.append(
                f"{outage.mode} stop, down {outage.start_begin - outage.stop_done:.1f}s: "
                f"{len(refused)} of {len(during)} attempts started while down were refused "
                f"while down; {len(held)} started {ANSWER_WITHIN}s or more before the restart "
                f"were not ({sum(a.code == 'OK' for a in held)} answered OK only after it); "
                f"longest: {longest.describe()}, answered "
                f"{longest.end - outage.start_done:+.2f}s after PostgreSQL was back"
            )
    assert not problems, "\n".join(problems)


async def test_no_command_hangs_while_postgres_is_down(scenario: Observations) -> None:
    # A command while the database is down must be refused promptly (UNAVAILABLE: the client
    # retries or goes elsewhere), not held until the database comes back.
    slow = [a for a in scenario.attempts if a.seconds > ANSWER_WITHIN]
    details = []
    for attempt in slow:
        outage = _started_while_down(scenario, attempt)
        when = (
            f"started {attempt.start - outage.stop_done:+.2f}s after the {outage.mode} stop, "
            f"answered {attempt.end - outage.start_done:+.2f}s after PostgreSQL was back"
            if outage is not None
            else "outside an outage"
        )
        details.append(f"{attempt.describe()} [{when}]")
    assert not slow, f"{len(slow)} attempts took longer than {ANSWER_WITHIN}s:\n" + "\n".join(
        details[:20]
    )


async def test_service_recovers_without_a_restart(scenario: Observations) -> None:
    assert scenario.b_alive_at_end, "service B exited"
    assert scenario.a_listening_at_end, "service A's LISTEN connection is not up at the end"
    for outage in scenario.outages:
        missing = [lane for lane, seconds in outage.recovery.items() if seconds is None]
        assert not missing, (
            f"after the {outage.mode} restart, no commit within {RECOVER_WITHIN}s: {missing}"
        )
        assert outage.listen_recovery is not None, (
            f"A's LISTEN connection not back within {RECOVER_WITHIN}s of the {outage.mode} restart"
        )


async def test_watchers_resume_without_a_gap(scenario: Observations) -> None:
    for lane in scenario.all_lanes:
        follower = scenario.followers[lane]
        end = scenario.ends[lane]
        assert follower.error is None, f"{lane}: the watcher failed: {follower.error}"
        assert follower.resnapshots == 0, f"{lane}: the watcher had to re-snapshot"
        assert follower.first_revision is not None and end.capture is not None, lane
        assert scenario.caught_up[lane], (
            f"{lane}: the watcher did not reach the head {end.capture.revision} within "
            f"{CATCH_UP_WITHIN}s (it is at "
            f"{follower.snapshot.revision if follower.snapshot else None})"
        )
        expected = list(range(follower.first_revision + 1, end.capture.revision + 1))
        assert follower.revisions == expected, f"{lane}: watched revisions have a gap or repeat"
        assert follower.snapshot == end.capture, f"{lane}: the watcher's fold != capture"


async def test_nothing_acknowledged_is_lost(scenario: Observations) -> None:
    for lane in scenario.all_lanes:
        end = scenario.ends[lane]
        assert not end.problem, f"{lane}: {end.problem}"
        assert end.capture is not None
        revisions = [event.revision for event in end.events]
        assert revisions == list(range(1, end.capture.revision + 1)), (
            f"{lane}: the event log is not 1..{end.capture.revision}"
        )
        initial = scenario.initial[lane]
        later = end.events[initial.revision :]
        assert fold(initial, later).snapshot == end.capture, f"{lane}: fold(event log) != capture"
        acks = [ack for ack in scenario.acks if ack.lane == lane]
        assert acks, f"{lane}: nothing was acknowledged"
        beyond = [a for a in acks if a.revision > end.capture.revision or a.revision < 1]
        assert not beyond, f"{lane}: acknowledged revisions missing from the log: {beyond[:5]}"
        placed = transcript_texts(end.capture)
        for ack in acks:
            if ack.marker:
                count = len([text for text, _ in placed if text == ack.marker])
                assert count == 1, (
                    f"{lane}: {ack.method} {ack.request_id} acknowledged at revision "
                    f"{ack.revision}, but its text {ack.marker!r} is there {count} times"
                )
            if ack.method in ("StartRun", "SettleAssistantMessage"):
                # Placed by the acknowledged commit itself: at or below its revision.
                seq = next(seq for text, seq in placed if text == ack.marker)
                assert 0 < seq <= ack.revision, (
                    f"{lane}: {ack.method} acknowledged at revision {ack.revision}, its entry "
                    f"was placed at {seq}"
                )
        # Every command retried under one request id committed once: one run per cycle.
        runs = {a.request_id for a in acks if a.method == "StartRun"}
        run_starts = [e for e in end.events if e.WhichOneof("kind") == "run_start"]
        assert len(run_starts) == len(runs), f"{lane}: {len(run_starts)} runs for {len(runs)} acks"
    outage_acks = [
        ack
        for ack in scenario.acks
        if any(o.stop_begin - 2.0 <= ack.time <= o.stop_begin for o in scenario.outages)
    ]
    assert outage_acks, "no command was acknowledged just before an outage"


async def test_commit_through_another_process_reaches_a_watcher(scenario: Observations) -> None:
    # A's hub polls only every 30 s: prompt delivery of B's commits is A's LISTEN connection.
    def prompt(latencies: list[float | None]) -> bool:
        return all(latency is not None and latency <= NOTIFY_WITHIN for latency in latencies)

    before, after = scenario.notify_before, scenario.notify_after
    assert prompt(before), f"control: before the outages, B's commits reached A after {before}s"
    assert prompt(after), f"after the outages, B's commits reached A's watcher after {after}s"
    for lane in scenario.lanes_b:
        assert scenario.followers[lane].error is None
        assert scenario.caught_up[lane], f"{lane}: committed through B, A's watcher lags"
