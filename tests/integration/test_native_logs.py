"""With ``LANE_LOG_FORMAT=json``, gRPC core's own lines (a failed TLS handshake) reach the log
as JSON records of the ``grpc`` logger: every line the service writes is one JSON object."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from lane.server.app.native_logs import log_line
from tests.integration.test_app import _free_port
from tests.integration.test_tls import Certificates, certificates

__all__ = ["certificates"]  # the fixture


async def test_grpc_core_handshake_errors_are_json_records(
    fresh_database_url: str, certificates: Certificates, tmp_path: Path
) -> None:
    port = _free_port()
    log = tmp_path / "service.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANE_", "GRPC_"))} | {
        "LANE_DATABASE_URL": fresh_database_url,
        "LANE_LISTEN": f"127.0.0.1:{port}",
        "LANE_LOG_FORMAT": "json",
        "LANE_WORKERS": "1",
        "LANE_TLS_CERT_FILE": str(certificates.server_cert_file),
        "LANE_TLS_KEY_FILE": str(certificates.server_key_file),
        "GRPC_ENABLE_FORK_SUPPORT": "0",
    }
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lane.server.app", env=env, cwd=tmp_path, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log.read_text():
            assert process.returncode is None and time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        # A plaintext client: the server's TLS handshake fails, and gRPC core says so.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.ListLanes(pb.ListLanesRequest(), timeout=5)
        records: list[dict[str, object]] = []
        while not any("Handshake failed" in str(r.get("message")) for r in records):
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
            records = [json.loads(line) for line in log.read_text().splitlines() if line]
        (handshake,) = [r for r in records if "Handshake failed" in str(r["message"])][:1]
        assert handshake["logger"] == "grpc"
        assert str(handshake["source"]).startswith("ssl_transport_security")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
    # Every line, start-up to shutdown, is a JSON object.
    for line in log.read_text().splitlines():
        assert isinstance(json.loads(line), dict), line


class Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)


def test_native_lines_become_records(caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink()
    with caplog.at_level("INFO"):
        log_line("E0101 12:00:00.000000   42 chttp2_server.cc:7] accept failed", sink)  # type: ignore[arg-type]
        log_line("something else entirely", sink)  # type: ignore[arg-type]
        log_line('{"level": "INFO", "message": "a worker line"}', sink)  # type: ignore[arg-type]
    grpc_record, other = caplog.records
    assert (grpc_record.name, grpc_record.levelname, grpc_record.getMessage()) == (
        "grpc",
        "ERROR",
        "accept failed",
    )
    assert grpc_record.source == "chttp2_server.cc:7"  # type: ignore[attr-defined]
    assert (other.name, other.levelname) == ("stderr", "WARNING")
    assert sink.text == '{"level": "INFO", "message": "a worker line"}\n'
