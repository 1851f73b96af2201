"""The HTTP port held to the gRPC port's rules, against a real server and hand-made requests.

- auth first: a request without a valid token is refused before its body is decompressed or
  parsed; a gzip bomb stops at the 4 MiB limit; a JSON request over a count limit is refused
  before protobuf reads it, with the gRPC port's reason; large JSON bodies have a budget per
  namespace (``service/lane/server/api/connect_admission.py``, ``json_parses.py``);
- a Connect or gRPC-Web watcher whose client stopped reading is cut at the write deadline with
  WATCHER_TOO_SLOW, its slot freed, and its connection dropped when it never reads again
  (``response_writes.py``);
- with auth off, only loopback Hosts and Origins are served (DNS rebinding, ``host_check.py``);
- body and idle timeouts and the connection cap (``http_connections.py``);
- a shutdown with streams open logs no error.

The clients are raw sockets speaking HTTP/1.1 (parsed with h11), so a test controls exactly
what is sent and when the client reads; the counts of work done are read from hooks on the
functions that do it, never from timing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import logging
import socket
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import connectrpc.compression.gzip as connect_gzip
import grpc
import h11
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2
from lane.limits import MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb

from lane.server.api import json_parses
from lane.server.api.json_parses import PARSES_PER_NAMESPACE, WAITING_PER_NAMESPACE
from lane.server.app.config import Settings
from lane.server.app.server import RunningServer
from lane.server.domain.limits import MAX_CONTENT_BLOCKS
from tests.support.driver_tools import until
from tests.support.lanes import (
    Stub,
    assistant,
    error_reason,
    new_lane_id,
    result,
    tool_call,
    user,
)
from tests.support.servers import serve

TOKEN_A = "hardening-token-team-a-0123456789"
TOKEN_B = "hardening-token-team-b-0123456789"
SERVICE = "/lane.v1.LaneService"


# -- a raw HTTP/1.1 client --------------------------------------------------------------


@dataclass
class Answer:
    """A response read in full: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawHttp:
    """One HTTP/1.1 connection driven by hand (h11 keeps the framing right)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int, *, receive_buffer: int | None = None) -> RawHttp:
        sock = socket.socket()
        if receive_buffer is not None:
            # A small window: a client that stops reading stops the server soon.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        return cls(reader, writer)

    async def send(self, *events: Any) -> None:
        for event in events:
            self.writer.write(self.h11.send(event) or b"")
        await self.writer.drain()

    async def request(
        self, path: str, headers: dict[str, str], body: bytes = b"", method: str = "POST"
    ) -> None:
        """Send a whole request (``host`` defaults to 127.0.0.1)."""
        fields = {"host": "127.0.0.1", **headers}
        if method == "POST":
            fields["content-length"] = str(len(body))
        await self.send(h11.Request(method=method, target=path, headers=list(fields.items())))
        await self.send(h11.Data(data=body), h11.EndOfMessage()) if body else await self.send(
            h11.EndOfMessage()
        )

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(65536)
            self.h11.receive_data(data)

    async def response(self) -> h11.Response:
        event = await self.next_event()
        assert isinstance(event, h11.Response), event
        return event

    async def answer(self) -> Answer:
        """The whole response to the request sent."""
        head = await self.response()
        body = b""
        while not isinstance(event := await self.next_event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data), event
            body += event.data
        headers = {k.decode().lower(): v.decode() for k, v in head.headers}
        return Answer(head.status_code, headers, body)

    async def closed_by_server(self) -> bool:
        """Read until the server closes; True once it did (EOF or reset)."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.writer.transport.abort()


async def post(port: int, path: str, headers: dict[str, str], body: bytes) -> Answer:
    client = await RawHttp.open(port)
    try:
        await client.request(path, headers, body)
        return await client.answer()
    finally:
        client.close()


async def read_body(client: RawHttp) -> bytes:
    """The rest of the response's body, read as it comes."""
    body = b""
    while not isinstance(event := await client.next_event(), h11.EndOfMessage):
        if isinstance(event, h11.Data):
            body += event.data
    return body


def envelope(data: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(data)) + data


def envelopes(data: bytes) -> Iterator[tuple[int, bytes]]:
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        yield flags, data[5 : 5 + size]
        data = data[5 + size :]


def reason_of_details(details: list[Any]) -> str:
    """The ErrorInfo reason among a Connect error's JSON details."""
    for detail in details:
        if detail["type"] == "google.rpc.ErrorInfo":
            info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(detail["value"] + "=="))
            return str(info.reason)
    return ""


