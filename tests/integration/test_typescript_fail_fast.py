"""The TypeScript SDK against a service it cannot use, in Node processes of their own
(clients/typescript/test/reach-process.ts): a closed port, an unknown host, TLS against a
plaintext service and the reverse, a refused token. Every entry point (a ``LaneClient``
command, its ``watch``, ``Driver.run``, ``watchLane`` on the raw client) fails with
``ServiceUnreachable`` naming the address, the cause and the fix (or UNAUTHENTICATED saying how
to pass a token), although its retries never give up: a client that did not fail fast would
hang, and the guard fails it.

Also: a lane left busy by a killed driver refuses the next TypeScript ``Driver.run`` saying how
to free it, and after ``lane abort`` that run goes through; a provider's retry-after beyond the
driver's cap fails the run with the provider's message.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest
import pytest_asyncio

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import new_lane_id
from tests.integration.test_sdk_fail_fast import closed_port, freed_with_lane_abort, left_busy
from tests.integration.test_tls import Certificates, certificates, tls_service
from tests.integration.typescript_driver import TYPESCRIPT_DIR

__all__ = ["certificates"]  # the fixture, used by the tests below

pytestmark = pytest.mark.asyncio(loop_scope="session")

ENTRIES = ["command", "watch", "driver", "bare watch"]
TOKEN = "ts-fail-fast-token-0123456789"


async def node(config: dict[str, Any]) -> Any:
    """Run reach-process.ts with ``config``; its JSON result (a guard fails a hang)."""
    binary = shutil.which("node")
    if binary is None or not (TYPESCRIPT_DIR / "node_modules" / "tsx").is_dir():
        pytest.fail("node and clients/typescript/node_modules are needed (./dev test installs)")
    process = await asyncio.create_subprocess_exec(
        binary, "--import", "tsx", "test/reach-process.ts", json.dumps(config),
        cwd=TYPESCRIPT_DIR, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), 90)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError("the TypeScript client hung instead of failing fast") from None
    lines = [line for line in out.decode().splitlines() if line.strip()]
    assert process.returncode == 0 and lines, err.decode()[-3000:]
    return json.loads(lines[-1])


async def entries(target: str, **extra: Any) -> dict[str, dict[str, Any]]:
    config = {"kind": "entries", "target": target, "lane": new_lane_id("ts-fail"), **extra}
    results = await node({**config, "connectTimeoutMs": 2000})
    assert [r["entry"] for r in results] == ENTRIES
    return {r["entry"]: r for r in results}


def assert_unreachable(
    results: dict[str, dict[str, Any]], target: str, problem: str, fix: str
) -> None:
    for entry, result in results.items():
        assert result["name"] == "ServiceUnreachable", (entry, result)
        assert problem in result["problem"], (entry, result)
        assert fix in result["fix"], (entry, result)
        assert result["message"].startswith(f"cannot reach the lane service at {target}: ")


async def test_a_closed_port_fails_fast_with_connection_refused() -> None:
    target = f"127.0.0.1:{closed_port()}"
    results = await entries(target)
    assert_unreachable(results, target, "connection refused", "Is the service running")


async def test_an_unknown_host_fails_fast() -> None:
    target = "no-such-host.invalid:50051"
    assert_unreachable(await entries(target), target, "unknown host", "Check the host name")


async def test_tls_against_a_plaintext_service_fails_fast(
    lane_server: RunningServer, certificates: Certificates
) -> None:
    target = f"https://127.0.0.1:{lane_server.port}"
    results = await entries(target, ca=str(certificates.ca_file))
    assert_unreachable(results, target, "does not speak TLS", "Use a plaintext address")


async def test_plaintext_against_a_tls_service_fails_fast(
    session_database_url: str, certificates: Certificates
) -> None:
    async with tls_service(session_database_url, certificates, mutual=False) as target:
        results = await entries(target)
    assert_unreachable(results, target, "closed during set-up", "may require TLS")


@pytest_asyncio.fixture(loop_scope="session")
async def auth_target(session_database_url: str) -> Any:
    settings = Settings(database_url=session_database_url, auth_tokens={TOKEN: "team-ts"})
    running = await start_server(settings, listen="127.0.0.1:0")
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        await running.stop(grace=0.5)


async def test_a_bad_token_fails_at_once_saying_how_to_pass_one(auth_target: str) -> None:
    results = await entries(auth_target, token="not-a-token-of-this-service")
    for entry in ("command", "watch", "driver"):
        result = results[entry]
        assert (result["code"], result["reason"]) == ("UNAUTHENTICATED", "TOKEN_UNKNOWN"), result
        assert (
            f"The service at {auth_target} needs a bearer token: pass {{ token }}"
            in (result["message"])
        )
    assert results["bare watch"]["code"] == "UNAUTHENTICATED"


async def test_a_lane_left_busy_by_a_killed_driver_says_how_to_free_it(
    lane_server: RunningServer,
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("ts-killed")
    async with left_busy(target, lane) as (client, operation_id):
        refused = await node({"kind": "run", "target": target, "lane": lane})
        assert (refused["code"], refused["reason"]) == ("FAILED_PRECONDITION", "LANE_BUSY")
        assert f"`lane abort {lane}`" in refused["message"]
        assert f'driver.recover("{operation_id}")' in refused["message"]

        await freed_with_lane_abort(client, target, lane)
        ran = await node({"kind": "run", "target": target, "lane": lane})
        assert ran["status"] == "COMPLETED", ran


async def test_a_retry_after_beyond_the_cap_fails_the_run_with_the_providers_message(
    lane_server: RunningServer,
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane = new_lane_id("ts-retry-after")
    ran = await node({"kind": "run", "target": target, "lane": lane, "retryAfterMs": 3_600_000})
    assert ran["status"] == "FAILED" and ran["asked"] == 1, ran
    assert ran["error"].startswith("Rate limit reached. (the provider asks to retry after 3600s")
    assert "longer than the 60s this driver waits" in ran["error"]
