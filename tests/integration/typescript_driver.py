"""Running the TypeScript Driver (clients/typescript/test/driver-process.ts) from a test: a Node
process per driver, its JSON result on the last stdout line, its log kept for failures.

Needs ``clients/typescript/node_modules`` (clients/typescript/scripts/test.sh installs it;
``./dev test`` runs that before pytest). Without it the tests fail; they never skip.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TYPESCRIPT_DIR = Path(__file__).resolve().parents[2] / "clients" / "typescript"
PROCESS = "test/driver-process.ts"


@dataclass
class NodeDriver:
    """One driver process."""

    process: asyncio.subprocess.Process
    log: Path

    async def finish(self, within: float = 60.0) -> tuple[int, dict[str, Any] | None]:
        """Wait for the exit; its status and the JSON result (None when it printed none)."""
        try:
            stdout, _ = await asyncio.wait_for(self.process.communicate(), within)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            problem = f"the Node driver did not finish; its log:\n{self.tail()}"
            raise AssertionError(problem) from None
        lines = [line for line in stdout.decode().splitlines() if line.strip()]
        result = json.loads(lines[-1]) if lines else None
        code = self.process.returncode
        assert code is not None
        return code, result

    async def result(self, within: float = 60.0) -> dict[str, Any]:
        """The result of a driver that must exit 0."""
        code, result = await self.finish(within)
        assert code == 0 and result is not None, f"exit {code}; log:\n{self.tail()}"
        return result

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


async def start_node_driver(config: dict[str, Any], log: Path) -> NodeDriver:
    """Start ``driver-process.ts`` with ``config``; its stderr goes to ``log``."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the TypeScript client needs Node 20 or newer")
    if not (TYPESCRIPT_DIR / "node_modules" / "tsx").is_dir():
        pytest.fail(
            f"{TYPESCRIPT_DIR / 'node_modules'} is missing: run clients/typescript/scripts/test.sh"
            " first (./dev test runs it before pytest)"
        )
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        process = await asyncio.create_subprocess_exec(
            node,
            "--import",
            "tsx",
            PROCESS,
            json.dumps(config),
            cwd=TYPESCRIPT_DIR,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=sink,
        )
    return NodeDriver(process, log)
