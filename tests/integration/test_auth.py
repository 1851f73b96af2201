"""Bearer-token auth with namespaces, on a real server with tokens configured.

- every LaneService RPC refuses a call without a token, with an unknown token or with another
  scheme (UNAUTHENTICATED, before the request is even decoded);
- a token admits its caller to its own namespace's lanes only: for every RPC, a lane of another
  namespace answers exactly as a lane that exists nowhere, and is left untouched;
- lane ids, operation ids and request ids are per namespace: two namespaces may both use them;
- watchers of one namespace never see another's commits, locally or through NOTIFY;
- without tokens the service serves loopback only, and says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import message_factory
from google.protobuf.message import Message
from lane.client.commands import call
from lane.client.connect import open_channel
from lane.client.errors import LaneError, status_error
from lane.client.session import LaneSession
from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from lane.server.api.auth import TokenError, parse_tokens
from lane.server.app.config import ConfigError, Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import (
    Probe,
    assistant,
    error_info,
    leased_run,
    new_lane_id,
    result,
    text,
    user,
)
from tests.support.clock import OffsetClock
from tests.support.servers import lane_stubs

Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (typing only)
SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
METHODS = [method.name for method in SERVICE.methods]
REQUEST_TYPES = {m.name: message_factory.GetMessageClass(m.input_type) for m in SERVICE.methods}

TOKEN_A = "token-for-team-a-0123456789"
TOKEN_A2 = "second-token-of-team-a-9876"
TOKEN_B = "token-for-team-b-0123456789"
TOKENS = {TOKEN_A: "team-a", TOKEN_A2: "team-a", TOKEN_B: "team-b"}


@dataclass
class AuthServer:
    running: RunningServer
    address: str
    #: The server's clock: moved forward to let a lease lapse without waiting.
    clock: OffsetClock

    def channel(self, token: str | None) -> grpc.aio.Channel:
        return open_channel(self.address, token=token)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def auth_server(session_database_url: str, store: Any) -> AsyncIterator[AuthServer]:
    settings = Settings(database_url=session_database_url, auth_tokens=TOKENS)
    clock = OffsetClock()
    running = await start_server(settings, listen="127.0.0.1:0", clock=clock)
    try:
        yield AuthServer(running, f"127.0.0.1:{running.port}", clock)
    finally:
        await running.stop(grace=0.5)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stubs(auth_server: AuthServer) -> AsyncIterator[tuple[Stub, Stub]]:
    """Stubs of team-a and team-b."""
    async with lane_stubs(auth_server.channel(TOKEN_A), auth_server.channel(TOKEN_B)) as (a, b):
        yield a, b


# -- a lane in mid-run, and a request aimed at it for every RPC ---------------------------------


@dataclass
class MidRun:
    """Team-a's lane with a leased run, an open turn and one started tool call."""

    lane_id: str
    operation_id: str
    turn_id: str
    lease_token: int
    entry_id: str


async def mid_run(stub: Stub, lane_id: str | None = None) -> MidRun:
    probe = Probe(stub, lane_id or new_lane_id("auth"))
    run = await leased_run(stub, probe, "c1")
    await run.call("c1").start({"c": "c1"})
    (turn,) = [e.turn_start.turn_id for e in probe.events if e.HasField("turn_start")]
    entry_id = probe.snapshot.transcript[0].id
    return MidRun(probe.lane_id, run.operation_id, turn, run.lease_token, entry_id)


