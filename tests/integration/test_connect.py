"""LaneService over Connect and gRPC-Web on the HTTP port (``LANE_HTTP_LISTEN``).

Against a real server serving both ports on one database, with real clients: curl, and the
connectrpc client (Connect JSON and binary, gRPC-Web; HTTP/1.1 and HTTP/2):

- docs/http.md's curl line answers, JSON in and out, a refusal with its google.rpc.ErrorInfo;
- every protocol reaches the same lanes and answers as the gRPC port does, refusals included;
- WatchLane streams the snapshot and then each commit over HTTP/1.1 and HTTP/2;
- auth (tokens → namespaces, checked before the request is read), the 4 MiB message limit,
  request validation, metrics and TLS behave as on the gRPC port.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from connectrpc.client import ConnectClient
from connectrpc.compat import google_protobuf_binary_codec, google_protobuf_json_codec
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.protocol import ProtocolType
from google.protobuf import message_factory
from google.rpc import error_details_pb2
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2
from pyqwest import Client as HttpClient
from pyqwest import HTTPTransport, HTTPVersion

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import error_info, new_lane_id, text, user
from tests.integration.test_tls import issue, pem, pem_key

SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
PROTOS = Path(__file__).resolve().parents[2] / "protos"
TOKEN_A = "connect-token-team-a-0123456789"
TOKEN_B = "connect-token-team-b-0123456789"


def method(name: str) -> MethodInfo[Any, Any]:
    """The connectrpc description of LaneService method ``name``."""
    descriptor = SERVICE.methods_by_name[name]
    return MethodInfo(
        name=name,
        service_name=SERVICE.full_name,
        input=message_factory.GetMessageClass(descriptor.input_type),
        output=message_factory.GetMessageClass(descriptor.output_type),
        idempotency_level=IdempotencyLevel.UNKNOWN,
        stream_type=StreamType.SERVER_STREAM if descriptor.server_streaming else StreamType.UNARY,
    )


#: (protocol, codec, HTTP version): every way a Connect or gRPC-Web client may call.
WAYS = [
    pytest.param(ProtocolType.CONNECT, "json", HTTPVersion.HTTP1, id="connect-json-http1"),
    pytest.param(ProtocolType.CONNECT, "proto", HTTPVersion.HTTP1, id="connect-proto-http1"),
    pytest.param(ProtocolType.CONNECT, "json", HTTPVersion.HTTP2, id="connect-json-http2"),
    pytest.param(ProtocolType.CONNECT, "proto", HTTPVersion.HTTP2, id="connect-proto-http2"),
    pytest.param(ProtocolType.GRPC_WEB, "proto", HTTPVersion.HTTP1, id="grpc-web-http1"),
    pytest.param(ProtocolType.GRPC_WEB, "json", HTTPVersion.HTTP2, id="grpc-web-json-http2"),
]


class Caller:
    """A connectrpc client of LaneService speaking one protocol, codec and HTTP version."""

    def __init__(self, url: str, protocol: ProtocolType, codec: str, http: HttpClient) -> None:
        self.client = ConnectClient(
            url,
            protocol=protocol,
            codec=google_protobuf_json_codec()
            if codec == "json"
            else google_protobuf_binary_codec(),
            send_compression=None,
            http_client=http,
        )

    async def __call__(self, name: str, request: Any, token: str | None = None) -> Any:
        return await self.client.execute_unary(
            request=request, method=method(name), headers=_auth(token)
        )

    def watch(self, request: pb.WatchLaneRequest, token: str | None = None) -> AsyncIterator[Any]:
        return self.client.execute_server_stream(
            request=request, method=method("WatchLane"), headers=_auth(token)
        )

    def watch_lanes(
        self, request: pb.WatchLanesRequest, token: str | None = None
    ) -> AsyncIterator[Any]:
        return self.client.execute_server_stream(
            request=request, method=method("WatchLanes"), headers=_auth(token)
        )


def _auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def connect_reason(error: ConnectError) -> str:
    """The ErrorInfo reason among a Connect error's details ("" if none)."""
    for detail in error.details:
        if detail.type_name == "google.rpc.ErrorInfo":
            reason: str = error_details_pb2.ErrorInfo.FromString(detail.message_bytes).reason
            return reason
    return ""