def unary_error(answer: Answer) -> tuple[str, str]:
    """(code, reason) of a Connect unary error answer."""
    error = answer.json()
    return error["code"], reason_of_details(error.get("details", []))


def stream_end(body: bytes, protocol: str) -> tuple[str, str]:
    """(code, reason) at the end of a Connect or gRPC-Web stream's body ("ok", "" if none)."""
    for flags, data in envelopes(body):
        if protocol == "connect" and flags & 0x02:
            error = json.loads(data).get("error")
            if error is None:
                return "ok", ""
            return error["code"], reason_of_details(error.get("details", []))
        if protocol == "grpc-web" and flags & 0x80:
            trailers = dict(
                line.split(":", 1) for line in data.decode().strip().split("\r\n") if line
            )
            status = status_pb2.Status.FromString(
                base64.b64decode(trailers["grpc-status-details-bin"].strip() + "==")
            )
            info = error_details_pb2.ErrorInfo()
            for detail in status.details:
                detail.Unpack(info)
            return grpc.StatusCode(_code(int(trailers["grpc-status"]))).name.lower(), info.reason
    return "none", ""


def _code(number: int) -> tuple[int, str]:
    return next(code.value for code in grpc.StatusCode if code.value[0] == number)


STREAM_TYPES = {
    "connect": {"content-type": "application/connect+proto"},
    "grpc-web": {"content-type": "application/grpc-web+proto", "x-grpc-web": "1"},
}


# -- hooks: counting the work done --------------------------------------------------------


@dataclass
class Work:
    """How often bodies were decompressed and JSON parsed, and the most gzip inflated once."""

    decompressed: int = 0
    parsed: int = 0
    inflated: list[int] = field(default_factory=list)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    counts = Work()
    decompress = connect_gzip.GzipCompression.decompress
    parse = json_format.Parse

    def counted_decompress(self: Any, data: Any, read_max_bytes: int | None = None) -> bytes:
        counts.decompressed += 1
        return decompress(self, data, read_max_bytes)

    def counted_parse(*args: Any, **kwargs: Any) -> Any:
        counts.parsed += 1
        return parse(*args, **kwargs)

    class CountingZlib:
        """connectrpc's zlib, whose decompressors note how much they inflate."""

        def __getattr__(self, name: str) -> Any:
            return getattr(zlib, name)

        def decompressobj(self, *args: Any, **kwargs: Any) -> Any:
            inner = zlib.decompressobj(*args, **kwargs)
            counts.inflated.append(0)

            class Counting:
                def __getattr__(self, name: str) -> Any:
                    return getattr(inner, name)

                def decompress(self, data: Any, max_length: int = 0) -> bytes:
                    out = inner.decompress(data, max_length)
                    counts.inflated[-1] += len(out)
                    return out

            return Counting()

    monkeypatch.setattr(connect_gzip.GzipCompression, "decompress", counted_decompress)
    monkeypatch.setattr(connect_gzip, "zlib", CountingZlib())
    monkeypatch.setattr(json_format, "Parse", counted_parse)
    return counts


# -- R1: auth first, then bounded parsing ------------------------------------------------


@pytest.fixture
async def authed(session_database_url: str) -> AsyncIterator[tuple[RunningServer, Stub]]:
    settings = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        auth_tokens={TOKEN_A: "team-a", TOKEN_B: "team-b"},
    )
    async with serve(settings) as (running, stub):
        yield running, stub


def http_port(running: RunningServer) -> int:
    """The HTTP port of a server started with one."""
    port = running.http_port
    assert port is not None
    return port


def auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


