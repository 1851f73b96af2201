"""``lane serve --workers N``: a supervisor and N real server processes on one local port, on a
real PostgreSQL.

Which worker served what is read from each worker's own Prometheus endpoint
(``LANE_METRICS_LISTEN=127.0.0.1:0``: every worker picks a free port and logs it, tagged with
its pid). Connections are spread by the kernel (``SO_REUSEPORT``), so the tests open channels
until both workers have been reached instead of assuming how many that takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, snapshot_pb2
from prometheus_client.parser import text_string_to_metric_families

from lane.server.app.config import ConfigError, Settings
from lane.server.app.server import LANE_SERVICE_NAME
from lane.server.app.supervisor import describe_exit, worker_metrics_listen
from tests.integration.lanes import user
from tests.integration.test_watch_stream import Watcher, new_lane, snapshot_of
from tests.support.servers import stop_process

# Every channel its own TCP connection (gRPC otherwise shares one between identical channels),
# so the kernel chooses a worker per channel; reconnect quickly after a worker died.
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
]
# Enough that the kernel leaves every one of two workers without a connection only with
# probability 2 * 2^-64: a test that needs both reached would fail for no reason never.
MAX_CHANNELS = 64

_SUPERVISOR = re.compile(rb"lane supervisor \(pid (\d+)\) starting (\d+) workers on ([\d.]+):(\d+)")
_LISTENING = re.compile(rb"\[worker (\d+) pid (\d+)\]: lane service listening on ")
_METRICS = re.compile(rb"\[worker \d+ pid (\d+)\]: Prometheus metrics on http://([\d.:]+)/metrics")


# --- settings --------------------------------------------------------------------------------


def test_workers_default_to_the_number_of_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert Settings.from_env({}).workers == 7
    assert Settings.from_env({"LANE_WORKERS": " 3 "}).workers == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "undeterminable"
    assert Settings.from_env({}).workers == 1


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_worker_count_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^LANE_WORKERS=") as caught:
        Settings.from_env({"LANE_WORKERS": value})
    assert caught.value.variable == "LANE_WORKERS"


def test_each_worker_gets_its_own_metrics_port() -> None:
    assert worker_metrics_listen(None, 2) is None
    assert worker_metrics_listen("127.0.0.1:9464", 1) == "127.0.0.1:9464"
    assert worker_metrics_listen("[::1]:9464", 3) == "[::1]:9466"
    assert worker_metrics_listen("127.0.0.1:0", 3) == "127.0.0.1:0"
    env = {"LANE_WORKERS": "3", "LANE_METRICS_LISTEN": "127.0.0.1:65534"}
    with pytest.raises(ConfigError, match=r"^LANE_METRICS_LISTEN="):
        Settings.from_env(env)
    assert Settings.from_env(env | {"LANE_WORKERS": "2"}).workers == 2


def test_exit_descriptions() -> None:
    assert describe_exit(1) == "exit status 1"
    assert describe_exit(-9) == "killed by SIGKILL"


# --- the processes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["lane.server.app"], ["lane.client", "serve"]], ids=["env", "lane-serve"]
)
@pytest.mark.parametrize(("variable", "value"), [("LANE_WORKERS", "0"), ("LANE_WORKERS", "x")])
async def test_a_bad_worker_count_stops_start_up_with_status_2(
    command: list[str], variable: str, value: str, tmp_path: Path
) -> None:
    env = {"LANE_DATA_DIR": str(tmp_path / "data"), variable: value}
    async with _Service.start(tmp_path, env, command=command) as service:
        status = await asyncio.wait_for(service.process.wait(), timeout=30)
    assert status == 2, service.output()
    assert f"configuration error: {variable}=" in service.output()
    assert not (tmp_path / "data").exists()


async def test_a_bad_workers_option_stops_lane_serve_with_status_2(tmp_path: Path) -> None:
    command = ["lane.client", "serve", "--workers", "0"]
    env = {"LANE_DATA_DIR": str(tmp_path / "data")}
    async with _Service.start(tmp_path, env, command=command) as service:
        status = await asyncio.wait_for(service.process.wait(), timeout=30)
    assert status == 2, service.output()
    assert "configuration error: --workers '0': the number must be >= 1" in service.output()


@pytest.mark.parametrize("notify", ["on", "off"])
async def test_commands_and_watchers_spread_over_workers_and_fold_equals_capture(
    fresh_database_url: str, tmp_path: Path, notify: str
) -> None:
    # NOTIFY on: polling slowed to a minute, so only doorbells can carry commits between
    # workers in time. Off: polling alone.
    poll = "60" if notify == "on" else "0.2"
    env = _env(fresh_database_url, LANE_NOTIFY=notify, LANE_POLL_INTERVAL_SECONDS=poll)
    async with _Service.start(tmp_path, env) as service, _Channels(service) as channels:
        workers = await service.serving(2)
        lane_id = await new_lane(channels.stub(0))
        watchers: list[Watcher] = []
        try:
            # A watcher per channel, until both workers serve some (and at least four).
            while len(watchers) < 4 or not all(
                _metric(port, "lane_watchers_active") >= 1 for port in workers.values()
            ):
                assert len(watchers) < MAX_CHANNELS, "every watcher landed on one worker"
                watchers.append(Watcher(channels.stub(len(watchers)), lane_id))
                await watchers[-1].reach(1)
            # Commands through every channel: both workers commit, every watcher sees all.
            head = 0
            for round_ in range(3):
                for i in range(len(watchers)):
                    answer = await channels.stub(i).EnqueueMessage(
                        pb.EnqueueMessageRequest(
                            lane_id=lane_id,
                            kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                            message=user(f"r{round_}-c{i}"),
                        )
                    )
                    head = max(head, answer.revision)
            served = {pid: _metric(port, "lane_commands_total") for pid, port in workers.items()}
            assert all(count >= 1 for count in served.values()), served
            assert head == 1 + 3 * len(watchers), "one event per command"
            for i, watcher in enumerate(watchers):
                await watcher.reach(head)
                # A capture through the watcher's own channel: the same worker, or the other.
                fresh = await snapshot_of(channels.stub(i), lane_id)
                assert fresh.revision == head, f"capture through channel {i} is stale"
                assert watcher.snapshot == fresh, f"fold != capture on channel {i}"
        finally:
            for watcher in watchers:
                await watcher.close()


async def test_group_commits_on_two_workers_keep_every_watcher_folding_to_the_capture(
    fresh_database_url: str, tmp_path: Path
) -> None:
    # Polling slowed to a minute: the other worker's watchers learn of a group's commits from
    # its doorbells only.
    env = _env(fresh_database_url, LANE_POLL_INTERVAL_SECONDS="60")
    async with _Service.start(tmp_path, env) as service, _Channels(service) as channels:
        workers = await service.serving(2)
        # Channels until both workers serve some; each channel commands three lanes of its own,
        # so each worker has several lanes' commands ready at once.
        owned: list[list[str]] = []
        while len(owned) < 2 or not all(
            _metric(port, "lane_commands_total") >= 1 for port in workers.values()
        ):
            assert len(owned) < MAX_CHANNELS, "every channel landed on one worker"
            stub = channels.stub(len(owned))
            owned.append([await new_lane(stub) for _ in range(3)])
        lanes = [lane for mine in owned for lane in mine]
        # Every lane watched through every channel: from memory on the worker committing it,
        # through doorbells on the other.
        watchers = [
            (i, lane, Watcher(channels.stub(i), lane)) for i in range(len(owned)) for lane in lanes
        ]
        try:
            for _, _, watcher in watchers:
                await watcher.reach(1)
            rounds = 5
            for round_ in range(rounds):
                await asyncio.gather(
                    *(
                        channels.stub(i).EnqueueMessage(
                            pb.EnqueueMessageRequest(
                                lane_id=lane,
                                kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                                message=user(f"{lane} r{round_}"),
                            )
                        )
                        for i, mine in enumerate(owned)
                        for lane in mine
                    )
                )
            optimistic = sum(
                _metric(port, "lane_store_commits_total", path="optimistic")
                for port in workers.values()
            )
            grouped = sum(
                _metric(port, "lane_store_group_commits_total") for port in workers.values()
            )
            # Some transactions carried several lanes' commands.
            assert 0 < grouped < optimistic, f"{optimistic} optimistic commits in {grouped}"
            for i, lane, watcher in watchers:
                await watcher.reach(1 + rounds)
                # A capture through the watcher's own channel: its worker, committing the lane
                # or not.
                fresh = await snapshot_of(channels.stub(i), lane)
                assert fresh.revision == 1 + rounds
                assert watcher.snapshot == fresh, f"fold != capture of {lane} on channel {i}"
        finally:
            for _, _, watcher in watchers:
                await watcher.close()


async def test_every_worker_serves_the_http_port_too(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = _env(fresh_database_url, LANE_HTTP_LISTEN="127.0.0.1:0")
    async with _Service.start(tmp_path, env) as service:
        workers = await service.serving(2)
        found = re.search(
            rb"workers serve Connect and gRPC-Web on ([\d.]+:\d+)", service.log.read_bytes()
        )
        assert found is not None, service.output()
        url = f"http://{found.group(1).decode()}/lane.v1.LaneService/ListLanes"
        # One connection per request (urllib): the kernel picks a worker for each, and every
        # worker answers on the one port, until both have answered one.
        for _ in range(MAX_CHANNELS):
            assert await asyncio.to_thread(_post_json, url) == 200
            if all(_metric(port, "lane_commands_total") >= 1 for port in workers.values()):
                break
        else:
            raise AssertionError("every request reached one worker")


async def test_kill_9_of_a_worker_loses_nothing_acknowledged_and_it_is_replaced(
    fresh_database_url: str, tmp_path: Path
) -> None:
    async with (
        _Service.start(tmp_path, _env(fresh_database_url)) as service,
        _Channels(service) as channels,
    ):
        workers = await service.serving(2)
        lane_id = await new_lane(channels.stub(0))
        acked: set[str] = set()
        writing = asyncio.Event()
        writing.set()

        async def write(i: int) -> None:
            n = 0
            while writing.is_set():
                n += 1
                request = pb.EnqueueMessageRequest(
                    lane_id=lane_id,
                    kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                    message=user(f"c{i}-{n}"),
                )
                try:
                    answer = await channels.stub(i).EnqueueMessage(request, timeout=5)
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.05)  # its worker died: the channel reconnects
                    continue
                acked.add(answer.entry_id)

        victim, survivor = sorted(workers)
        writers: list[asyncio.Task[None]] = []
        try:
            # Writers on more and more channels until the victim has answered commands.
            while _metric(workers[victim], "lane_commands_total") < 5:
                assert len(writers) < MAX_CHANNELS, "no channel reached the victim"
                writers.append(asyncio.create_task(write(len(writers))))
                await asyncio.sleep(0.05)
            os.kill(victim, signal.SIGKILL)
            acked_before_kill = set(acked)

            # The supervisor replaces the victim, and the replacement serves commands too.
            replacement = await service.replacement_of(victim)
            assert replacement not in (victim, survivor)
            new_workers = await service.serving(2)
            assert set(new_workers) == {survivor, replacement}
            while _metric(new_workers[replacement], "lane_commands_total") < 1:
                assert len(writers) < MAX_CHANNELS, "no channel reached the replacement"
                writers.append(asyncio.create_task(write(len(writers))))
                await asyncio.sleep(0.05)
        finally:
            writing.clear()
            await asyncio.gather(*writers)

        snapshot = await snapshot_of(channels.stub(0), lane_id)
        stored = {item.entry_id for item in snapshot.queues}
        assert acked_before_kill, "nothing was acknowledged before the kill"
        assert acked <= stored, f"{len(acked - stored)} acknowledged commands lost"
        log = service.output()
        assert re.search(
            rf"WARNING lane\.server\.app\.supervisor: worker \d \(pid {victim}\) died "
            r"unexpectedly \(killed by SIGKILL\); starting a replacement",
            log,
        ), log


async def test_sigterm_drains_every_worker_and_exits_0(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = _env(fresh_database_url, LANE_GRACE_SECONDS="2")
    command = ["lane.client", "serve", "--workers", "2"]
    async with (
        _Service.start(tmp_path, env, command=command) as service,
        _Channels(service) as channels,
    ):
        workers = await service.serving(2)
        assert "starting 2 workers on 127.0.0.1:" in service.output()
        lane_id = await new_lane(channels.stub(0))
        watcher = Watcher(channels.stub(1), lane_id)
        await watcher.reach(1)

        service.process.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(service.process.wait(), timeout=30)
        # The watch stream was ended for its client to resume elsewhere, not cut.
        await asyncio.wait_for(watcher.task, timeout=10)
        assert watcher.error is not None
        assert watcher.error.code() == grpc.StatusCode.UNAVAILABLE

    log = service.output()
    assert status == 0, log
    assert "received SIGTERM: stopping 2 workers" in log
    for pid in workers:
        assert re.search(rf"pid {pid}\]: lane service on 127\.0\.0\.1:\d+ stopped", log), log
        assert not _alive(pid)
    assert "died unexpectedly" not in log
    assert "lane supervisor stopped" in log
    assert _port_is_closed(service.port)


async def test_workers_that_keep_failing_to_start_make_it_give_up_with_status_1(
    fresh_database_url: str, tmp_path: Path
) -> None:
    with _taken_ports(2) as first:  # worker k's metrics port is first + k - 1: both taken
        env = _env(fresh_database_url, LANE_METRICS_LISTEN=f"127.0.0.1:{first}")
        async with _Service.start(tmp_path, env) as service:
            status = await asyncio.wait_for(service.process.wait(), timeout=60)
    log = service.output()
    assert status == 1, log
    assert "cannot serve metrics on" in log
    assert re.search(
        r"WARNING lane\.server\.app\.supervisor: worker \d \(pid \d+\) failed to start", log
    )
    assert "start-up failures in a row, giving up" in log


async def test_the_supervisor_alone_runs_the_embedded_postgres(tmp_path: Path) -> None:
    cluster = tmp_path / "data" / "postgres"
    env = {"LANE_WORKERS": "2", "LANE_DATA_DIR": str(tmp_path / "data")}
    env |= {"LANE_LISTEN": "127.0.0.1:0", "LANE_METRICS_LISTEN": "127.0.0.1:0"}
    try:
        async with _Service.start(tmp_path, env) as service:
            await service.serving(2, within=90)  # includes initdb
            service.process.send_signal(signal.SIGTERM)
            status = await asyncio.wait_for(service.process.wait(), timeout=30)
        log = service.output()
        assert status == 0, log
        assert log.count("embedded PostgreSQL running at") == 1
        assert f"database: embedded PostgreSQL at {cluster}; migrations applied now: 0001_" in log
        assert log.count("embedded PostgreSQL at") >= 2  # started, then released
        # Stopped after the workers, data kept.
        assert not (cluster / "postmaster.pid").exists()
        assert (cluster / "PG_VERSION").exists()
    finally:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((cluster / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, signal.SIGINT)  # a failed test left it running


# --- helpers ---------------------------------------------------------------------------------


def _env(database_url: str, **extra: str) -> dict[str, str]:
    return {
        "LANE_WORKERS": "2",
        "LANE_DATABASE_URL": database_url,
        "LANE_LISTEN": "127.0.0.1:0",
        "LANE_METRICS_LISTEN": "127.0.0.1:0",
        "LANE_GRACE_SECONDS": "1",
    } | extra


@dataclass
class _Service:
    """A supervisor process (``python -m lane.server.app`` or ``lane serve``) and its log."""

    process: asyncio.subprocess.Process
    log: Path

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, cwd: Path, env: dict[str, str], *, command: list[str] | None = None
    ) -> AsyncIterator[_Service]:
        # The developer's own LANE_* settings must not leak into the child.
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("LANE_")} | env
        log = cwd / "service.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                *(command or ["lane.server.app"]),
                env=child_env,
                cwd=cwd,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        service = cls(process, log)
        try:
            yield service
        except BaseException:
            print(f"--- {log.name}:\n{service.output()}")  # pytest shows it for a failure
            raise
        finally:
            # A SIGKILLed supervisor's workers die with it (PR_SET_PDEATHSIG).
            await stop_process(process, grace=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def port(self) -> int:
        found = _SUPERVISOR.search(self.log.read_bytes())
        assert found is not None, self.output()
        return int(found.group(4))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def serving(self, count: int, within: float = 30.0) -> dict[int, int]:
        """Wait until ``count`` live workers serve LaneService; return {pid: metrics port}."""
        async with asyncio.timeout(within):
            while True:
                self._check_running()
                workers = self._live_workers()
                if len(workers) == count and await self._healthy():
                    return workers
                await asyncio.sleep(0.05)

    async def replacement_of(self, pid: int, within: float = 30.0) -> int:
        """Wait for the worker started in place of ``pid`` to serve; return its pid."""
        async with asyncio.timeout(within):
            while True:
                self._check_running()
                text = self.log.read_bytes()
                number = {int(p): int(n) for n, p in _LISTENING.findall(text)}.get(pid)
                later = [
                    int(p)
                    for n, p in _LISTENING.findall(text)
                    if int(n) == number and int(p) != pid and _alive(int(p))
                ]
                if later:
                    return later[-1]
                await asyncio.sleep(0.05)

    def _live_workers(self) -> dict[int, int]:
        text = self.log.read_bytes()
        listening = {int(pid) for _, pid in _LISTENING.findall(text)}
        return {
            int(pid): int(address.rpartition(b":")[2])
            for pid, address in _METRICS.findall(text)
            if int(pid) in listening and _alive(int(pid))
        }

    async def _healthy(self) -> bool:
        request = health_pb2.HealthCheckRequest(service=LANE_SERVICE_NAME)
        async with grpc.aio.insecure_channel(self.target) as channel:
            try:
                answer = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
            except grpc.aio.AioRpcError:
                return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    def _check_running(self) -> None:
        if self.process.returncode is not None:
            pytest.fail(f"the supervisor exited with {self.process.returncode}:\n{self.output()}")


class _Channels:
    """Channels to the service's port, each its own connection, opened on first use (once
    the supervisor logged the port)."""

    def __init__(self, service: _Service) -> None:
        self.service = service
        self._channels: list[grpc.aio.Channel] = []

    def stub(self, i: int) -> lane_service_pb2_grpc.LaneServiceAsyncStub:
        while len(self._channels) <= i:
            channel = grpc.aio.insecure_channel(self.service.target, options=CHANNEL_OPTIONS)
            self._channels.append(channel)
        return lane_service_pb2_grpc.LaneServiceStub(self._channels[i])

    async def __aenter__(self) -> _Channels:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for channel in self._channels:
            await channel.close()


def _post_json(url: str) -> int:
    """POST ``{}`` as JSON to ``url`` on a connection of its own; the HTTP status."""
    request = urllib.request.Request(url, data=b"{}", headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def _metric(port: int, name: str, **labels: str) -> float:
    """The sum of metric ``name`` over its labels (those with ``labels``' values), scraped from a
    worker's endpoint (blocking: a local request of a few KiB)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by the supervisor) counts as gone.
    with contextlib.suppress(OSError):
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3]
    return True


def _port_is_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@contextlib.contextmanager
def _taken_ports(count: int) -> Iterator[int]:
    """``count`` consecutive local ports, each held by a listening socket; yields the first."""
    for _ in range(100):
        with contextlib.ExitStack() as held:
            first = _free_port()
            try:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
                    sock.listen()
            except OSError:
                continue
            yield first
            return
    pytest.fail(f"found no {count} consecutive free ports")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
