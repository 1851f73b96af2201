"""ImportLane as an upload on the HTTP port (``service/lane/server/api/http_import.py``), against
a real server: the export file round trip, and the port's rules — auth first, the Host check,
the transfer shares, the 64 MiB bound, the body timeout — with the gRPC port's answers.

The client is the raw HTTP/1.1 one of test_http_hardening.py, so a test controls exactly what is
sent and when."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import h11
import pytest
from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.api.http_import import UPLOAD_PATH
from lane.server.api.transfer_rpcs import MAX_IMPORT_BYTES
from lane.server.app.config import Settings
from tests.integration.test_http_hardening import (
    TOKEN_A,
    TOKEN_B,
    RawHttp,
    auth,
    post,
    unary_error,
)
from tests.support.lanes import Stub, new_lane_id
from tests.support.servers import serve

pytestmark = pytest.mark.asyncio(loop_scope="session")

FILE = {"content-type": "application/octet-stream"}


def md(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@dataclass
class Uploads:
    """The service with auth on, one transfer at a time, a 2 s body timeout; and an export."""

    port: int
    stub: Stub
    #: The export file of a lane of team-a with a finished run.
    data: bytes


@pytest.fixture
async def uploads(session_database_url: str) -> AsyncIterator[Uploads]:
    with_auth = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        auth_tokens={TOKEN_A: "team-a", TOKEN_B: "team-b"},
        max_transfers=1,
        http_body_timeout_seconds=2.0,
    )
    async with serve(with_auth) as (running, stub):
        assert running.http_port is not None
        _, data = await exported(stub, TOKEN_A)
        yield Uploads(running.http_port, stub, data)


async def exported(stub: Stub, token: str) -> tuple[str, bytes]:
    """A lane with a finished run, and its export file."""
    authed: Any = _Authed(stub, token)
    script = await LaneScript.create(authed, new_lane_id("upload"))
    run = await script.start_run("go")
    await run.turn("done")
    await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    pieces = stub.ExportLane(pb.ExportLaneRequest(lane_id=script.lane_id), metadata=md(token))
    return script.lane_id, b"".join([piece.data async for piece in pieces])


class _Authed:
    """``stub`` with ``token``'s metadata on every call (for LaneScript)."""

    def __init__(self, stub: Stub, token: str) -> None:
        self.stub = stub
        self.token = token

    def __getattr__(self, method: str) -> Any:
        rpc = getattr(self.stub, method)
        return lambda request, **kw: rpc(request, metadata=md(self.token), **kw)


def path(lane_id: str) -> str:
    return f"{UPLOAD_PATH}?lane_id={lane_id}"


async def snapshot(stub: Stub, lane_id: str, token: str) -> snapshot_pb2.LaneSnapshot:
    answer = await stub.GetLaneSnapshot(
        pb.GetLaneSnapshotRequest(lane_id=lane_id), metadata=md(token)
    )
    found: snapshot_pb2.LaneSnapshot = answer.snapshot
    return found


async def missing(stub: Stub, lane_id: str, token: str) -> bool:
    try:
        await snapshot(stub, lane_id, token)
    except grpc.aio.AioRpcError as error:
        return error.code() == grpc.StatusCode.NOT_FOUND
    return False


async def test_an_exported_file_uploads_as_a_new_lane(uploads: Uploads) -> None:
    port, stub = uploads.port, uploads.stub
    source, data = await exported(stub, TOKEN_A)
    copy = new_lane_id("uploaded")
    answer = await post(port, path(copy), {**FILE, **auth(TOKEN_A)}, data)
    assert answer.status == 200, answer.body
    original = await snapshot(stub, source, TOKEN_A)
    body = answer.json()
    assert body["laneId"] == copy and body["revision"] == str(original.revision)
    imported = await snapshot(stub, copy, TOKEN_A)
    assert list(imported.transcript) == list(original.transcript)
    # The token's namespace: team-b's token neither sees it nor can import over it.
    assert await missing(stub, copy, TOKEN_B)
    again = await post(port, path(copy), {**FILE, **auth(TOKEN_A)}, data)
    assert (again.status, unary_error(again)) == (409, ("already_exists", "LANE_EXISTS"))