@asynccontextmanager
async def http_client(version: Any, **tls: Any) -> AsyncIterator[HttpClient]:
    """An HTTP client speaking only ``version`` (HTTP/2: with prior knowledge on cleartext)."""
    transport = HTTPTransport(http_version=version, **tls)
    try:
        yield HttpClient(transport)
    finally:
        await transport.aclose()


def curl(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "30", *args],
        capture_output=True,
        text=True,
        check=False,
        input=input,
    )


async def test_the_documented_curl_line(http_server: RunningServer, http_server_stub: Any) -> None:
    url = f"http://127.0.0.1:{http_server.http_port}/lane.v1.LaneService/GetLaneSnapshot"
    # docs/http.md's line, on a lane that does not exist: not_found and its ErrorInfo.
    answer = await asyncio.to_thread(
        curl, "-i", "-d", '{"laneId":"x"}', "-H", "content-type: application/json", url
    )
    head, _, body = answer.stdout.partition("\n\n")  # text mode: \r\n read as \n
    assert head.startswith("HTTP/1.1 404"), answer.stdout
    error = json.loads(body)
    assert error["code"] == "not_found"
    (detail,) = error["details"]
    assert detail["type"] == "google.rpc.ErrorInfo"
    info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(detail["value"] + "=="))
    assert (info.reason, info.domain, info.metadata["laneId"]) == ("LANE_NOT_FOUND", "lane.v1", "x")

    # A lane created over gRPC answers over curl, in protobuf's JSON mapping.
    lane_id = new_lane_id("curl")
    await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    answer = await asyncio.to_thread(
        curl, "-d", json.dumps({"laneId": lane_id}), "-H", "content-type: application/json", url
    )
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("{"), (answer.stdout, answer.stderr)
    snapshot = json.loads(answer.stdout)["snapshot"]
    assert snapshot["laneId"] == lane_id
    assert snapshot["revision"] == "1"  # int64: a string in JSON


