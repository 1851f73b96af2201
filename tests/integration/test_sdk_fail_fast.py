"""The Python SDK against a service it cannot use: a closed port, an unknown host, TLS against a
plaintext service and the reverse, a refused token. Every entry point (``LaneClient``'s
commands and watch, ``Driver.run``, ``watch_lane`` on a bare stub) fails with a typed error
naming the target, the cause and the fix, instead of retrying for its whole retry budget: the
clients here retry for ever, so a client that did not fail fast would hang (the guard fails it).

Also: a connection that drops after the first contact is retried as the policy says, and the
error it gives up with says so; a lane left busy by a killed driver refuses the next run with
how to free it, and after ``lane abort`` the next run goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import grpc
import pytest
import pytest_asyncio
from lane.client import (
    Driver,
    LaneBusy,
    LaneClient,
    LaneError,
    RetryPolicy,
    Unauthenticated,
    watch_lane,
)
from lane.client.connect import open_channel, tls_credentials
from lane.client.model import ModelRequest, ScriptedModel, ScriptStep
from lane.client.reach import Unreachable
from lane.v1 import lane_service_pb2_grpc, messages_pb2

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import new_lane_id
from tests.integration.test_tls import Certificates, certificates, tls_service
from tests.support.driver_tools import open_operation_id, snapshot, until
from tests.support.servers import restartable

__all__ = ["certificates"]  # the fixture, used by the tests below

pytestmark = pytest.mark.asyncio(loop_scope="session")

T = TypeVar("T")

#: Retries that never give up: a client that does not fail fast hangs on them.
FOREVER = RetryPolicy(initial_backoff=0.05, max_backoff=0.2)
CONNECT_TIMEOUT = 2.0
TOKEN = "fail-fast-token-0123456789"


async def guarded(work: Awaitable[T]) -> T:
    """``work``, failed if it hangs: what the old clients did (a guard, not a timing check)."""
    try:
        return await asyncio.wait_for(work, 60)
    except TimeoutError:
        raise AssertionError("the client hung instead of failing fast") from None


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def first_view(views: Any) -> None:
    async with contextlib.aclosing(views) as stream:
        async for _ in stream:
            return


async def never_answers(request: ModelRequest) -> messages_pb2.AssistantMessage:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def failures(client: LaneClient) -> list[BaseException]:
    """What each entry point raises: a command, the client's watch, a driven run, and
    ``watch_lane`` on the client's bare stub."""
    lane = new_lane_id("fail-fast")
    raised: list[BaseException] = []
    attempts: list[Awaitable[Any]] = [
        client.create_lane(lane),
        first_view(client.watch(lane)),
        Driver(client, lane, retry_seconds=3600).run("hello", never_answers),
        first_view(watch_lane(client.stub, lane, retry=FOREVER, connect_timeout=CONNECT_TIMEOUT)),
    ]
    for attempt in attempts:
        with pytest.raises(Exception) as caught:
            await guarded(attempt)
        raised.append(caught.value)
    return raised


def assert_unreachable(errors: list[BaseException], target: str, cause: str, fix: str) -> None:
    for error in errors:
        assert isinstance(error, Unreachable), repr(error)
        assert error.code == grpc.StatusCode.UNAVAILABLE
        assert cause in error.cause, error
        assert fix in error.fix, error
        text = str(error)
        assert text.startswith("cannot reach the lane service") and fix in text
    # The client's own entry points name its target (a bare stub does not know it).
    for error in errors[:3]:
        assert f"at {target}:" in str(error)


