"""OpenTelemetry traces: one command is one trace from the client through the service into
PostgreSQL, a watcher's deliveries are spans of its stream, and with traces off there are none.

A real service on a local port and a real PostgreSQL; the spans go to an in-memory exporter
(the SDK's own), the service's tracer provider given to ``lane.server.traces.enable`` as
``LANE_OTEL=on`` does with the one it builds from the ``OTEL_*`` variables.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import pytest
import pytest_asyncio
from lane.client.connect import open_channel
from lane.client.session import LaneSession
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from lane.server import traces
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import new_lane_id, user

SERVICE = "lane.v1.LaneService"


class Traced:
    """The spans a tracer provider finished, and ways to find them."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def named(self, name: str, kind: SpanKind | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name and kind in (None, s.kind)]

    def one(self, name: str, kind: SpanKind | None = None) -> ReadableSpan:
        found = self.named(name, kind)
        assert len(found) == 1, (name, kind, [(s.name, s.kind) for s in self.spans()])
        return found[0]

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        return [
            s
            for s in self.spans()
            if s.parent is not None
            and s.parent.span_id == parent.context.span_id
            and name in (None, s.name)
        ]

    async def until(self, found: Callable[[], bool]) -> None:
        """Wait for spans that end after the call returned (a stream's, on the server)."""
        for _ in range(500):
            if found():
                return
            await asyncio.sleep(0.01)
        raise AssertionError([(s.name, s.kind) for s in self.spans()])

    @contextlib.asynccontextmanager
    async def stub(self, running: RunningServer) -> AsyncIterator[Any]:
        """A LaneService stub to ``running`` whose channel traces with this provider."""
        channel = open_channel(f"127.0.0.1:{running.port}", tracing=self.provider)
        try:
            yield lane_service_pb2_grpc.LaneServiceStub(channel)
        finally:
            await channel.close()


async def _next(watch: Any) -> pb.WatchLaneResponse:
    item = await watch.read()
    assert isinstance(item, pb.WatchLaneResponse), item
    return item


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return (
        span.parent is not None
        and span.parent.span_id == parent.context.span_id
        and span.context.trace_id == parent.context.trace_id
    )


@pytest_asyncio.fixture(loop_scope="session")
async def traced(fresh_database_url: str) -> AsyncIterator[tuple[Traced, RunningServer]]:
    """A service started with traces on (its pool's connections trace their statements)."""
    spans = Traced()
    traces.enable(spans.provider)
    try:
        running = await start_server(fresh_database_url, listen="127.0.0.1:0")
        try:
            yield spans, running
        finally:
            await running.stop(grace=0.5)
    finally:
        traces.disable()


async def test_a_unary_command_is_one_trace_from_client_to_database(
    traced: tuple[Traced, RunningServer],
) -> None:
    spans, running = traced
    lane_id = new_lane_id("traced")
    tracer = spans.provider.get_tracer("test")
    async with spans.stub(running) as stub:
        with tracer.start_as_current_span("application"):
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))

    application = spans.one("application")
    client = spans.one(f"{SERVICE}/CreateLane", SpanKind.CLIENT)
    server = spans.one(f"{SERVICE}/CreateLane", SpanKind.SERVER)
    assert child_of(client, application)
    assert child_of(server, client)  # the traceparent crossed the wire
    assert server.attributes is not None
    assert server.attributes["rpc.system"] == "grpc"
    assert server.attributes["rpc.service"] == SERVICE
    assert server.attributes["rpc.method"] == "CreateLane"
    assert server.attributes["rpc.grpc.status_code"] == 0
    assert server.attributes["lane.id"] == lane_id
    assert server.attributes["lane.namespace"] == "default"
    assert client.attributes is not None and client.attributes["rpc.grpc.status_code"] == 0

    (transaction,) = spans.children(server, "lane.transaction")
    assert transaction.attributes is not None
    assert transaction.attributes["lane.transaction.kind"] == "create"
    assert transaction.attributes["lane.id"] == lane_id
    statements = spans.children(transaction)
    assert statements, "the transaction's statements have spans"
    for statement in statements:
        assert statement.kind is SpanKind.CLIENT
        assert statement.attributes is not None
        assert statement.attributes["db.system"] == "postgresql"
        assert statement.context.trace_id == application.context.trace_id
    texts = [str(s.attributes and s.attributes["db.statement"]) for s in statements]
    assert any("INSERT INTO lanes" in text for text in texts), texts
    # One trace: every span of this command, and every span naming this lane. (Background
    # work of the in-process server on other lanes, such as the reconciler's passes, makes
    # traces of its own while the test runs.)
    ours = [s for s in spans.spans() if s.attributes and s.attributes.get("lane.id") == lane_id]
    ours += [client, server, transaction, *statements]
    assert {s.context.trace_id for s in ours} == {application.context.trace_id}


