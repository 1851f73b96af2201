"""The TypeScript ``watchLanes`` against the real service: a Node process follows a lane list
(clients/typescript/examples/follow-lanes.ts) while the test changes lanes over gRPC, stops the
server and starts it again on the same port; each update the Node side prints must match what
ListLanes says once it settles.

Needs ``clients/typescript/node_modules`` (``clients/typescript/scripts/test.sh`` installs it;
``./dev test`` runs that before pytest). Without it this test fails; it never skips.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import json_format
from lane.client.testing import LaneScript, new_lane_id
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.server import RunningServer, start_server
from tests.integration.test_typescript_watcher import LINE_LIMIT, TYPESCRIPT_DIR

pytestmark = pytest.mark.asyncio(loop_scope="session")

Update = dict[str, Any]


async def start_follower(prefix: str, port: int) -> asyncio.subprocess.Process:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the TypeScript client needs Node 20 or newer")
    if not (TYPESCRIPT_DIR / "node_modules" / "tsx").is_dir():
        pytest.fail("clients/typescript/node_modules is missing: run scripts/test.sh first")
    return await asyncio.create_subprocess_exec(
        node,
        "--import",
        "tsx",
        "examples/follow-lanes.ts",
        prefix,
        f"127.0.0.1:{port}",
        cwd=TYPESCRIPT_DIR,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=LINE_LIMIT,
    )


async def until(process: asyncio.subprocess.Process, done: Callable[[Update], bool]) -> Update:
    """Read the follower's updates until one satisfies ``done``."""
    assert process.stdout is not None
    async with asyncio.timeout(30):
        while True:
            line = await process.stdout.readline()
            if not line:
                assert process.stderr is not None
                raise AssertionError(f"the follower ended: {(await process.stderr.read())!r}")
            update: Update = json.loads(line)
            if done(update):
                return update


def summaries(update: Update) -> dict[str, pb.LaneSummary]:
    return {
        lane_id: json_format.ParseDict(line, pb.LaneSummary())
        for lane_id, line in update["lanes"].items()
    }


async def test_watch_lanes_follows_changes_and_lists_again_after_a_restart(
    lane_stub, session_database_url: str
) -> None:
    prefix = new_lane_id("ts-list")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-a"))
    running = await start_server(session_database_url, listen="127.0.0.1:0")
    port = running.port
    restarted: RunningServer | None = None
    follower = await start_follower(prefix, port)
    try:
        listing = await until(follower, lambda u: u["kind"] == "listing")
        assert list(listing["lanes"]) == [f"{prefix}-a"] and not listing["relisted"]
        run = await LaneScript(lane_stub, f"{prefix}-a").start_run("go")
        changed = await until(follower, lambda u: u["kind"] == "changes")
        line = summaries(changed)[f"{prefix}-a"]
        assert (line.revision, line.status) == (run.started.revision, pb.LANE_STATUS_RUNNING)
        await running.stop(0)
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=f"{prefix}-b"))
        restarted = await start_server(session_database_url, listen=f"127.0.0.1:{port}")
        relisted = await until(follower, lambda u: u["relisted"])
        listed = await lane_stub.ListLanes(pb.ListLanesRequest(lane_id_prefix=prefix))
        assert summaries(relisted) == {line.lane_id: line for line in listed.lanes}
    finally:
        if follower.returncode is None:
            follower.terminate()
        await follower.wait()
        await running.stop(0)
        if restarted is not None:
            await restarted.stop(0)