def aimed_request(method: str, run: MidRun, lane_id: str) -> Message:
    """A well-formed ``method`` request about ``run`` (naming ``lane_id``): each passes
    validation, so what answers it is the lane lookup."""
    ids: dict[str, Any] = {}
    fields = REQUEST_TYPES[method].DESCRIPTOR.fields_by_name
    for name, value in (
        ("lane_id", lane_id),
        ("operation_id", run.operation_id),
        ("turn_id", run.turn_id),
        ("lease_token", run.lease_token),
        ("tool_call_id", "c1"),
        ("request_id", f"req-{method}"),
    ):
        if name in fields:
            ids[name] = value
    request: Any = REQUEST_TYPES[method](**ids)
    extra: dict[str, dict[str, Any]] = {
        "ListLanes": {},
        "UpdateLaneConfig": {"thinking_level": snapshot_pb2.THINKING_LEVEL_HIGH},
        "EnqueueMessage": {"kind": snapshot_pb2.QUEUE_KIND_FOLLOW_UP, "message": user("more")},
        "StartRun": {"prompt": [user("again")], "operation_id": "op-new"},
        "EndRun": {"status": snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED},
        "SettleAssistantMessage": {
            "message": assistant(text("ok"), stop=messages_pb2.STOP_REASON_STOP)
        },
        "RecordUsage": {"usage": messages_pb2.Usage(input=1, total_tokens=1)},
        "StartToolCall": {"arguments_json": "{}"},
        "UpdateToolCall": {"partial_result": result("half")},
        "AcquireOperation": {"driver_id": "thief", "lease_seconds": 30},
        "RenewLease": {"lease_seconds": 30},
        "ScheduleRetry": {"max_attempts": 3, "delay_ms": 10, "error_message": "e"},
        "SuspendRun": {"deferred": snapshot_pb2.DeferredState(handle_json="{}")},
        "StartCompaction": {"reason": 1, "operation_id": "op-compact"},
        "EndCompaction": {"status": snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED},
        "NavigateLane": {"target_entry_id": run.entry_id},
        "ReportFault": {"code": "boom", "message": "m"},
        "ReportHandlerError": {"error": "oops", "hook": "before_tool"},
    }
    for name, value in extra.get(method, {}).items():
        if isinstance(value, list):
            getattr(request, name).extend(value)
        elif isinstance(value, Message):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    if method == "StageToolOutcome":
        request.executed.result.CopyFrom(result("done"))
    if method == "AppendAssistantStream":
        request.partials.add(message=assistant(text("o"), stop=messages_pb2.STOP_REASON_PENDING))
    if method == "CompactRun":
        request.entry.summary = "s"
        request.reason = 1
    if method == "SetLaneValue":
        request.session_name.name = "renamed"
    if method == "ImportLane":
        request.data = b"not an export"  # refused after auth and the lane lookup it needs
    if method == "DriveLane":
        # A session: one command in it, aimed like the unary request of the same method.
        request.sequence = 7
        request.start_turn.CopyFrom(aimed_request("StartTurn", run, lane_id))
    aimed: Message = request
    return aimed


async def answer_of(stub: Stub, method: str, request: Any) -> tuple[str, str, str, str]:
    """(code, reason, message, metadata) of ``request``'s answer; code 'OK' when accepted."""
    try:
        if method in ("WatchLane", "WatchLanes"):
            call: Any = getattr(stub, method)(request)
            await asyncio.wait_for(call.read(), 5)
            call.cancel()
        elif method == "ExportLane":
            exported = [piece async for piece in stub.ExportLane(request, timeout=10)]
            assert exported
        elif method == "ImportLane":

            async def pieces() -> AsyncIterator[Any]:
                yield request

            await stub.ImportLane(pieces(), timeout=10)
        elif method == "DriveLane":
            # The stream's own refusal (auth) ends it; a command's is its answer's error.
            call = stub.DriveLane()
            try:
                await call.write(request)
                answer = await asyncio.wait_for(call.read(), 5)
            finally:
                call.cancel()
            assert answer.sequence == request.sequence
            if answer.HasField("error"):
                status = status_error(answer.error)
                metadata = ",".join(f"{k}={v}" for k, v in sorted(status.metadata.items()))
                return status.code.name, status.reason, status.message, metadata
        else:
            await getattr(stub, method)(request, timeout=10)
    except grpc.aio.AioRpcError as error:
        info = error_info(error)
        metadata = ",".join(f"{k}={v}" for k, v in sorted(info.metadata.items()))
        return error.code().name, info.reason, error.details() or "", metadata
    return "OK", "", "", ""


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("token", "reason"),
    [(None, "TOKEN_MISSING"), ("not-a-token-of-this-service", "TOKEN_UNKNOWN")],
)
async def test_every_rpc_refuses_a_missing_or_unknown_token(
    auth_server: AuthServer, stubs: tuple[Stub, Stub], method: str, token: str | None, reason: str
) -> None:
    stub_a, _ = stubs
    run = await mid_run(stub_a)
    before = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=run.lane_id))
    async with auth_server.channel(token) as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        code, got_reason, _, _ = await answer_of(
            stub, method, aimed_request(method, run, run.lane_id)
        )
    assert (code, got_reason) == ("UNAUTHENTICATED", reason)
    after = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=run.lane_id))
    assert after == before


