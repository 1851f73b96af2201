"""The ``lane`` client commands as a user runs them: snapshot (text and JSON), lanes, send,
abort, the demo's scripts; failures that name the target, the cause and the fix; every
subcommand's help; ``lane --version``; ``./dev`` without a command."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from lane.client.cli import build_parser
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import start_server
from tests.driver.support import snapshot, tool_results
from tests.integration.lanes import new_lane_id, user
from tests.terminal.conftest import child_env, lane_command

pytestmark = pytest.mark.asyncio(loop_scope="session")

DEV = Path(__file__).resolve().parents[2] / "dev"


async def lane(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *lane_command(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in child_env().items() if not k.startswith("LANE_")} | (env or {}),
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
    assert (row[1], row[2], row[3]) == ("running", str(run.revision), run.operation_id)
    status, out, _ = await lane(
        "lanes", "--target", target, "--prefix", lane_id, "--status", "idle"
    )
    assert status == 0 and out.splitlines()[1:] == []
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


async def test_lanes_watch_prints_each_change(lane_server, lane_stub) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("cli-live")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    process = await asyncio.create_subprocess_exec(
        *lane_command("lanes", "--watch", "--prefix", lane_id, "--target", target),
        stdout=asyncio.subprocess.PIPE,
        env={k: v for k, v in child_env().items() if not k.startswith("LANE_")},
    )
    assert process.stdout is not None
    try:
        listed = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()
        assert (listed[1], listed[2], listed[3]) == (lane_id, "idle", "1")
        run = await lane_stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
        changed = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()
        assert changed[1:5] == [lane_id, "running", str(run.revision), run.operation_id]
        await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id, force=True))
        removed = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()
        assert removed[1:] == [lane_id, "deleted"]
    finally:
        process.kill()
        await process.wait()


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
    assert build_parser().parse_args(["lanes"]).connect_timeout == 5.0
    monkeypatch.setenv("LANE_TARGET", "example:1234")
    assert build_parser().parse_args(["watch", "x"]).target == "example:1234"
    # The option wins over the variable.
    args = ["watch", "x", "--target", "other:99"]
    assert build_parser().parse_args(args).target == "other:99"


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_send_queues_a_user_message(lane_server, lane_stub) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("cli-send")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    status, out, err = await lane("send", lane_id, "steer me", "--target", target)
    assert status == 0, err
    assert out.startswith("queued steer message ")
    status, out, err = await lane(
        "send", lane_id, "after that", "--as", "follow-up", "--target", target
    )
    assert status == 0, err
    inbox = (await snapshot(lane_stub, lane_id)).queues
    assert [(item.kind, item.message.user.content[0].text.text) for item in inbox] == [
        (snapshot_pb2.QUEUE_KIND_STEER, "steer me"),
        (snapshot_pb2.QUEUE_KIND_FOLLOW_UP, "after that"),
    ]
    # Shown before any run takes them (lane watch draws the same lines).
    status, out, err = await lane("snapshot", lane_id, "--target", target)
    assert status == 0, err
    assert "── queued (2)\n  steer: steer me\n  follow-up: after that" in out, out
    status, _, err = await lane("send", "no-such-lane-anywhere", "x", "--target", target)
    assert status == 1 and "NOT_FOUND" in err


@pytest.mark.parametrize("command", ["lanes", "snapshot x", "send x hi", "abort x", "demo"])
async def test_an_unreachable_target_fails_in_seconds_naming_target_cause_and_fix(
    command: str,
) -> None:
    target = f"127.0.0.1:{closed_port()}"
    status, _, err = await lane(*command.split(), "--target", target)
    assert status == 1
    assert f"cannot reach the lane service at {target}: connection refused" in err
    assert "lane serve" in err and "LANE_TARGET" in err
    assert "Traceback" not in err


async def test_a_target_without_a_port_uses_50051_and_unknown_hosts_are_named() -> None:
    # 127.0.0.2 is loopback but the services of tests listen on 127.0.0.1 only.
    status, _, err = await lane("lanes", "--target", "127.0.0.2")
    assert status == 1 and "at 127.0.0.2:50051: connection refused" in err
    status, _, err = await lane("lanes", env={"LANE_TARGET": "nosuchhost.invalid"})
    assert status == 1
    assert "at nosuchhost.invalid:50051: unknown host. Check the host name" in err


async def test_unauthenticated_names_lane_token(session_database_url: str, store) -> None:
    settings = Settings(database_url=session_database_url, auth_tokens={"s3cret-token": "team"})
    running = await start_server(settings, listen="127.0.0.1:0")
    target = f"127.0.0.1:{running.port}"
    try:
        status, _, err = await lane("lanes", "--target", target)
        assert status == 1
        assert "UNAUTHENTICATED" in err and "set LANE_TOKEN" in err and target in err
        status, out, err = await lane(
            "lanes", "--target", target, env={"LANE_TOKEN": "s3cret-token"}
        )
        assert status == 0, err
        assert out.startswith("LANE")
        status, out, err = await lane("lanes", "--target", target, "--token", "s3cret-token")
        assert status == 0, err
    finally:
        await running.stop(0.5)


async def test_a_one_turn_demo_says_turn(lane_server) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    status, out, err = await lane(
        "demo", "--lane", new_lane_id("cli-one"), "--target", target,
        "--script", '[{"text": "done"}]', "--model-delay", "0",
    )  # fmt: skip
    assert status == 0, out + err
    assert "ended completed after 1 turn\n" in out


async def test_version_and_dev_usage() -> None:
    status, out, _ = await lane("--version")
    assert status == 0 and out.startswith("lane 0.")
    dev = DEV
    process = await asyncio.create_subprocess_exec(
        str(dev), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out_bytes, err_bytes = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    usage = err_bytes.decode()
    assert usage.startswith("usage: ./dev serve") and "./dev test" in usage
    assert "set -euo" not in usage + out_bytes.decode()