async def test_a_body_without_a_valid_token_is_neither_decompressed_nor_parsed(
    authed: tuple[RunningServer, Stub], work: Work
) -> None:
    running, _ = authed
    port = http_port(running)
    blocks = b",".join([b"{}"] * 100_000)
    bomb = gzip.compress(b'{"laneId":"x","message":{"user":{"content":[' + blocks + b"]}}}")
    unary = {"content-type": "application/json", "content-encoding": "gzip"}
    for token, reason in [
        (None, "TOKEN_MISSING"),
        ("not-a-token-of-this-service", "TOKEN_UNKNOWN"),
    ]:
        answer = await post(port, f"{SERVICE}/EnqueueMessage", {**unary, **auth(token)}, bomb)
        assert answer.status == 401
        assert unary_error(answer) == ("unauthenticated", reason)
        for protocol, headers in STREAM_TYPES.items():
            request = pb.WatchLaneRequest(lane_id="x").SerializeToString()
            compression = {"connect": "connect-content-encoding", "grpc-web": "grpc-encoding"}
            answer = await post(
                port,
                f"{SERVICE}/WatchLane",
                {**headers, compression[protocol]: "gzip", **auth(token)},
                envelope(gzip.compress(request), flags=1),
            )
            assert stream_end(answer.body, protocol) == ("unauthenticated", reason), answer
    assert (work.decompressed, work.parsed) == (0, 0)
    # The hooks do count: the same body with a token is decompressed, then refused unparsed
    # for its count of blocks (see the next test).
    answer = await post(port, f"{SERVICE}/EnqueueMessage", {**unary, **auth(TOKEN_A)}, bomb)
    assert unary_error(answer) == ("invalid_argument", "TOO_MANY_CONTENT_BLOCKS")
    assert work.decompressed == 1


async def test_a_gzip_bomb_is_refused_without_inflating_past_the_limit(
    authed: tuple[RunningServer, Stub], work: Work
) -> None:
    running, _ = authed
    port = http_port(running)
    # 64 KiB on the wire, 64 MiB inflated.
    bomb = gzip.compress(b'{"laneId":"' + b"x" * (64 << 20) + b'"}', compresslevel=9)
    assert len(bomb) < 128 << 10
    unary = {"content-type": "application/json", "content-encoding": "gzip", **auth(TOKEN_A)}
    answer = await post(port, f"{SERVICE}/GetLaneSnapshot", unary, bomb)
    assert answer.status == 429
    assert unary_error(answer) == ("resource_exhausted", "REQUEST_TOO_LARGE")
    headers = {**STREAM_TYPES["connect"], "connect-content-encoding": "gzip", **auth(TOKEN_A)}
    answer = await post(port, f"{SERVICE}/WatchLane", headers, envelope(bomb, flags=1))
    assert stream_end(answer.body, "connect") == ("resource_exhausted", "REQUEST_TOO_LARGE")
    assert len(work.inflated) == 2
    assert max(work.inflated) <= MAX_MESSAGE_BYTES + 1  # it stopped one byte past the limit
    assert work.parsed == 0


async def test_a_json_request_over_a_count_is_refused_before_protobuf_reads_it(
    authed: tuple[RunningServer, Stub], work: Work
) -> None:
    running, stub = authed
    port = http_port(running)
    lane_id = new_lane_id("counts")
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id), metadata=[*auth_md(TOKEN_A)])
    request = pb.EnqueueMessageRequest(lane_id=lane_id, message=user(""))
    request.message.user.content.extend(list(request.message.user.content) * MAX_CONTENT_BLOCKS)
    # The gRPC port's answer to the same request, binary.
    with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
        await stub.EnqueueMessage(request, metadata=[*auth_md(TOKEN_A)])
    text = json_format.MessageToJson(request, indent=None).encode()
    headers = {"content-type": "application/json", **auth(TOKEN_A)}
    parsed_before = work.parsed
    answer = await post(port, f"{SERVICE}/EnqueueMessage", headers, text)
    assert unary_error(answer) == ("invalid_argument", error_reason(over_grpc.value))
    assert error_reason(over_grpc.value) == "TOO_MANY_CONTENT_BLOCKS"
    assert work.parsed == parsed_before  # refused while its tokens were counted
    # A million empty blocks (3 MiB) likewise: counting stops one past the limit.
    flood = b'{"laneId":"l","message":{"user":{"content":[' + b",".join([b"{}"] * 1_000_000)
    answer = await post(port, f"{SERVICE}/EnqueueMessage", headers, flood + b"]}}}")
    assert unary_error(answer) == ("invalid_argument", "TOO_MANY_CONTENT_BLOCKS")
    assert work.parsed == parsed_before