@pytest.mark.parametrize("header", [f"Basic {TOKEN_A}", TOKEN_A, f"Bearer {TOKEN_A}x", "Bearer"])
async def test_a_malformed_authorization_header_is_unknown(
    auth_server: AuthServer, header: str
) -> None:
    async with grpc.aio.insecure_channel(auth_server.address) as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ListLanes(pb.ListLanesRequest(), metadata=(("authorization", header),))
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(raised.value).reason == "TOKEN_UNKNOWN"


async def test_undecodable_bytes_without_a_token_are_unauthenticated(
    auth_server: AuthServer,
) -> None:
    # Authentication comes first: an anonymous caller learns nothing, not even about parsing.
    async with grpc.aio.insecure_channel(auth_server.address) as channel:
        call: Any = channel.unary_unary(f"/{SERVICE.full_name}/GetLaneSnapshot")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call(b"\xff\xff\xff")
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


# ImportLane creates a lane in the caller's namespace: see test_an_import_lands_in_the_callers_...
@pytest.mark.parametrize(
    "method",
    [m for m in METHODS if m not in ("CreateLane", "ListLanes", "WatchLanes", "ImportLane")],
)
async def test_another_namespaces_lane_answers_as_a_missing_one(
    stubs: tuple[Stub, Stub], method: str
) -> None:
    stub_a, stub_b = stubs
    run = await mid_run(stub_a)
    before = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=run.lane_id))
    nowhere = new_lane_id("nowhere")

    foreign = await answer_of(stub_b, method, aimed_request(method, run, run.lane_id))
    missing = await answer_of(stub_b, method, aimed_request(method, run, nowhere))

    assert foreign[0] == "NOT_FOUND", foreign
    assert foreign == tuple(part.replace(nowhere, run.lane_id) for part in missing)
    after = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=run.lane_id))
    assert after == before
    # And the owner is admitted: the same kind of request reaches the lane (no NOT_FOUND).
    own = await answer_of(stub_a, method, aimed_request(method, run, run.lane_id))
    assert own[0] != "NOT_FOUND" or own[1] not in ("LANE_NOT_FOUND", "ENTRY_NOT_FOUND"), own


async def test_every_rpc_is_covered_by_the_aimed_requests() -> None:
    # A new RPC must join the tests above: each needs an aimed request here.
    run = MidRun("l", "o", "t", 1, "e")
    for method in METHODS:
        assert aimed_request(method, run, "l").DESCRIPTOR.name == f"{method}Request"


async def test_a_session_answers_as_unary_calls_do_on_auth(
    auth_server: AuthServer, stubs: tuple[Stub, Stub]
) -> None:
    stub_a, stub_b = stubs
    run = await mid_run(stub_a)
    methods = ["GetLaneSnapshot", "StartTurn", "StartToolCall", "RenewLease", "EndRun"]
    # Another namespace's session: each command answers as a lane that does not exist.
    async with LaneSession(stub_b) as session:
        for method in methods:
            with pytest.raises(LaneError) as refused:
                await session.call(aimed_request(method, run, run.lane_id))
            assert (refused.value.code, refused.value.reason) == (
                grpc.StatusCode.NOT_FOUND,
                "LANE_NOT_FOUND",
            ), method
        assert session.streams_opened == 1
    # Without a token, or with an unknown one, the stream is refused: every command gets the
    # unary call's UNAUTHENTICATED error.
    for token, reason in (
        (None, "TOKEN_MISSING"),
        ("not-a-token-of-this-service", "TOKEN_UNKNOWN"),
    ):
        async with auth_server.channel(token) as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            with pytest.raises(LaneError) as unary_refusal:
                request: Any = aimed_request("StartTurn", run, run.lane_id)
                await call(stub.StartTurn, request)
            async with LaneSession(stub) as session:
                with pytest.raises(LaneError) as session_refusal:
                    await session.call(aimed_request("StartTurn", run, run.lane_id))
        assert repr(session_refusal.value) == repr(unary_refusal.value)
        assert session_refusal.value.reason == reason