async def test_a_drive_lane_command_is_a_span_of_the_stream_down_to_the_database(
    traced: tuple[Traced, RunningServer],
) -> None:
    spans, running = traced
    lane_id = new_lane_id("driven")
    tracer = spans.provider.get_tracer("test")
    async with spans.stub(running) as stub:
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        with tracer.start_as_current_span("driver"):
            async with LaneSession(stub) as session:
                started = await session.call(
                    pb.StartRunRequest(lane_id=lane_id, prompt=[user("hello")])
                )
    assert started.operation_id

    # The stream's server span ends once the service saw the stream end.
    await spans.until(lambda: bool(spans.named(f"{SERVICE}/DriveLane", SpanKind.SERVER)))
    driver = spans.one("driver")
    client = spans.one(f"{SERVICE}/DriveLane", SpanKind.CLIENT)
    stream = spans.one(f"{SERVICE}/DriveLane", SpanKind.SERVER)
    command = spans.one(f"{SERVICE}/StartRun", SpanKind.INTERNAL)
    assert child_of(client, driver)
    assert child_of(stream, client)
    assert child_of(command, stream)
    assert command.attributes is not None
    assert command.attributes["rpc.method"] == "StartRun"
    assert command.attributes["lane.id"] == lane_id
    assert command.attributes["lane.operation_id"] == started.operation_id
    assert command.attributes["lane.drive.sequence"] >= 1  # type: ignore[operator]
    assert command.attributes["rpc.grpc.status_code"] == 0

    (transaction,) = spans.children(command, "lane.transaction")
    assert transaction.attributes is not None
    assert transaction.attributes["lane.transaction.kind"] == "command"
    statements = spans.children(transaction)
    assert statements
    assert all(s.attributes and s.attributes["db.system"] == "postgresql" for s in statements)
    assert all(s.context.trace_id == driver.context.trace_id for s in statements)


async def test_a_refusal_names_its_reason_and_is_not_an_error(
    traced: tuple[Traced, RunningServer],
) -> None:
    spans, running = traced
    async with spans.stub(running) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id="no-such-lane"))
    assert refused.value.code() is grpc.StatusCode.NOT_FOUND

    server = spans.one(f"{SERVICE}/GetLaneSnapshot", SpanKind.SERVER)
    assert server.attributes is not None
    assert server.attributes["lane.reason"] == "LANE_NOT_FOUND"
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert server.status.status_code is StatusCode.UNSET  # an answer, not the server's fault
    client = spans.one(f"{SERVICE}/GetLaneSnapshot", SpanKind.CLIENT)
    assert client.status.status_code is StatusCode.ERROR  # the caller did not get its answer
    assert child_of(server, client)


async def test_a_watcher_has_a_snapshot_span_and_a_span_per_delivered_group(
    traced: tuple[Traced, RunningServer],
) -> None:
    spans, running = traced
    lane_id = new_lane_id("watched")
    async with spans.stub(running) as stub:
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        watch = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        first = await _next(watch)
        assert first.WhichOneof("item") == "snapshot"
        started = await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("hi")]))
        group = await _next(watch)
        while group.WhichOneof("item") != "event_group":
            group = await _next(watch)
        watch.cancel()
    revisions = [event.revision for event in group.event_group.events]
    assert revisions[-1] == started.revision

    await spans.until(lambda: bool(spans.named(f"{SERVICE}/WatchLane", SpanKind.SERVER)))
    stream = spans.one(f"{SERVICE}/WatchLane", SpanKind.SERVER)
    assert stream.attributes is not None and stream.attributes["lane.id"] == lane_id
    (snapshot,) = spans.children(stream, "lane.watch.snapshot")
    assert snapshot.attributes is not None and snapshot.attributes["lane.revision"] == 1
    assert spans.children(snapshot), "the snapshot's reads have statement spans"
    deliveries = spans.children(stream, "lane.watch.delivery")
    assert deliveries
    delivered = deliveries[-1].attributes
    assert delivered is not None
    assert delivered["lane.revision.first"] == revisions[0]
    assert delivered["lane.revision.last"] == revisions[-1]
    assert delivered["lane.source"] in ("feed", "log")


async def test_with_traces_off_there_are_no_spans(fresh_database_url: str) -> None:
    spans = Traced()
    assert traces.tracer is None  # off unless enabled
    running = await start_server(fresh_database_url, listen="127.0.0.1:0")
    channel = open_channel(f"127.0.0.1:{running.port}", tracing=False)
    try:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        lane_id = new_lane_id("untraced")
        with spans.provider.get_tracer("test").start_as_current_span("application"):
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
            async with LaneSession(stub) as session:
                await session.call(pb.StartRunRequest(lane_id=lane_id, prompt=[user("x")]))
            watch = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
            assert (await _next(watch)).WhichOneof("item") == "snapshot"
            watch.cancel()
        async with running.store.pool.connection() as conn:
            # The pool's connections were opened with traces off: plain cursors.
            assert conn.cursor_factory.__name__ == "AsyncCursor"
    finally:
        await channel.close()
        await running.stop(grace=0.5)
    assert [s.name for s in spans.spans()] == ["application"]
