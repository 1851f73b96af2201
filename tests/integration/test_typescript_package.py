"""The built TypeScript package, as an application uses it: plain ``node app.mjs`` imports
``@lane/client`` from an application directory (the package linked into its node_modules, no
TypeScript loader), resolved through the package's ``exports`` to ``dist/``, and follows a lane
over the service's HTTP port while the test drives a run over gRPC.

Each case is one way in: the Node build (connect-node) over Connect and over gRPC-Web, and the
browser build (``node --conditions=browser``: connect-web on ``fetch``) over Connect. Each must
stream the snapshot and then every commit, and end on the lane the service captures.

Needs ``clients/typescript/node_modules`` and ``dist/``: ``clients/typescript/scripts/test.sh``
makes both, and ``./dev test`` runs it before pytest. Without them this test fails; it never
skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.app.server import RunningServer
from tests.integration.lanes import assistant, new_lane_id, result, text, tool_call, user

pytestmark = pytest.mark.asyncio(loop_scope="session")

TYPESCRIPT_DIR = Path(__file__).resolve().parents[2] / "clients" / "typescript"
APP = TYPESCRIPT_DIR / "examples" / "follow-connect.mjs"
#: Upper bound for any single wait on the Node process (start-up included).
WAIT_SECONDS = 15.0
LINE_LIMIT = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def application(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An application directory: app.mjs, and the package and its protobuf runtime linked in
    node_modules as an install would put them."""
    if shutil.which("node") is None:
        pytest.fail("node is not on PATH: the TypeScript client needs Node 20 or newer")
    for needed in ("node_modules/@bufbuild/protobuf", "dist/index.js", "dist/browser.js"):
        if not (TYPESCRIPT_DIR / needed).exists():
            pytest.fail(
                f"{TYPESCRIPT_DIR / needed} is missing: run clients/typescript/scripts/test.sh "
                "first (./dev test runs it before pytest)"
            )
    app = tmp_path_factory.mktemp("ts-application")
    (app / "node_modules" / "@lane").mkdir(parents=True)
    (app / "node_modules" / "@lane" / "client").symlink_to(TYPESCRIPT_DIR)
    (app / "node_modules" / "@bufbuild").symlink_to(TYPESCRIPT_DIR / "node_modules" / "@bufbuild")
    shutil.copy(APP, app / "app.mjs")
    return app


class App:
    """app.mjs in a subprocess; its stdout read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        raw = await asyncio.wait_for(stdout.readline(), WAIT_SECONDS)
        if not raw:
            raise AssertionError(f"app.mjs exited ({await self.stderr()})")
        record: dict[str, Any] = json.loads(raw)
        return record

    async def stderr(self) -> str:
        await asyncio.wait_for(self.process.wait(), WAIT_SECONDS)
        assert self.process.stderr is not None
        return (await self.process.stderr.read()).decode(errors="replace")


async def drive_run(stub: Any, lane_id: str) -> None:
    """A run with one tool call (started, progress, staged and placed), completed."""
    run = await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
    op = run.operation_id
    turn = await stub.StartTurn(pb.StartTurnRequest(lane_id=lane_id, operation_id=op))
    call = assistant(text("one call"), tool_call("c0", "shell", {"command": "true"}))
    await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            lane_id=lane_id, operation_id=op, turn_id=turn.turn_id, message=call
        )
    )
    await stub.StartToolCall(
        pb.StartToolCallRequest(
            lane_id=lane_id, operation_id=op, tool_call_id="c0", arguments_json="{}"
        )
    )
    await stub.UpdateToolCall(
        pb.UpdateToolCallRequest(
            lane_id=lane_id, operation_id=op, tool_call_id="c0", partial_result=result("half")
        )
    )
    await stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            lane_id=lane_id,
            operation_id=op,
            tool_call_id="c0",
            executed=pb.ExecutedOutcome(result=result("done")),
        )
    )
    turn = await stub.StartTurn(pb.StartTurnRequest(lane_id=lane_id, operation_id=op))
    await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            lane_id=lane_id,
            operation_id=op,
            turn_id=turn.turn_id,
            message=assistant(text("done"), stop=messages_pb2.STOP_REASON_STOP),
        )
    )
    await stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane_id,
            operation_id=op,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
        )
    )


@pytest.mark.parametrize(
    ("condition", "protocol"),
    [("node", "connect"), ("node", "grpc-web"), ("browser", "connect")],
)
async def test_node_imports_the_built_package_and_follows_a_lane_over_http(
    http_server: RunningServer,
    http_server_stub: Any,
    application: Path,
    condition: str,
    protocol: str,
) -> None:
    lane_id = new_lane_id("ts-package")
    await http_server_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    node = shutil.which("node")
    assert node is not None
    conditions = ["--conditions=browser"] if condition == "browser" else []
    process = await asyncio.create_subprocess_exec(
        node,
        *conditions,
        "app.mjs",
        lane_id,
        f"http://127.0.0.1:{http_server.http_port}",
        protocol,
        cwd=application,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=LINE_LIMIT,
    )
    app = App(process)
    try:
        # "@lane/client" resolved through `exports` to the build for the condition.
        entry = (await app.line())["entry"]
        built = "browser.js" if condition == "browser" else "index.js"
        assert entry.endswith(f"/clients/typescript/dist/{built}"), entry

        first = await app.line()
        assert (first["kind"], first["revision"]) == ("snapshot", "1")

        await drive_run(http_server_stub, lane_id)
        answer = await http_server_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
        final = answer.snapshot
        views = [first]
        while int(views[-1]["revision"]) < final.revision:
            views.append(await app.line())

        # Every commit came live, one event update after another, and the fold is the
        # service's own snapshot of the lane, field by field.
        assert [v["kind"] for v in views[1:]] == ["events"] * (len(views) - 1)
        revisions = [int(v["revision"]) for v in views]
        assert all(a < b for a, b in itertools.pairwise(revisions)), revisions
        assert revisions[-1] == final.revision
        folded = json_format.ParseDict(views[-1]["snapshot"], snapshot_pb2.LaneSnapshot())
        assert folded == final
        placed = [e.message.message.tool_result for e in folded.transcript if e.HasField("message")]
        assert [r.tool_call_id for r in placed if r.tool_call_id] == ["c0"]

        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), WAIT_SECONDS) == 0, await app.stderr()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