async def test_namespaces_share_ids_without_meeting(stubs: tuple[Stub, Stub]) -> None:
    stub_a, stub_b = stubs
    lane_id = new_lane_id("shared")
    run_a = await mid_run(stub_a, lane_id)
    # Team-b creates a lane with the same id: a new lane of its own, not team-a's.
    created = await stub_b.CreateLane(pb.CreateLaneRequest(lane_id=lane_id, request_id="r1"))
    assert created.created
    # The same operation id in both namespaces (ids are unique per namespace).
    started_b = await stub_b.StartRun(
        pb.StartRunRequest(
            lane_id=lane_id, operation_id=run_a.operation_id, prompt=[user("b")], request_id="r2"
        )
    )
    assert started_b.operation_id == run_a.operation_id
    snapshot_a = (await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
    snapshot_b = (await stub_b.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
    assert [e.message.message.user.content[0].text.text for e in snapshot_b.transcript] == ["b"]
    assert snapshot_a.transcript[0].message.message.user.content[0].text.text == "go"
    assert snapshot_a.operation.running_tools[0].WhichOneof("state") == "running"
    assert not snapshot_b.operation.running_tools
    # A request id team-a used answers team-b's own request, not team-a's stored answer.
    again = await stub_b.CreateLane(pb.CreateLaneRequest(lane_id=lane_id, request_id="r1"))
    assert again == created
    # Listing shows each namespace its own lanes.
    listed_a = {
        s.lane_id for s in (await stub_a.ListLanes(pb.ListLanesRequest(page_size=1000))).lanes
    }
    listed_b = {
        s.lane_id for s in (await stub_b.ListLanes(pb.ListLanesRequest(page_size=1000))).lanes
    }
    assert lane_id in listed_a and lane_id in listed_b
    assert not any(lane.startswith("auth-") for lane in listed_b)


async def test_watch_lanes_follows_the_callers_namespace_only(stubs: tuple[Stub, Stub]) -> None:
    stub_a, stub_b = stubs
    prefix = new_lane_id("follow")
    await stub_a.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-a"))
    await stub_b.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-b"))
    call: Any = stub_b.WatchLanes(pb.WatchLanesRequest(lane_id_prefix=prefix))
    try:
        listing = await asyncio.wait_for(call.read(), 10)
        assert listing.listing_complete
        assert [line.lane_id for line in listing.lanes] == [f"{prefix}-b"]
        # team-a's commits never reach team-b's stream; team-b's own do.
        await stub_a.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-a2"))
        await LaneScript(stub_a, f"{prefix}-a").start_run("go")
        await LaneScript(stub_b, f"{prefix}-b").start_run("go")
        change = await asyncio.wait_for(call.read(), 10)
        assert [line.lane_id for line in change.lanes] == [f"{prefix}-b"]
    finally:
        call.cancel()


async def test_tokens_of_one_namespace_reach_the_same_lanes(
    auth_server: AuthServer, stubs: tuple[Stub, Stub]
) -> None:
    stub_a, _ = stubs
    run = await mid_run(stub_a)
    async with auth_server.channel(TOKEN_A2) as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        response = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=run.lane_id))
    assert response.snapshot.operation.id == run.operation_id


async def _next_event_group(call: Any, within: float) -> Any:
    while True:
        message = await asyncio.wait_for(call.read(), within)
        if message.WhichOneof("item") == "event_group":
            return message.event_group