@pytest.mark.parametrize(("protocol", "codec", "version"), WAYS)
async def test_every_protocol_reaches_the_same_lanes_and_refusals(
    http_server: RunningServer, http_server_stub: Any, protocol: Any, codec: str, version: Any
) -> None:
    async with http_client(version) as http:
        caller = Caller(f"http://127.0.0.1:{http_server.http_port}", protocol, codec, http)
        lane_id = new_lane_id("connect")
        created = await caller("CreateLane", pb.CreateLaneRequest(lane_id=lane_id))
        assert created.revision == 1
        queued = await caller(
            "EnqueueMessage",
            pb.EnqueueMessageRequest(
                lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("hi")
            ),
        )
        # The gRPC port sees what the HTTP port committed, and the reverse.
        over_grpc = await http_server_stub.GetLaneSnapshot(
            pb.GetLaneSnapshotRequest(lane_id=lane_id)
        )
        assert over_grpc.snapshot.revision == queued.revision == 2
        over_http = await caller("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id))
        assert over_http == over_grpc

        # The same refusals, code and ErrorInfo: a missing field, a bad id, a bad field.
        for name, request in [
            ("EnqueueMessage", pb.EnqueueMessageRequest(lane_id=lane_id, message=user("x"))),
            ("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id="")),
            ("ListLanes", pb.ListLanesRequest(page_size=100_000)),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as over_grpc_error:
                await getattr(http_server_stub, name)(request)
            with pytest.raises(ConnectError) as over_http_error:
                await caller(name, request)
            expected = over_grpc_error.value.code().name.lower().replace("cancelled", "canceled")
            assert over_http_error.value.code.value == expected
            assert connect_reason(over_http_error.value) == error_info(over_grpc_error.value).reason
            assert over_http_error.value.message == over_grpc_error.value.details()


@pytest.mark.parametrize(("protocol", "codec", "version"), WAYS)
async def test_watch_lane_streams_snapshot_then_commits(
    http_server: RunningServer, http_server_stub: Any, protocol: Any, codec: str, version: Any
) -> None:
    lane_id = new_lane_id("watch")
    await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    async with http_client(version) as http:
        caller = Caller(f"http://127.0.0.1:{http_server.http_port}", protocol, codec, http)
        stream = caller.watch(pb.WatchLaneRequest(lane_id=lane_id))
        first = await anext(stream)
        assert first.snapshot.snapshot.lane_id == lane_id
        assert first.snapshot.snapshot.revision == 1
        await http_server_stub.EnqueueMessage(
            pb.EnqueueMessageRequest(
                lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("hello")
            )
        )
        second = await anext(stream)
        assert second.WhichOneof("item") == "event_group"
        (event,) = second.event_group.events
        assert event.revision == 2
        assert "hello" in str(event)  # the queued message itself
        await stream.aclose()  # type: ignore[attr-defined]

        # A refusal ends the stream with its code and ErrorInfo, as on gRPC.
        with pytest.raises(ConnectError) as refused:
            await anext(caller.watch(pb.WatchLaneRequest(lane_id=lane_id, after_revision=99)))
        assert refused.value.code.value == "out_of_range"
        assert connect_reason(refused.value) == "REVISION_OUT_OF_RANGE"


@pytest.mark.parametrize(("protocol", "codec", "version"), WAYS)
async def test_watch_lanes_lists_then_streams_changes(
    http_server: RunningServer, http_server_stub: Any, protocol: Any, codec: str, version: Any
) -> None:
    prefix = new_lane_id("lanes")
    for name in ("a", "b"):
        await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-{name}"))
    async with http_client(version) as http:
        caller = Caller(f"http://127.0.0.1:{http_server.http_port}", protocol, codec, http)
        stream = caller.watch_lanes(pb.WatchLanesRequest(lane_id_prefix=prefix))
        listing = await anext(stream)
        assert listing.listing_complete
        over_grpc = await http_server_stub.ListLanes(pb.ListLanesRequest(lane_id_prefix=prefix))
        assert list(listing.lanes) == list(over_grpc.lanes)
        started = await http_server_stub.StartRun(
            pb.StartRunRequest(lane_id=f"{prefix}-b", prompt=[user("go")])
        )
        change = await anext(stream)
        (line,) = change.lanes
        assert (line.lane_id, line.revision) == (f"{prefix}-b", started.revision)
        assert line.status == pb.LANE_STATUS_RUNNING
        await stream.aclose()  # type: ignore[attr-defined]
        # A refusal ends the stream with its code and ErrorInfo, as on gRPC.
        with pytest.raises(ConnectError) as refused:
            await anext(caller.watch_lanes(pb.WatchLanesRequest(lane_ids=["x"] * 1001)))
        assert refused.value.code.value == "invalid_argument"
        assert connect_reason(refused.value) == "TOO_MANY_LANE_IDS"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def authed(session_database_url: str) -> AsyncIterator[RunningServer]:
    """One service with both ports and tokens for two namespaces."""
    settings = Settings(
        database_url=session_database_url, auth_tokens={TOKEN_A: "team-a", TOKEN_B: "team-b"}
    )
    running = await start_server(settings, listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


@pytest.mark.parametrize(("protocol", "codec", "version"), WAYS[:2] + WAYS[4:5])
async def test_auth_as_on_the_grpc_port(
    authed: RunningServer, protocol: Any, codec: str, version: Any
) -> None:
    async with http_client(version) as http:
        caller = Caller(f"http://127.0.0.1:{authed.http_port}", protocol, codec, http)
        lane_id = new_lane_id("auth")
        await caller("CreateLane", pb.CreateLaneRequest(lane_id=lane_id), TOKEN_A)
        for token, reason in [
            (None, "TOKEN_MISSING"),
            ("not-a-token-of-this-service", "TOKEN_UNKNOWN"),
        ]:
            with pytest.raises(ConnectError) as refused:
                await caller("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id), token)
            assert (refused.value.code.value, connect_reason(refused.value)) == (
                "unauthenticated",
                reason,
            )
            with pytest.raises(ConnectError) as refused:
                await anext(caller.watch(pb.WatchLaneRequest(lane_id=lane_id), token))
            assert connect_reason(refused.value) == reason
        # Another namespace's lane is a lane that does not exist, for reads and watches alike.
        with pytest.raises(ConnectError) as refused:
            await caller("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id), TOKEN_B)
        assert connect_reason(refused.value) == "LANE_NOT_FOUND"
        with pytest.raises(ConnectError) as refused:
            await anext(caller.watch(pb.WatchLaneRequest(lane_id=lane_id), TOKEN_B))
        assert connect_reason(refused.value) == "LANE_NOT_FOUND"
        listed = await caller("ListLanes", pb.ListLanesRequest(), TOKEN_B)
        assert lane_id not in [lane.lane_id for lane in listed.lanes]
        snapshot = await caller(
            "GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id), TOKEN_A
        )
        assert snapshot.snapshot.lane_id == lane_id


async def test_malformed_json_is_refused_after_the_token(authed: RunningServer) -> None:
    url = f"http://127.0.0.1:{authed.http_port}/lane.v1.LaneService/ListLanes"
    for body, token, reason in [
        ("{not json", None, "TOKEN_MISSING"),
        ("{not json", TOKEN_A, "MALFORMED_REQUEST"),
        ('{"pageSize": "many"}', TOKEN_A, "MALFORMED_REQUEST"),
        ("[" * 100_000, TOKEN_A, "MALFORMED_REQUEST"),  # deep nesting: refused, not a crash
    ]:
        headers = ["-H", "content-type: application/json"]
        if token:
            headers += ["-H", f"authorization: Bearer {token}"]
        answer = await asyncio.to_thread(curl, "-d", body, *headers, url)
        error = json.loads(answer.stdout)
        info = error_details_pb2.ErrorInfo.FromString(
            base64.b64decode(error["details"][0]["value"] + "==")
        )
        assert info.reason == reason, error
    # The service still serves.
    answer = await asyncio.to_thread(
        curl,
        "-d",
        "{}",
        "-H",
        "content-type: application/json",
        "-H",
        f"authorization: Bearer {TOKEN_A}",
        url,
    )
    assert "lanes" in json.loads(answer.stdout) or json.loads(answer.stdout) == {}


@pytest.mark.parametrize(("protocol", "codec", "version"), WAYS[1:2] + WAYS[4:5])
async def test_limits_validation_and_metrics_as_on_the_grpc_port(
    http_server: RunningServer, http_server_stub: Any, protocol: Any, codec: str, version: Any
) -> None:
    lane_id = new_lane_id("limits")
    await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))

    def answered(code: str) -> float:
        value = http_server.registry.get_sample_value(
            "lane_commands_total", {"method": "EnqueueMessage", "code": code}
        )
        return value or 0.0

    async with http_client(version) as http:
        caller = Caller(f"http://127.0.0.1:{http_server.http_port}", protocol, codec, http)
        # A payload over 512 KiB: validation's PAYLOAD_TOO_LARGE, counted as on gRPC.
        before = answered("INVALID_ARGUMENT")
        big = pb.EnqueueMessageRequest(
            lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("x" * (600 << 10))
        )
        with pytest.raises(ConnectError) as refused:
            await caller("EnqueueMessage", big)
        assert connect_reason(refused.value) == "PAYLOAD_TOO_LARGE"
        assert answered("INVALID_ARGUMENT") == before + 1
        # A request over 4 MiB is refused RESOURCE_EXHAUSTED before it reaches the service.
        huge = pb.EnqueueMessageRequest(
            lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("x" * (5 << 20))
        )
        with pytest.raises(ConnectError) as refused:
            await caller("EnqueueMessage", huge)
        assert refused.value.code.value == "resource_exhausted"
        before = answered("OK")
        await caller(
            "EnqueueMessage",
            pb.EnqueueMessageRequest(
                lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("ok")
            ),
        )
        assert answered("OK") == before + 1


async def test_large_json_bodies_are_read_as_small_ones(
    http_server: RunningServer, http_server_stub: Any
) -> None:
    # JSON bodies over 64 KiB are parsed off the event loop: the same answers as on it.
    lane_id = new_lane_id("json")
    await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    follow_up = snapshot_pb2.QUEUE_KIND_FOLLOW_UP
    async with http_client(HTTPVersion.HTTP1) as http:
        caller = Caller(
            f"http://127.0.0.1:{http_server.http_port}", ProtocolType.CONNECT, "json", http
        )
        long_text = "y" * (100 << 10)
        await caller(
            "EnqueueMessage",
            pb.EnqueueMessageRequest(lane_id=lane_id, kind=follow_up, message=user(long_text)),
        )
        snapshot = (
            await http_server_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
        ).snapshot
        (queued,) = snapshot.queues
        assert queued.message.user.content[0].text.text == long_text
        refusals = {
            "PAYLOAD_TOO_LARGE": user("x" * (600 << 10)),
            "TOO_MANY_CONTENT_BLOCKS": messages_pb2.AgentMessage(
                user=messages_pb2.UserMessage(content=[text("")] * 5000)
            ),
        }
        for reason, message in refusals.items():
            request = pb.EnqueueMessageRequest(lane_id=lane_id, kind=follow_up, message=message)
            with pytest.raises(ConnectError) as refused:
                await caller("EnqueueMessage", request)
            assert connect_reason(refused.value) == reason
        body = '{"laneId": "' + "z" * (100 << 10)  # not JSON
        url = f"http://127.0.0.1:{http_server.http_port}/lane.v1.LaneService/EnqueueMessage"
        answer = await asyncio.to_thread(
            curl, "-d", "@-", "-H", "content-type: application/json", url, input=body
        )
        assert json.loads(answer.stdout)["code"] == "invalid_argument", answer.stdout
    after = await http_server_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert after.snapshot == snapshot  # the refusals changed nothing


async def test_buf_curl_protocol_connect(http_server: RunningServer, http_server_stub: Any) -> None:
    lane_id = new_lane_id("buf")
    await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    buf = Path(sys.executable).parent / "buf"
    url = f"http://127.0.0.1:{http_server.http_port}/lane.v1.LaneService/GetLaneSnapshot"
    body = json.dumps({"laneId": lane_id})
    command = [str(buf), "curl", "--schema", str(PROTOS), "--protocol", "connect", "-d", body]
    answer = await asyncio.to_thread(
        subprocess.run,
        [*command, url],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["snapshot"]["laneId"] == lane_id


async def test_tls_on_the_http_port(session_database_url: str, tmp_path: Path) -> None:
    ca = issue("lane test CA", None, ca=True)
    server = issue("localhost", ca, ca=False)
    (tmp_path / "ca.pem").write_bytes(pem(ca[0]))
    (tmp_path / "server.pem").write_bytes(pem(server[0]))
    (tmp_path / "server.key").write_bytes(pem_key(server[1]))
    settings = Settings(
        database_url=session_database_url,
        tls_cert_file=tmp_path / "server.pem",
        tls_key_file=tmp_path / "server.key",
    )
    running = await start_server(settings, listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    try:
        url = f"https://localhost:{running.http_port}/lane.v1.LaneService/GetLaneSnapshot"
        body = ["-d", '{"laneId":"x"}', "-H", "content-type: application/json"]
        # HTTP/2 by ALPN, the certificate checked against its CA.
        ca_file = str(tmp_path / "ca.pem")
        args = ["-w", "\\n%{http_version}", "--http2", "--cacert", ca_file, *body, url]
        answer = await asyncio.to_thread(curl, *args)
        error, _, version = answer.stdout.rpartition("\n")
        assert version == "2", answer.stderr
        assert json.loads(error)["code"] == "not_found"
        # Plaintext is not served there.
        answer = await asyncio.to_thread(curl, *body, url.replace("https:", "http:"))
        assert answer.returncode != 0 or "not_found" not in answer.stdout
    finally:
        await running.stop(grace=0.5)
