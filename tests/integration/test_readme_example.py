"""The README's "A driver in Python" example runs as written against the real service, importing
from ``lane.client`` only."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from lane.server.app.server import RunningServer

README = Path(__file__).resolve().parents[2] / "README.md"


def example() -> str:
    """The first Python block under "### A driver in Python"."""
    section = README.read_text().split("### A driver in Python", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    return found.group(1)


def test_the_example_imports_from_lane_client_only() -> None:
    imports = re.findall(r"^(?:from|import) (\S+)", example(), re.M)
    assert {name for name in imports if name.startswith("lane")} == {"lane.client"}


@pytest.mark.asyncio(loop_scope="session")
async def test_the_example_counts_to_30_and_completes(lane_server: RunningServer) -> None:
    code = example()
    assert '"127.0.0.1:50051"' in code
    code = code.replace('"127.0.0.1:50051"', f'"127.0.0.1:{lane_server.port}"')
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    assert out.decode().split() == ["completed"]
