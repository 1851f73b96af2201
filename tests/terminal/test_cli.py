"""The ``lane`` client commands as a user runs them: snapshot (text and JSON), lanes, abort,
and the demo's default script."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from lane.client.cli import build_parser
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.driver.support import snapshot, tool_results
from tests.integration.lanes import new_lane_id, user
from tests.terminal.conftest import child_env, lane_command

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def lane(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *lane_command(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_snapshot_lanes_and_abort(lane_server, lane_stub) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("cli")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    run = await lane_stub.StartRun(
        pb.StartRunRequest(lane_id=lane_id, prompt=[user("hello from the cli test")])
    )
    status, out, _ = await lane("snapshot", lane_id, "--json", "--target", target)
    assert status == 0
    data = json.loads(out)
    assert data["laneId"] == lane_id and data["operation"]["id"] == run.operation_id
    status, out, _ = await lane("snapshot", lane_id, "--target", target)
    assert status == 0 and "you: hello from the cli test" in out and "\x1b[" not in out
    status, out, _ = await lane("lanes", "--target", target)
    assert status == 0
    (row,) = [line.split() for line in out.splitlines() if line.startswith(lane_id)]
    assert row[2:] == [run.operation_id, "open"]
    status, out, _ = await lane("abort", lane_id, "--target", target)
    assert status == 0 and f"operation {run.operation_id}: abort requested" in out
    # The run is unleased: whoever drives it ends it.
    await lane_stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane_id,
            operation_id=run.operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
        )
    )
    status, _, err = await lane("abort", lane_id, "--target", target)
    assert status == 1 and "no open operation" in err
    status, _, err = await lane("snapshot", "no-such-lane-anywhere", "--target", target)
    assert status == 1 and "NOT_FOUND" in err


async def test_the_default_demo_completes(lane_server, lane_stub) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("cli-demo")
    status, out, err = await lane(
        "demo", "--lane", lane_id, "--target", target, "--model-delay", "0"
    )
    assert status == 0, out + err
    assert f"lane watch {lane_id}" in out and "ended completed after 3 turns" in out
    snap = await snapshot(lane_stub, lane_id)
    names = [r.tool_name for r in tool_results(snap)]
    assert names == ["sleep", "read_file", "shell", "shell"]
    assert not any(r.is_error for r in tool_results(snap))


async def test_the_target_defaults_to_lane_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANE_TARGET", raising=False)
    assert build_parser().parse_args(["lanes"]).target == "127.0.0.1:50051"
    monkeypatch.setenv("LANE_TARGET", "example:1234")
    assert build_parser().parse_args(["watch", "x"]).target == "example:1234"
    assert os.environ["LANE_TARGET"] == "example:1234"
