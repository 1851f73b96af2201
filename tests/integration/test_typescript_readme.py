"""The TypeScript README's "Writing a tool" example runs as written against the real service,
from a project that installed the package as the README says (``@lane/client`` linked into its
``node_modules``, resolved through the package's ``exports`` to ``dist/``): it defines
everything it uses (its model too), and its run completes.

Needs ``clients/typescript/node_modules`` and ``dist/`` (``clients/typescript/scripts/test.sh``
makes both; ``./dev test`` runs it before pytest). Without them this test fails; it never
skips."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.server import RunningServer
from tests.integration.lanes import new_lane_id
from tests.integration.typescript_driver import TYPESCRIPT_DIR

pytestmark = pytest.mark.asyncio(loop_scope="session")

README = TYPESCRIPT_DIR / "README.md"


def example() -> str:
    """The first TypeScript block under "### Writing a tool"."""
    section = README.read_text().split("### Writing a tool", 1)[1]
    found = re.search(r"```ts\n(.*?)```", section, re.S)
    assert found is not None
    return found.group(1)


def project(root: Path) -> Path:
    """A project that installed the package from its path (npm links it), with tsx to run a
    TypeScript file."""
    for needed in ("node_modules/tsx", "dist/index.js"):
        if not (TYPESCRIPT_DIR / needed).exists():
            pytest.fail(f"{TYPESCRIPT_DIR / needed} is missing: run scripts/test.sh first")
    (root / "node_modules" / "@lane").mkdir(parents=True)
    (root / "node_modules" / "@lane" / "client").symlink_to(TYPESCRIPT_DIR)
    (root / "node_modules" / "tsx").symlink_to(TYPESCRIPT_DIR / "node_modules" / "tsx")
    (root / "package.json").write_text('{"type": "module", "private": true}\n')
    (root / "README.md").write_text("three words here\n")
    return root


async def test_the_example_defines_its_model_and_its_run_completes(
    lane_server: RunningServer, lane_stub, tmp_path: Path
) -> None:
    code = example()
    assert re.search(r"^const model = ", code, re.M), "the example uses a model it never defines"
    lane = new_lane_id("ts-readme")
    assert '"127.0.0.1:50051"' in code and '"lane-1"' in code
    code = code.replace('"127.0.0.1:50051"', f'"127.0.0.1:{lane_server.port}"')
    code = code.replace('"lane-1"', f'"{lane}"')
    root = project(tmp_path)
    (root / "app.ts").write_text(code)
    node = shutil.which("node")
    assert node is not None, "node is not on PATH"
    process = await asyncio.create_subprocess_exec(
        node, "--import", "tsx", "app.ts",
        cwd=root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()
    assert out.decode().split() == ["COMPLETED"]
    answer = await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))
    results = [
        e.message.message.tool_result
        for e in answer.snapshot.transcript
        if e.message.message.WhichOneof("message") == "tool_result"
    ]
    assert [r.content[0].text.text for r in results] == ["3 words"]