@pytest_asyncio.fixture(loop_scope="session")
async def auth_server(session_database_url: str) -> AsyncIterator[RunningServer]:
    settings = Settings(database_url=session_database_url, auth_tokens={TOKEN: "team-ff"})
    running = await start_server(settings, listen="127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


def client_for(target: str, **options: Any) -> LaneClient:
    return LaneClient(target, retry=FOREVER, connect_timeout=CONNECT_TIMEOUT, **options)


async def test_a_closed_port_fails_fast_with_connection_refused() -> None:
    target = f"127.0.0.1:{closed_port()}"
    async with client_for(target) as client:
        errors = await failures(client)
    assert_unreachable(errors, target, "connection refused", "Is the service running (lane serve)?")


async def test_an_unknown_host_fails_fast() -> None:
    target = "no-such-host.invalid:50051"
    async with client_for(target) as client:
        errors = await failures(client)
    assert_unreachable(errors, target, "unknown host", "Check the host name")


async def test_tls_against_a_plaintext_service_fails_fast(
    lane_server: RunningServer, certificates: Certificates
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    credentials = tls_credentials(ca_file=certificates.ca_file)
    async with client_for(target, credentials=credentials) as client:
        errors = await failures(client)
    # The bare stub's watch knows nothing of the channel's TLS: it only checks the cause.
    assert_unreachable(errors[:3], target, "does not speak TLS", "Connect without TLS")
    assert isinstance(errors[3], Unreachable) and "does not speak TLS" in errors[3].cause


async def test_plaintext_against_a_tls_service_fails_fast(
    session_database_url: str, certificates: Certificates
) -> None:
    async with (
        tls_service(session_database_url, certificates, mutual=False) as target,
        client_for(target) as client,
    ):
        errors = await failures(client)
    assert_unreachable(errors[:3], target, "closed during set-up", "may require TLS")
    assert "tls_credentials(ca_file=...)" in str(errors[0])
    # The bare stub's watch: gRPC names the last address it tried, which for localhost may be
    # the IPv6 one the service does not listen on.
    assert isinstance(errors[3], Unreachable)


async def test_a_bad_or_missing_token_fails_at_the_first_command_saying_how_to_pass_one(
    auth_server: RunningServer,
) -> None:
    target = f"127.0.0.1:{auth_server.port}"
    refused = (("not-a-token-of-this-service", "TOKEN_UNKNOWN"), (None, "TOKEN_MISSING"))
    for token, reason in refused:
        async with client_for(target, token=token) as client:
            errors = await failures(client)
        for error in errors[:3]:
            assert isinstance(error, Unauthenticated), repr(error)
            assert error.reason == reason
            assert f"The service at {target} needs a bearer token: pass token=" in str(error)
        assert isinstance(errors[3], Unauthenticated)
    async with client_for(target, token=TOKEN) as client:
        await client.create_lane(new_lane_id("fail-fast-auth"))


async def test_another_namespaces_lane_hints_at_namespaces(auth_server: RunningServer) -> None:
    async with client_for(f"127.0.0.1:{auth_server.port}", token=TOKEN) as client:
        with pytest.raises(LaneError) as missing:
            await client.snapshot(new_lane_id("elsewhere"))
    assert missing.value.reason == "LANE_NOT_FOUND"
    assert "a token sees only its own namespace's lanes" in str(missing.value)


async def test_a_url_target_is_refused_saying_drop_the_scheme() -> None:
    with pytest.raises(ValueError, match="drop the scheme"):
        LaneClient("http://127.0.0.1:50051")


async def test_a_connection_that_drops_later_is_retried_and_says_when_it_gave_up(
    session_database_url: str,
) -> None:
    async with restartable(session_database_url) as service:
        target = f"127.0.0.1:{service.port}"
        patient = RetryPolicy(initial_backoff=0.05, max_backoff=0.2, timeout=1.0)
        for session in (False, True):
            service_lane = new_lane_id("drops")
            async with LaneClient(target, retry=patient, session=session) as client:
                await client.create_lane(service_lane)
                await service.stop(grace=0.1)
                with pytest.raises(Unreachable) as gave_up:
                    await guarded(client.snapshot(service_lane))
                await service.restart()
                # Back: the same client goes on.
                assert (await client.snapshot(service_lane)).lane_id == service_lane
            error = gave_up.value
            assert error.gave_up is not None and error.gave_up[0] > 1
            assert f"cannot reach the lane service at {target}" in str(error)
            assert "(gave up after" in str(error)


# -- a driver killed mid-run ----------------------------------------------------------------


async def lane_cli(*args: str) -> tuple[int, str]:
    """``lane ARGS`` in a process of its own, without LANE_ variables; status and output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LANE_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lane.client", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode() + err.decode()


@contextlib.asynccontextmanager
async def left_busy(target: str, lane: str) -> AsyncIterator[tuple[LaneClient, str]]:
    """A client of ``target``, and the id of the run a driver left open on ``lane`` when it
    was killed (no EndRun, no lease release)."""
    async with LaneClient(target) as client:
        first = Driver(client, lane, driver_id="driver-that-dies", lease_seconds=2)
        task = asyncio.create_task(first.run("go", never_answers))
        operation_id = await open_operation_id(client.stub, lane)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        yield client, operation_id


async def freed_with_lane_abort(client: LaneClient, target: str, lane: str) -> None:
    """Free ``lane`` as the LANE_BUSY message says: ``lane abort``, then the lease lapses."""
    status, output = await lane_cli("abort", lane, "--target", target)
    assert status == 0 and "abort requested" in output, output

    async def freed() -> bool:
        return not (await snapshot(client.stub, lane)).HasField("operation")

    await until(freed, what="the aborted run ended once its lease lapsed")


async def test_a_lane_left_busy_by_a_killed_driver_says_how_to_free_it(
    lane_server: RunningServer,
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("killed")
    async with left_busy(target, lane) as (client, operation_id):
        with pytest.raises(LaneBusy) as busy:
            await Driver(client, lane).run("again", ScriptedModel([ScriptStep("done")]))
        error = busy.value
        assert error.metadata["openOperationId"] == operation_id
        assert error.metadata["leaseHolder"] == "driver-that-dies"
        assert error.metadata["operationKind"] == "run"
        text = str(error)
        assert f"`lane abort {lane}`" in text
        assert f"Driver(...).recover({operation_id!r})" in text
        assert "LANE_ORPHAN_SECONDS" in text

        # The CLI says the same.
        status, output = await lane_cli("demo", "--lane", lane, "--target", target)
        assert status == 1 and f"`lane abort {lane}`" in output, output

        await freed_with_lane_abort(client, target, lane)
        result = await Driver(client, lane).run("again", ScriptedModel([ScriptStep("done")]))
        assert result.status_name == "completed"


async def test_a_bare_stub_watch_rides_out_outages_after_first_contact(
    session_database_url: str,
) -> None:
    """Failing fast is for the first contact only: a watch that got its snapshot resumes
    across a restart longer than the connect timeout."""
    async with restartable(session_database_url) as service:
        lane = new_lane_id("watch-outage")
        channel = open_channel(f"127.0.0.1:{service.port}")
        async with channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            async with LaneClient(channel=channel) as client:
                await client.create_lane(lane)
            views = watch_lane(stub, lane, retry=FOREVER, connect_timeout=0.01)
            async with contextlib.aclosing(views) as stream:
                first = await guarded(anext(stream))
                await service.stop(grace=0.1)
                await service.restart()
                async with LaneClient(channel=channel) as client:
                    await client.enqueue(lane, "still there?")
                later = await guarded(anext(stream))
            assert later.snapshot.revision > first.snapshot.revision