def auth_md(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def test_large_json_bodies_wait_their_namespace_s_turn_within_a_bound(
    authed: tuple[RunningServer, Stub], monkeypatch: pytest.MonkeyPatch
) -> None:
    running, _ = authed
    port = http_port(running)
    # Every parse waits until the test lets them go: the namespace's turns fill up.
    gate = threading.Event()
    started = threading.Semaphore(0)
    to_bytes = json_parses.json_to_bytes

    def held(text: bytes, request_type: Any) -> bytes:
        started.release()
        gate.wait(60)
        return to_bytes(text, request_type)

    monkeypatch.setattr(json_parses, "json_to_bytes", held)
    body = json.dumps({"pageSize": 5, "padding": "x" * 4096}).encode()

    def list_lanes(token: str) -> Any:
        headers = {"content-type": "application/json", **auth(token)}
        return asyncio.create_task(post(port, f"{SERVICE}/ListLanes", headers, body))

    admitted = PARSES_PER_NAMESPACE + WAITING_PER_NAMESPACE
    try:
        first = [list_lanes(TOKEN_A) for _ in range(admitted)]
        for _ in range(PARSES_PER_NAMESPACE):
            assert await asyncio.to_thread(started.acquire, True, 30)
        # Past its turns and its places in line the namespace is refused at once, while
        # every parse it has holds (so whatever answers now is a refusal).
        more = [list_lanes(TOKEN_A) for _ in range(5)]
        done, _ = await asyncio.wait(more, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        (refused, *_) = [task.result() for task in done]
        assert unary_error(refused) == ("resource_exhausted", "TOO_MANY_JSON_REQUESTS")
        retry = [d for d in refused.json()["details"] if d["type"] == "google.rpc.RetryInfo"]
        assert retry, refused.json()
        # Another namespace is not refused meanwhile: it waits for a thread.
        other = list_lanes(TOKEN_B)
    finally:
        gate.set()
    answers = await asyncio.gather(*first, *more)
    statuses = sorted(answer.status for answer in answers)
    assert statuses == [200] * admitted + [429] * 5
    assert (await other).status == 200


# -- R2: slow watchers are cut as on the gRPC port ---------------------------------------


async def tool_call_lane(stub: Stub) -> tuple[str, str]:
    """A lane whose run has a tool call in progress, for large progress updates."""
    lane_id = new_lane_id("slow-http")
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    run = await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
    turn = await stub.StartTurn(pb.StartTurnRequest(lane_id=lane_id, operation_id=run.operation_id))
    await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            lane_id=lane_id,
            operation_id=run.operation_id,
            turn_id=turn.turn_id,
            message=assistant(tool_call("big", "t", {})),
        )
    )
    await stub.StartToolCall(
        pb.StartToolCallRequest(
            lane_id=lane_id, operation_id=run.operation_id, tool_call_id="big", arguments_json="{}"
        )
    )
    return lane_id, run.operation_id


async def progress(stub: Stub, lane_id: str, run_id: str, updates: int) -> None:
    """``updates`` progress reports of 500 KB each (within the 512 KiB payload limit)."""
    for _ in range(updates):
        await stub.UpdateToolCall(
            pb.UpdateToolCallRequest(
                lane_id=lane_id,
                operation_id=run_id,
                tool_call_id="big",
                partial_result=result("x" * 500_000),
            )
        )


async def stalled_watcher(
    port: int, lane_id: str, protocol: str, receive_buffer: int | None = 4096
) -> RawHttp:
    """A watcher that read its response's head (and then stops reading: with a small window,
    the server's writes soon wait)."""
    client = await RawHttp.open(port, receive_buffer=receive_buffer)
    request = envelope(pb.WatchLaneRequest(lane_id=lane_id).SerializeToString())
    await client.request(f"{SERVICE}/WatchLane", STREAM_TYPES[protocol], request)
    head = await client.response()
    assert head.status_code == 200
    return client