@pytest.mark.parametrize("notify", [False, True], ids=["local", "notify"])
async def test_watchers_see_only_their_namespaces_lane(
    auth_server: AuthServer, session_database_url: str, stubs: tuple[Stub, Stub], notify: bool
) -> None:
    stub_a, stub_b = stubs
    lane_id = new_lane_id("watched")
    lane_a, lane_b = [await LaneScript.create(stub, lane_id) for stub in (stub_a, stub_b)]
    # With notify, the watchers sit on a second server: commits reach them by NOTIFY.
    second = None
    watch_stubs: tuple[Any, ...] = (stub_a, stub_b)
    channels: list[grpc.aio.Channel] = []
    if notify:
        settings = Settings(
            database_url=session_database_url, auth_tokens=TOKENS, poll_interval_seconds=60
        )
        second = await start_server(settings, listen="127.0.0.1:0")
        await second.hub.listening.wait()
        address = f"127.0.0.1:{second.port}"
        channels = [open_channel(address, token=TOKEN_A), open_channel(address, token=TOKEN_B)]
        watch_stubs = tuple(lane_service_pb2_grpc.LaneServiceStub(c) for c in channels)
    try:
        watch_a: Any = watch_stubs[0].WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        watch_b: Any = watch_stubs[1].WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        head_a = (await watch_a.read()).snapshot.snapshot.revision
        head_b = (await watch_b.read()).snapshot.snapshot.revision
        await lane_a.enqueue("for a", snapshot_pb2.QUEUE_KIND_FOLLOW_UP)
        group = await _next_event_group(watch_a, 10)
        assert group.events[0].revision == head_a + 1
        # Team-b's watcher hears nothing of it: its next message is its own lane's next commit.
        await lane_b.enqueue("for b", snapshot_pb2.QUEUE_KIND_FOLLOW_UP)
        group_b = await _next_event_group(watch_b, 10)
        assert group_b.events[0].revision == head_b + 1
        queued = group_b.events[0].queue_update.queues
        assert [item.message.user.content[0].text.text for item in queued] == ["for b"]
        watch_a.cancel()
        watch_b.cancel()
    finally:
        for channel in channels:
            await channel.close()
        if second is not None:
            await second.stop(grace=0.5)


# -- configuration -----------------------------------------------------------------------------


def test_tokens_parse_from_pairs_and_lines() -> None:
    text = f"team-a:{TOKEN_A}, team-b:{TOKEN_B}\n# a comment\nteam-a:{TOKEN_A2}  # trailing\n"
    assert parse_tokens(text) == TOKENS


@pytest.mark.parametrize(
    "text",
    [
        TOKEN_A,  # no namespace
        f"team/a:{TOKEN_A}",  # '/' is not a namespace character
        f":{TOKEN_A}",
        "team-a:short",  # under 16 characters
        f"team-a:{TOKEN_A} team-b:{TOKEN_A}",  # one token, two namespaces
    ],
)
def test_bad_token_configurations_are_refused(text: str) -> None:
    with pytest.raises(TokenError):
        parse_tokens(text)


def test_settings_read_tokens_from_the_environment_and_a_file(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# team b\nteam-b:{TOKEN_B}\n")
    settings = Settings.from_env(
        {
            "LANE_AUTH_TOKENS": f"team-a:{TOKEN_A},team-a:{TOKEN_A2}",
            "LANE_AUTH_TOKENS_FILE": str(tokens_file),
            "LANE_LISTEN": "0.0.0.0:50051",
        }
    )
    assert dict(settings.auth_tokens) == TOKENS
    assert TOKEN_A not in repr(settings)


def test_a_bad_token_setting_names_the_variable_and_hides_the_value() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"LANE_AUTH_TOKENS": "team-a:short-secret"})
    assert raised.value.variable == "LANE_AUTH_TOKENS"
    assert "short-secret" not in str(raised.value)


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "example.com:50051"])
def test_without_tokens_only_loopback_is_allowed(listen: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"LANE_LISTEN": listen})
    assert raised.value.variable == "LANE_LISTEN"
    assert "LANE_AUTH_TOKENS" in str(raised.value)


@pytest.mark.parametrize("listen", ["127.0.0.1:50051", "127.0.0.2:1", "[::1]:50051", "localhost:1"])
def test_without_tokens_loopback_is_allowed(listen: str) -> None:
    assert Settings.from_env({"LANE_LISTEN": listen}).auth_tokens == {}


async def test_start_server_refuses_a_non_loopback_address_without_tokens(
    session_database_url: str,
) -> None:
    with pytest.raises(ConfigError):
        await start_server(session_database_url, listen="0.0.0.0:0")


