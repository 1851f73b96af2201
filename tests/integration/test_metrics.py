"""The Prometheus endpoint and structured logs, against a real server.

Metrics are process-wide and the tests start several servers in one process, so every check
compares a scrape before with a scrape after (deltas), never absolute values.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
import pytest_asyncio
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from lane.server import logs
from lane.server.app.config import ConfigError, Settings
from lane.server.app.server import RunningServer, StartupError, start_server
from lane.server.store import DEFAULT_NAMESPACE
from tests.integration.lanes import new_lane_id, user
from tests.integration.servers import extra_server

Labels = tuple[tuple[str, str], ...]
Figures = dict[tuple[str, Labels], float]


def _fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


async def scrape(port: int) -> Figures:
    """Every sample the endpoint serves, by (name, sorted labels)."""
    text = await asyncio.to_thread(_fetch, port)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(figures: Figures, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist yet."""
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


class Metrics:
    """Scrapes one server's endpoint and reports what moved since :meth:`mark`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.before: Figures = {}

    async def mark(self) -> None:
        self.before = await scrape(self.port)

    async def delta(self, name: str, **labels: str) -> float:
        return value(await scrape(self.port), name, **labels) - value(self.before, name, **labels)

    async def until(self, name: str, expected: Callable[[float], bool], **labels: str) -> float:
        """Scrape until the delta of ``name`` satisfies ``expected`` (some figures move just
        after the client sees the answer); return it."""
        async with asyncio.timeout(10):
            while True:
                moved = await self.delta(name, **labels)
                if expected(moved):
                    return moved
                await asyncio.sleep(0.05)


@pytest_asyncio.fixture(loop_scope="session")
async def metered(fresh_database_url: str) -> AsyncIterator[tuple[RunningServer, Metrics]]:
    """A server of its own database with its metrics endpoint on a free port."""
    settings = Settings(database_url=fresh_database_url, metrics_listen="127.0.0.1:0")
    running = await start_server(settings, listen="127.0.0.1:0")
    try:
        assert running.metrics_port is not None
        assert running.metrics_port > 0
        yield running, Metrics(running.metrics_port)
    finally:
        await running.stop(grace=1.0)


@pytest_asyncio.fixture(loop_scope="session")
async def metered_stub(
    metered: tuple[RunningServer, Metrics],
) -> AsyncIterator[lane_service_pb2_grpc.LaneServiceAsyncStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{metered[0].port}") as channel:
        yield lane_service_pb2_grpc.LaneServiceStub(channel)


async def test_commands_events_and_latency_move_by_what_was_done(metered, metered_stub) -> None:
    _, metrics = metered
    stub = metered_stub
    lane_id = new_lane_id("metrics")
    await metrics.mark()

    created = await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    run = await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.StartRun(pb.StartRunRequest(lane_id=new_lane_id("missing")))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=""))
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    commands = "lane_commands_total"
    assert await metrics.delta(commands, method="CreateLane", code="OK") == 1
    assert await metrics.delta(commands, method="CreateLane", code="INVALID_ARGUMENT") == 1
    assert await metrics.delta(commands, method="StartRun", code="OK") == 1
    assert await metrics.delta(commands, method="StartRun", code="NOT_FOUND") == 1
    duration = "lane_command_duration_seconds"
    assert await metrics.delta(f"{duration}_count", method="CreateLane") == 2
    assert await metrics.delta(f"{duration}_count", method="StartRun") == 2
    assert await metrics.delta(f"{duration}_sum", method="StartRun") > 0
    assert await metrics.delta(f"{duration}_bucket", method="StartRun", le="+Inf") == 2
    # Every event of both commits, and no more: refusals append nothing. (Other servers of
    # this process may reconcile orphaned runs meanwhile, so "at least".)
    appended = await metrics.delta("lane_events_appended_total")
    assert appended >= run.revision
    assert created.revision == 1


async def test_watchers_are_counted_with_why_they_ended(
    metered, metered_stub, session_database_url
) -> None:
    _, metrics = metered
    stub = metered_stub
    lane_id = new_lane_id("metrics")
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    await metrics.mark()

    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
    responses = aiter(call)
    assert (await anext(responses)).WhichOneof("item") == "snapshot"
    assert await metrics.until("lane_watchers_active", lambda d: d == 1) == 1
    run = await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
    group = await anext(responses)
    assert group.event_group.events[-1].revision == run.revision
    # Committed and delivered in this test: well within a minute, observed once for the group.
    delivery = "lane_delivery_latency_seconds"
    await metrics.until(f"{delivery}_count", lambda d: d == 1)
    assert await metrics.delta(f"{delivery}_bucket", le="60.0") == 1
    assert 0 <= await metrics.delta(f"{delivery}_sum") < 60

    call.cancel()  # the watcher leaves
    ended = "lane_watchers_ended_total"
    assert await metrics.until(ended, lambda d: d >= 1, reason="client_left") == 1
    assert await metrics.until("lane_watchers_active", lambda d: d == 0) == 0

    # A resume past the head is refused: ended out_of_range.
    past = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id, after_revision=run.revision + 5))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await anext(aiter(past))
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert await metrics.until(ended, lambda d: d >= 1, reason="out_of_range") == 1

    # Another server (metrics are per process) shuts down under its watcher: ended shutdown.
    async with extra_server(session_database_url) as (other, other_stub):
        other_lane = new_lane_id("metrics")
        await other_stub.CreateLane(pb.CreateLaneRequest(lane_id=other_lane))
        watching = other_stub.WatchLane(pb.WatchLaneRequest(lane_id=other_lane))
        stream = aiter(watching)
        assert (await anext(stream)).WhichOneof("item") == "snapshot"
        await other.stop(grace=5)
        with pytest.raises(grpc.aio.AioRpcError) as stopped:
            await anext(stream)
        assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await metrics.until(ended, lambda d: d >= 1, reason="shutdown") == 1
    assert await metrics.delta(ended, reason="client_left") == 1
    assert await metrics.delta(ended, reason="error") == 0
    assert await metrics.delta("lane_commands_total", method="WatchLane", code="OK") == 0


async def test_listener_reconnects_and_notify_queue_usage(metered) -> None:
    running, metrics = metered
    hub = running.hub
    await asyncio.wait_for(hub.listening.wait(), 10)
    await metrics.mark()
    # Refreshed by a task of its own while the endpoint is on (0 on an idle cluster).
    assert "notify-queue" in [task.get_name() for task in running.maintenance]
    usage = value(metrics.before, "lane_notification_queue_usage_ratio")
    assert 0 <= usage <= 1
    async with running.store.pool.connection() as conn:
        # This test's server is the only one on this database.
        cur = await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query = 'LISTEN lane_events' AND datname = current_database()"
        )
        assert [row[0] for row in await cur.fetchall()] == [True]
    assert await metrics.until("lane_listener_reconnects_total", lambda d: d >= 1) >= 1
    await asyncio.wait_for(hub.listening.wait(), 10)


async def test_metrics_endpoint_is_off_unless_configured(lane_server: RunningServer) -> None:
    assert lane_server.metrics is None
    assert lane_server.metrics_port is None


async def test_a_metrics_port_in_use_stops_start_up(fresh_database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(database_url=fresh_database_url, metrics_listen=f"127.0.0.1:{port}")
        with pytest.raises(StartupError, match="cannot serve metrics"):
            await start_server(settings, listen="127.0.0.1:0")


@contextmanager
def captured_json_logs(level: int = logging.DEBUG) -> Iterator[list[dict[str, object]]]:
    """JSON lines, as LANE_LOG_FORMAT=json writes them, of every record logged meanwhile."""
    lines: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(self.format(record)))

    handler = Collect()
    handler.setFormatter(logs.json_formatter())
    handler.addFilter(logs.RequestFields())
    root = logging.getLogger()
    instrument = logging.getLogger("lane.server.api.instrument")
    old_level = instrument.level
    root.addHandler(handler)
    instrument.setLevel(level)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        instrument.setLevel(old_level)


async def test_log_lines_of_an_rpc_carry_its_lane_and_operation(lane_stub) -> None:
    lane_id = new_lane_id("logs")
    with captured_json_logs() as lines:
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        run = await lane_stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
        await lane_stub.StartTurn(
            pb.StartTurnRequest(lane_id=lane_id, operation_id=run.operation_id)
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await lane_stub.StartTurn(pb.StartTurnRequest(lane_id=lane_id, operation_id="nope"))
        # The refusal can reach the client before the server has logged its answer line.
        async with asyncio.timeout(10):
            while not any(line.get("operation_id") == "nope" for line in lines):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    served = {(line["rpc"], line.get("operation_id")): line for line in lines if "rpc" in line}
    create = served[("CreateLane", None)]
    assert create["lane_id"] == lane_id
    assert create["namespace"] == DEFAULT_NAMESPACE
    assert {"time", "level", "logger", "message"} <= create.keys()
    # StartRun's request names no operation: its answer does, and the line says so.
    assert served[("StartRun", run.operation_id)]["lane_id"] == lane_id
    assert served[("StartTurn", run.operation_id)]["lane_id"] == lane_id
    refused = served[("StartTurn", "nope")]
    assert refused["lane_id"] == lane_id
    # The answer's line names the status code and the ErrorInfo reason.
    assert str(refused["message"]).startswith(
        "StartTurn answered FAILED_PRECONDITION OPERATION_NOT_OPEN in "
    )


def test_text_lines_append_the_request_fields() -> None:
    def record(**extra: str) -> logging.LogRecord:
        made = logging.LogRecord("lane.server.x", logging.INFO, __file__, 1, "hello", None, None)
        made.__dict__.update(extra)
        return made

    formatter, request_fields = logs.TextFormatter(), logs.RequestFields()
    with logs.request_scope("StartRun"):
        logs.bind(lane_id="l-1", operation_id="op-1")
        served, own = record(), record(lane_id="mine")
        request_fields.filter(served)
        request_fields.filter(own)
    line = formatter.format(served)
    assert line.endswith("lane.server.x: hello [rpc=StartRun lane_id=l-1 operation_id=op-1]")
    # A field the caller logged itself (extra=) is never overridden by the request's.
    assert formatter.format(own).endswith("hello [rpc=StartRun lane_id=mine operation_id=op-1]")
    # Outside a request: no fields, and none left over from the request before.
    plain = record()
    request_fields.filter(plain)
    assert formatter.format(plain).endswith("lane.server.x: hello")


def test_settings_read_metrics_and_log_format() -> None:
    settings = Settings.from_env({"LANE_METRICS_LISTEN": "[::1]:9464", "LANE_LOG_FORMAT": "JSON"})
    assert (settings.metrics_listen, settings.log_format) == ("[::1]:9464", "json")
    defaults = Settings.from_env({})
    assert (defaults.metrics_listen, defaults.log_format) == (None, "text")
    for variable, bad in (("LANE_METRICS_LISTEN", "9464"), ("LANE_LOG_FORMAT", "yaml")):
        with pytest.raises(ConfigError) as err:
            Settings.from_env({variable: bad})
        assert err.value.variable == variable