async def admitted(stub: Stub, lane_id: str, within: float) -> Any:
    """A gRPC watcher of ``lane_id`` that got its snapshot, retried while the lane is full."""
    async with asyncio.timeout(within):
        while True:
            call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
            try:
                await call.read()
                return call
            except grpc.aio.AioRpcError as error:
                assert error_reason(error) == "TOO_MANY_WATCHERS", error
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("protocol", ["connect", "grpc-web"])
async def test_a_stalled_watcher_is_cut_at_the_deadline_and_its_slot_freed(
    session_database_url: str, protocol: str
) -> None:
    # Two slots, both taken by clients that stop reading; a deadline far above any
    # scheduling hiccup of a loaded machine.
    settings = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        watch_write_deadline_seconds=2.0,
        max_watchers_per_lane=2,
    )
    async with serve(settings) as (running, stub):
        port = http_port(running)
        lane_id, run_id = await tool_call_lane(stub)
        reads_later = await stalled_watcher(port, lane_id, protocol)
        never_reads = await stalled_watcher(port, lane_id, protocol)
        # 15 MB: more than both sockets' buffers hold, so the server's writes wait.
        await progress(stub, lane_id, run_id, 30)
        # Both are cut at the deadline: a new watcher gets in where the lane was full.
        third = await admitted(stub, lane_id, within=60)
        third.cancel()
        # The client that reads again finds what was buffered for it, then WATCHER_TOO_SLOW.
        async with asyncio.timeout(60):  # a guard: hypercorn's send used to wait forever
            body = await read_body(reads_later)
        assert stream_end(body, protocol) == ("resource_exhausted", "WATCHER_TOO_SLOW")
        frames = [flags for flags, _ in envelopes(body) if flags == 0]
        assert 1 <= len(frames) < 30 + 1  # the snapshot and some updates, not all of them
        reads_later.close()

        # The one that never reads has its connection dropped, and what it buffered with it.
        assert running.http is not None
        connections = running.http.connections

        async def dropped() -> bool:
            return connections.open == 0

        await until(dropped, seconds=60, what="the stalled connection dropped")
        assert await never_reads.closed_by_server()
        never_reads.close()


# -- R6: DNS rebinding ----------------------------------------------------------------------


async def get(port: int, path: str, headers: dict[str, str]) -> Answer:
    client = await RawHttp.open(port)
    try:
        await client.request(path, headers, method="GET")
        return await client.answer()
    finally:
        client.close()


async def test_with_auth_off_only_loopback_hosts_are_served(session_database_url: str) -> None:
    settings = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        http_allowed_hosts=("devbox.local",),
    )
    async with serve(settings) as (running, _):
        port = http_port(running)
        snapshot = f"{SERVICE}/GetLaneSnapshot"
        json_body = {"content-type": "application/json"}
        served = [
            {"host": f"127.0.0.1:{port}"},
            {"host": f"localhost:{port}"},
            {"host": "localhost"},
            {"host": f"[::1]:{port}"},
            {"host": f"127.0.0.1:{port}", "origin": f"http://localhost:{port}"},
            {"host": "devbox.local:8080", "origin": "http://DevBox.local:8080"},  # the setting
        ]
        refused = [
            {"host": f"rebound.example:{port}"},  # a page whose name now resolves here
            {"host": f"127.0.0.1:{port}", "origin": "http://rebound.example"},
            {"host": f"127.0.0.1:{port}", "origin": "null"},
            {"host": "localhost.rebound.example"},
        ]
        for headers in served:
            answer = await post(port, snapshot, {**json_body, **headers}, b'{"laneId":"none"}')
            assert unary_error(answer) == ("not_found", "LANE_NOT_FOUND"), headers
            assert (await get(port, "/", headers)).status == 200, headers
        for headers in refused:
            answer = await post(port, snapshot, {**json_body, **headers}, b'{"laneId":"none"}')
            assert answer.status == 403, headers
            assert unary_error(answer) == ("permission_denied", "HOST_NOT_ALLOWED"), headers
            page = await get(port, "/", headers)
            assert page.status == 403 and b"<html" not in page.body.lower(), headers
            assert unary_error(page) == ("permission_denied", "HOST_NOT_ALLOWED")
            # A stream too, in its protocol (gRPC-Web: the status in a trailers-only answer).
            watch = envelope(pb.WatchLaneRequest(lane_id="none").SerializeToString())
            answer = await post(
                port, f"{SERVICE}/WatchLane", {**STREAM_TYPES["connect"], **headers}, watch
            )
            assert stream_end(answer.body, "connect") == ("permission_denied", "HOST_NOT_ALLOWED")


async def test_with_auth_on_any_host_is_served(authed: tuple[RunningServer, Stub]) -> None:
    # A token is no credential a browser adds by itself: a rebound page has none to send.
    running, _ = authed
    port = http_port(running)
    headers = {"host": "lanes.example.com", "origin": "https://lanes.example.com"}
    answer = await post(
        port,
        f"{SERVICE}/GetLaneSnapshot",
        {"content-type": "application/json", **headers, **auth(TOKEN_A)},
        b'{"laneId":"none"}',
    )
    assert unary_error(answer) == ("not_found", "LANE_NOT_FOUND")
    assert (await get(port, "/", headers)).status == 200


