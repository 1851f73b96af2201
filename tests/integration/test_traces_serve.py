"""``LANE_OTEL=on`` in a real ``lane serve`` process: the standard ``OTEL_*`` variables choose
the exporter, the caller's ``traceparent`` is continued, and a bad exporter stops start-up
with exit 2 naming its variable."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import grpc
import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from lane.server.app.config import ConfigError
from lane.server.app.tracing import exporter_names
from tests.integration.lanes import new_lane_id
from tests.integration.test_app import _free_port
from tests.integration.test_serve_cli import lane_env
from tests.support.servers import serving

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


async def test_lane_serve_exports_the_callers_trace(
    fresh_database_url: str, tmp_path: Path
) -> None:
    port = _free_port()
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    env = lane_env(
        LANE_OTEL="on", OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="lane-under-test"
    )
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lane.client", "serve",
            "--listen", f"127.0.0.1:{port}", "--database-url", fresh_database_url,
            "--workers", "1", "--grace-seconds", "0.5",
            env=env, cwd=tmp_path, stdout=stdout, stderr=stderr,
        )  # fmt: skip
    lane_id = new_lane_id("served")
    try:
        assert await asyncio.wait_for(serving(port, process), 30), err.read_text()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            await stub.CreateLane(
                pb.CreateLaneRequest(lane_id=lane_id),
                metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),),
            )
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(process.wait(), 20)
    assert status == 0, err.read_text()
    assert "traces on: exporting to console as lane-under-test" in err.read_text()

    # The console exporter writes each span as a JSON object; the last ones flush on exit.
    decoder, text, spans = json.JSONDecoder(), out.read_text(), []
    at = text.find("{")
    while at != -1:
        span, end = decoder.raw_decode(text, at)
        spans.append(span)
        at = text.find("{", end)
    server = [s for s in spans if s["name"] == "lane.v1.LaneService/CreateLane"]
    assert len(server) == 1, [s["name"] for s in spans]
    assert server[0]["kind"] == "SpanKind.SERVER"
    assert server[0]["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert server[0]["parent_id"] == f"0x{PARENT_ID}"
    assert server[0]["attributes"]["lane.id"] == lane_id
    assert server[0]["resource"]["attributes"]["service.name"] == "lane-under-test"
    transaction = [s for s in spans if s["name"] == "lane.transaction"]
    assert [s["parent_id"] for s in transaction] == [server[0]["context"]["span_id"]]


async def test_an_exporter_that_is_not_installed_stops_start_up(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lane.client", "serve", "--data-dir", str(tmp_path / "data"),
        env=lane_env(LANE_OTEL="on", OTEL_TRACES_EXPORTER="zipkin_json"),
        cwd=tmp_path, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2, err.decode()
    assert "OTEL_TRACES_EXPORTER='zipkin_json': no trace exporter named zipkin_json" in (
        err.decode()
    )
    assert not (tmp_path / "data").exists()


def test_otlp_means_the_protocol_the_standard_variables_name() -> None:
    assert exporter_names({}) == ["otlp_proto_grpc"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "otlp,console"}) == [
        "otlp_proto_grpc",
        "console",
    ]
    http = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert exporter_names(http) == ["otlp_proto_http"]
    # The traces' own protocol variable wins over the general one.
    assert exporter_names(http | {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}) == [
        "otlp_proto_grpc"
    ]
    with pytest.raises(ConfigError) as bad:
        exporter_names({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert bad.value.variable == "OTEL_EXPORTER_OTLP_PROTOCOL"