async def test_refusals_are_the_grpc_port_s_and_create_nothing(uploads: Uploads) -> None:
    port, stub, data = uploads.port, uploads.stub, uploads.data
    lane = new_lane_id("refused")

    no_token = await post(port, path(lane), FILE, data)
    assert (no_token.status, unary_error(no_token)) == (
        401,
        ("unauthenticated", "TOKEN_MISSING"),
    )
    wrong = await post(port, path(lane), {**FILE, **auth("not-a-token-of-this-service")}, data)
    assert unary_error(wrong) == ("unauthenticated", "TOKEN_UNKNOWN")

    bad = await post(port, path(lane), {**FILE, **auth(TOKEN_A)}, b'{"format": "nonsense"}\n')
    assert (bad.status, unary_error(bad)) == (400, ("invalid_argument", "INVALID_EXPORT"))

    no_lane = await post(port, UPLOAD_PATH, {**FILE, **auth(TOKEN_A)}, data)
    assert unary_error(no_lane) == ("invalid_argument", "MISSING_FIELD")

    client = await RawHttp.open(port)
    try:
        await client.request(path(lane), auth(TOKEN_A), method="GET")
        answer = await client.answer()
        assert answer.status == 405 and answer.headers["allow"] == "POST"
    finally:
        client.close()

    # Over the bound by its content-length: refused before its body is read.
    client = await RawHttp.open(port)
    try:
        headers = {"host": "127.0.0.1", **FILE, **auth(TOKEN_A)}
        headers["content-length"] = str(MAX_IMPORT_BYTES + 1)
        await client.send(
            h11.Request(method="POST", target=path(lane), headers=list(headers.items()))
        )
        async with asyncio.timeout(30):  # a guard against a hang, not a measure
            answer = await client.answer()
        assert unary_error(answer) == ("invalid_argument", "PAYLOAD_TOO_LARGE")
    finally:
        client.close()
    assert await missing(stub, lane, TOKEN_A)


async def test_a_trickled_upload_holds_a_transfer_share_until_its_body_times_out(
    uploads: Uploads,
) -> None:
    port, stub, data = uploads.port, uploads.stub, uploads.data
    lane = new_lane_id("trickled")
    client = await RawHttp.open(port)
    headers = {"host": "127.0.0.1", **FILE, **auth(TOKEN_A), "content-length": str(len(data))}
    await client.send(h11.Request(method="POST", target=path(lane), headers=list(headers.items())))

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError, h11.LocalProtocolError):
            for byte in data[:-1]:  # never the last byte
                client.writer.write(bytes([byte]))
                await client.writer.drain()
                await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    try:
        # The one transfer share (max_transfers=1) is the trickled upload's: another is refused.
        other = await post(port, path(new_lane_id("second")), {**FILE, **auth(TOKEN_A)}, data)
        assert (other.status, unary_error(other)) == (
            429,
            ("resource_exhausted", "TOO_MANY_TRANSFERS"),
        )
        async with asyncio.timeout(60):  # a guard against a hang, not a measure
            answer = await client.answer()
        assert unary_error(answer) == ("deadline_exceeded", "BODY_TIMEOUT")
    finally:
        trickling.cancel()
        client.close()
    assert await missing(stub, lane, TOKEN_A)
    # The share is free again.
    retried = await post(port, path(lane), {**FILE, **auth(TOKEN_A)}, data)
    assert retried.status == 200, retried.body


async def test_with_auth_off_a_foreign_host_is_refused(session_database_url: str) -> None:
    settings = Settings(database_url=session_database_url, http_listen="127.0.0.1:0")
    async with serve(settings) as (running, stub):
        port = running.http_port
        assert port is not None
        lane = new_lane_id("rebound")
        for headers in (
            {"host": f"rebound.example:{port}"},
            {"host": f"127.0.0.1:{port}", "origin": "http://rebound.example"},
        ):
            answer = await post(port, path(lane), {**FILE, **headers}, b"{}\n")
            assert answer.status == 403, headers
            assert unary_error(answer) == ("permission_denied", "HOST_NOT_ALLOWED"), headers
        assert await missing(stub, lane, "any")