async def test_an_open_service_says_so_at_start_up(
    session_database_url: str, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="lane.server.app.server"):
        running = await start_server(session_database_url)
        await running.stop(grace=0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("auth is OFF" in message for message in warnings), warnings


# -- clients -----------------------------------------------------------------------------------


async def test_the_typescript_client_sends_its_token(
    auth_server: AuthServer, stubs: tuple[Stub, Stub]
) -> None:
    from tests.integration.test_typescript_watcher import NodeFollower

    stub_a, _ = stubs
    run = await mid_run(stub_a)
    head = (await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=run.lane_id))).snapshot
    port = auth_server.running.port
    admitted = await NodeFollower.start(run.lane_id, port, target=head.revision, token=TOKEN_A)
    view = await admitted.reach(head.revision)
    assert view.snapshot == head
    assert await admitted.exit_status() == 0
    # Team-b's token: the lane is not found, and the follower gives up (exit status 1).
    refused = await NodeFollower.start(run.lane_id, port, target=head.revision, token=TOKEN_B)
    assert await refused.exit_status() == 1
    assert "LANE_NOT_FOUND" in refused.stderr or "not_found" in refused.stderr.lower()
    anonymous = await NodeFollower.start(run.lane_id, port, target=head.revision)
    assert await anonymous.exit_status() == 1
    assert "unauthenticated" in anonymous.stderr.lower()


async def test_the_lane_cli_reads_its_token_from_the_environment(
    auth_server: AuthServer, stubs: tuple[Stub, Stub]
) -> None:
    stub_a, _ = stubs
    run = await mid_run(stub_a)

    async def lane_cli(token: str | None) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lane.client",
            "snapshot",
            run.lane_id,
            "--target",
            auth_server.address,
            env={**os.environ, "LANE_TOKEN": token or ""},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    status, out, _ = await lane_cli(TOKEN_A)
    assert status == 0 and run.operation_id in out
    status, _, err = await lane_cli(TOKEN_B)
    assert status == 1 and "LANE_NOT_FOUND" in err
    status, _, err = await lane_cli(None)
    assert status == 1 and "TOKEN_MISSING" in err


async def test_the_reconciler_ends_abandoned_runs_in_every_namespace(
    auth_server: AuthServer, stubs: tuple[Stub, Stub]
) -> None:
    stub_a, _ = stubs
    lane = await LaneScript.create(stub_a, prefix="abandoned")
    lane_id = lane.lane_id
    started = await lane.start_run("hi", driver_id="d", lease_seconds=30)
    # The driver is gone; an abort is asked for: once the lease lapses the service ends the run.
    await started.abort()
    auth_server.clock.advance(30)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        request = pb.GetLaneSnapshotRequest(lane_id=lane_id)
        snapshot = (await stub_a.GetLaneSnapshot(request)).snapshot
        if not snapshot.HasField("operation"):
            break
        assert loop.time() < deadline, "the abandoned run was not reconciled"
        await asyncio.sleep(0.2)
    assert snapshot.last_result.operation_id == started.operation_id
    assert snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED


async def test_an_import_lands_in_the_callers_namespace(stubs: tuple[Stub, Stub]) -> None:
    stub_a, stub_b = stubs
    lane = await LaneScript.create(stub_a, prefix="exported")
    lane_id = lane.lane_id
    await lane.enqueue("a's", snapshot_pb2.QUEUE_KIND_NEXT_RUN)
    before = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    data = b"".join(
        [p.data async for p in stub_a.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))]
    )

    async def pieces() -> AsyncIterator[pb.ImportLaneRequest]:
        yield pb.ImportLaneRequest(lane_id=lane_id, data=data)

    # Team-b imports team-a's file under the same id: a lane of its own; a's is untouched, and
    # team-b deleting "its" lane leaves a's alone.
    await stub_b.ImportLane(pieces())
    theirs = await stub_b.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert theirs.snapshot.queues == before.snapshot.queues
    await stub_b.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
    after = await stub_a.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert after == before
    # Team-a importing under its own lane's id is refused: the id is in use.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub_a.ImportLane(pieces())
    assert (raised.value.code(), error_info(raised.value).reason) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "LANE_EXISTS",
    )