# -- R9: timeouts and a connection cap ----------------------------------------------------


async def test_a_trickled_body_is_cut_after_the_body_timeout(session_database_url: str) -> None:
    settings = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        http_body_timeout_seconds=1.0,
    )
    async with serve(settings) as (running, _):
        port = http_port(running)
        client = await RawHttp.open(port)
        headers = {
            "host": "127.0.0.1",
            "content-type": "application/json",
            "content-length": str(1 << 20),  # a megabyte promised ...
        }
        await client.send(
            h11.Request(method="POST", target=f"{SERVICE}/ListLanes", headers=list(headers.items()))
        )

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError, h11.LocalProtocolError):
                for _ in range(1 << 20):  # ... a byte at a time: days, were it not cut
                    client.writer.write(b" ")
                    await client.writer.drain()
                    await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        try:
            async with asyncio.timeout(60):  # a guard against a hang, not a measure
                answer = await client.answer()
                assert unary_error(answer) == ("deadline_exceeded", "BODY_TIMEOUT")
                assert await client.closed_by_server()
        finally:
            trickling.cancel()
            client.close()


async def test_an_idle_connection_is_closed_after_the_idle_timeout(
    session_database_url: str,
) -> None:
    settings = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        http_idle_timeout_seconds=1.0,
    )
    async with serve(settings) as (running, _):
        port = http_port(running)
        # HTTP/2 with prior knowledge: the preface and empty settings, then nothing.
        idle_h2 = await RawHttp.open(port)
        empty_settings = b"\x00\x00\x00" + b"\x04" + b"\x00" + b"\x00\x00\x00\x00"
        idle_h2.writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + empty_settings)
        # HTTP/1.1 whose headers never end.
        slow_headers = await RawHttp.open(port)
        slow_headers.writer.write(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ")
        try:
            async with asyncio.timeout(60):  # a guard against a hang, not a measure
                assert await idle_h2.closed_by_server()
                assert await slow_headers.closed_by_server()
        finally:
            idle_h2.close()
            slow_headers.close()


async def test_connections_over_the_cap_are_closed(session_database_url: str) -> None:
    settings = Settings(
        database_url=session_database_url,
        http_listen="127.0.0.1:0",
        http_max_connections=2,
    )
    async with serve(settings) as (running, _):
        port = http_port(running)
        assert running.http is not None
        connections = running.http.connections
        held = [await RawHttp.open(port) for _ in range(2)]

        async def both_open() -> bool:
            return connections.open == 2

        await until(both_open, what="two connections open")
        over = await RawHttp.open(port)
        async with asyncio.timeout(60):  # a guard against a hang, not a measure
            assert await over.closed_by_server()
        over.close()
        # The held ones are served; once one goes, a new connection is too.
        await held[0].request("/", {}, method="GET")
        assert (await held[0].answer()).status == 200
        held[1].close()

        async def one_open() -> bool:
            return connections.open == 1

        await until(one_open, what="the closed connection gone")
        assert (await get(port, "/", {})).status == 200
        held[0].close()


# -- R11: a quiet shutdown -----------------------------------------------------------------


async def test_a_shutdown_with_streams_open_logs_no_error(
    session_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(database_url=session_database_url, http_listen="127.0.0.1:0")
    async with serve(settings) as (running, stub):
        port = http_port(running)
        lane_id, run_id = await tool_call_lane(stub)
        # Watchers that read, over Connect and gRPC-Web, and two that stopped reading with
        # megabytes on their way (their writes wait when the server stops).
        reading = [await stalled_watcher(port, lane_id, p, None) for p in STREAM_TYPES]
        bodies = [asyncio.create_task(read_body(client)) for client in reading]
        stalled = [await stalled_watcher(port, lane_id, p) for p in STREAM_TYPES]
        await progress(stub, lane_id, run_id, 20)
        caplog.set_level(logging.DEBUG)
        async with asyncio.timeout(60):  # hypercorn's own shutdown waited for them forever
            await running.stop(grace=5.0)
            ends = [stream_end(await body, p) for body, p in zip(bodies, STREAM_TYPES, strict=True)]
        assert ends == [("unavailable", "SERVER_SHUTTING_DOWN")] * 2
        for client in [*reading, *stalled]:
            client.close()
    errors = [
        (record.name, record.getMessage())
        for record in caplog.records
        if record.levelno >= logging.ERROR or record.exc_info
    ]
    assert errors == []
