"""The web console's browser tests' toolkit: the service with auth on (restartable on its ports),
a headless Chromium driven by Playwright (``playwright-core``, through
clients/typescript/web/e2e/browser.ts), LaneService over gRPC with a token, and the lane
scripts the tests drive lanes with, one command at a time. Used by test_web_view.py and
test_web_console.py; loaded as a plugin (tests/conftest.py), so ``web_service`` and ``web_page``
are one service and one browser for the whole session, whichever files run.

Screenshots go under the pytest base temp directory, in ``web-view-screenshots`` (or in
``$LANE_SCREENSHOTS_DIR``). Needs ``chromium`` (``./dev test`` installs it) and
clients/typescript's node_modules (its scripts/test.sh); without either the tests fail, they
never skip.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from lane.client.testing import LaneScript, RunScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server

TYPESCRIPT_DIR = Path(__file__).resolve().parents[2] / "clients" / "typescript"
BRIDGE = "web/e2e/browser.ts"
TOKEN_A = "web-view-token-team-a-0123456789"
TOKEN_B = "web-view-token-team-b-0123456789"
#: Upper bound of one answer from the browser process (its own waits are 15 s).
ANSWER_SECONDS = 30.0
#: The red of error results (style.css: #c62828).
RED = "rgb(198, 40, 40)"
#: The grey of dimmed lines: thinking, the tool calls asked for (style.css: #69737d).
DIM = "rgb(105, 115, 125)"

#: What the lane page shows, read from its DOM: revision, connection, open operation, tool rows
#: and placed tool results. `null` before the lane page is up.
STATE_JS = """(() => {
  const lane = document.querySelector("#lane");
  if (!lane) return null;
  const connection = document.querySelector("#connection");
  const operation = document.querySelector("#operation");
  const last = document.querySelector("#last-result");
  const fatal = document.querySelector("#fatal");
  return {
    revision: Number(lane.dataset.revision ?? -1),
    snapshots: Number(lane.dataset.snapshots ?? 0),
    connection: connection ? connection.dataset.state : null,
    connectionText: connection ? connection.textContent : null,
    operation: operation
      ? { id: operation.dataset.operationId, status: operation.dataset.status } : null,
    abortEnabled: !!document.querySelector("button#abort:not([disabled])"),
    rows: [...document.querySelectorAll("li.tool")].map((r) => ({
      id: r.dataset.callId, state: r.dataset.state, text: r.textContent,
      error: r.classList.contains("error"), color: getComputedStyle(r).color })),
    results: [...document.querySelectorAll("li.tool-result")].map((r) => ({
      id: r.dataset.callId, text: r.textContent,
      error: r.classList.contains("error"), color: getComputedStyle(r).color })),
    queued: [...document.querySelectorAll("#queue li.queued")].map((q) => q.textContent),
    lastResult: last ? (last.dataset.status ?? null) : null,
    lastResultColor: last ? getComputedStyle(last).color : null,
    fatal: fatal ? fatal.textContent : null,
  };
})()"""

#: Records the page's state each time it draws a new revision, into window.__states.
RECORD_JS = (
    "(() => { window.__states = [];"
    " new MutationObserver(() => window.__states.push("
    + STATE_JS
    + ')).observe(document.querySelector("#lane"),'
    ' { attributes: true, attributeFilter: ["data-revision"] }); return true; })()'
)


#: What the lane page shows of an assistant message streaming in, a scheduled retry and the
#: transcript, read from its DOM, each element with its computed color and font style.
STREAM_JS = """(() => {
  const lane = document.querySelector("#lane");
  if (!lane) return null;
  const look = (e) => {
    const style = getComputedStyle(e);
    return { text: e.textContent, color: style.color, fontStyle: style.fontStyle };
  };
  const streaming = document.querySelector("#streaming");
  const retry = document.querySelector("#retry");
  return {
    revision: Number(lane.dataset.revision ?? -1),
    connection: document.querySelector("#connection")?.dataset.state ?? null,
    streaming: streaming ? [...streaming.querySelectorAll(".block")].map((b) => ({
      kind: [...b.classList].filter((c) => c !== "block").join(" "), ...look(b),
      cursor: !!b.querySelector(".cursor") })) : null,
    retry: retry ? { ...look(retry), attempt: Number(retry.dataset.attempt),
      maxAttempts: Number(retry.dataset.maxAttempts),
      nextAttemptMs: Number(retry.dataset.nextAttemptMs) } : null,
    transcript: [...document.querySelectorAll("#transcript > li")].map((e) => ({
      kind: [...e.classList].filter((c) => c !== "entry").join(" "), ...look(e) })),
  };
})()"""

#: Records the streaming state each time the page draws a new revision, into window.__streams.
RECORD_STREAM_JS = (
    "(() => { window.__streams = [];"
    " new MutationObserver(() => window.__streams.push("
    + STREAM_JS
    + ')).observe(document.querySelector("#lane"),'
    ' { attributes: true, attributeFilter: ["data-revision"] }); return true; })()'
)


class Browser:
    """web/e2e/browser.ts in a subprocess: one JSON request per line, one answer per line."""

    def __init__(self, process: asyncio.subprocess.Process, shots: Path) -> None:
        self.process = process
        self.shots = shots
        self._ids = itertools.count(1)
        self._stderr = bytearray()
        self._reader = asyncio.create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.read(4096):
            self._stderr.extend(chunk)

    async def call(self, op: str, **args: Any) -> Any:
        """Run one operation in the browser; its value."""
        assert self.process.stdin is not None and self.process.stdout is not None
        request = {"id": next(self._ids), "op": op, **args}
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), ANSWER_SECONDS)
        stderr = self._stderr.decode(errors="replace")[-4000:]
        if not line:
            raise AssertionError(f"the browser process exited; its stderr:\n{stderr}")
        answer = json.loads(line)
        assert answer["id"] == request["id"]
        if not answer["ok"]:
            raise AssertionError(f"{op} {args}: {answer['error']}\nbrowser stderr:\n{stderr}")
        return answer["value"]

    async def wait(self, expression: str) -> Any:
        """Wait until the page expression is truthy; its value."""
        return await self.call("wait", expr=expression)

    async def state_when(self, condition: str) -> dict[str, Any]:
        """The page's state once ``condition`` (JavaScript over ``s``, the state) holds."""
        state: dict[str, Any] = await self.wait(
            f"(() => {{ const s = {STATE_JS}; return s && ({condition}) ? s : null; }})()"
        )
        return state

    async def at_revision(self, revision: int) -> dict[str, Any]:
        """The page's state once it drew ``revision``, the stream live."""
        return await self.state_when(f"s.revision >= {revision} && s.connection === 'live'")

    async def stream_at(self, revision: int) -> dict[str, Any]:
        """What the page shows of the streaming message once it drew ``revision``, live."""
        state: dict[str, Any] = await self.wait(
            f"(() => {{ const s = {STREAM_JS};"
            f" return s && s.revision >= {revision} && s.connection === 'live' ? s : null; }})()"
        )
        return state

    async def screenshot(self, name: str) -> None:
        await self.call("screenshot", path=str(self.shots / f"{name}.png"))

    async def open_lane(self, origin: str, lane_id: str) -> dict[str, Any]:
        """Open the lane's page (signed in with token A) and start recording its states."""
        await self.call("goto", url=f"{origin}/")
        await self.call("eval", expr=f"sessionStorage.setItem('lane-token', '{TOKEN_A}')")
        await self.call("goto", url=f"{origin}/#/lanes/{lane_id}")
        state = await self.state_when("s.revision >= 1 && s.connection === 'live'")
        await self.call("eval", expr=RECORD_JS)
        return state

    async def recorded(self) -> list[dict[str, Any]]:
        states: list[dict[str, Any]] = await self.call("eval", expr="window.__states")
        return states

    async def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), ANSWER_SECONDS)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        await self._reader


@dataclass
class Service:
    """The service with auth on (tokens A and B, namespaces team-a and team-b); restartable on
    the same ports."""

    settings: Settings
    running: RunningServer

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.running.http_port}"

    async def restart(self) -> None:
        """Stop the service (its streams cut at once), then start it again on its ports."""
        grpc_port, http_port = self.running.port, self.running.http_port
        await self.running.stop(grace=0)
        self.running = await start_server(
            self.settings, listen=f"127.0.0.1:{grpc_port}", http_listen=f"127.0.0.1:{http_port}"
        )


class Rpc:
    """LaneService over gRPC with one bearer token; a new channel after each restart."""

    def __init__(self, service: Service, token: str) -> None:
        self.service = service
        self.metadata = (("authorization", f"Bearer {token}"),)

    async def __call__(self, method: str, request: Any) -> Any:
        address = f"127.0.0.1:{self.service.running.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            return await getattr(stub, method)(request, metadata=self.metadata)


class RpcStub:
    """An :class:`Rpc` as a stub (``stub.StartRun(request)``), for ``LaneScript``."""

    def __init__(self, rpc: Rpc) -> None:
        self.rpc = rpc

    def __getattr__(self, method: str) -> Callable[[Any], Awaitable[Any]]:
        return functools.partial(self.rpc, method)


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def web_service(session_database_url: str) -> AsyncIterator[Service]:
    settings = Settings(
        database_url=session_database_url, auth_tokens={TOKEN_A: "team-a", TOKEN_B: "team-b"}
    )
    running = await start_server(settings, listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    holder = Service(settings, running)
    try:
        yield holder
    finally:
        await holder.running.stop(grace=0.5)


@pytest.fixture(scope="session")
def web_shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: $LANE_SCREENSHOTS_DIR, or web-view-screenshots in the pytest
    base temp directory."""
    chosen = os.environ.get("LANE_SCREENSHOTS_DIR")
    path = Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "web-view-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def web_page(web_shots: Path) -> AsyncIterator[Browser]:
    chromium = os.environ.get("LANE_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: ./dev test installs it (apt-get install chromium)")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the web view's tests need Node 20 or newer")
    if not (TYPESCRIPT_DIR / "node_modules" / "playwright-core").is_dir():
        pytest.fail("clients/typescript/node_modules is incomplete: run its scripts/test.sh")
    process = await asyncio.create_subprocess_exec(
        node,
        "--import",
        "tsx",
        BRIDGE,
        chromium,
        cwd=TYPESCRIPT_DIR,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024,
    )
    opened = Browser(process, web_shots)
    try:
        yield opened
    finally:
        await opened.close()


# --- driving a lane -----------------------------------------------------------------------------


async def new_run(rpc: Rpc, lane_id: str, prompt: str = "go") -> RunScript:
    """A run on the new lane ``lane_id``, commanded through ``rpc``."""
    stub: Any = RpcStub(rpc)
    return await (await LaneScript.create(stub, lane_id)).start_run(prompt)


async def open_run(rpc: Rpc, lane_id: str, calls: list[str]) -> RunScript:
    """A run on a new lane whose first assistant message calls ``calls``."""
    run = await new_run(rpc, lane_id)
    shells = [(c, "shell", {"n": i}) for i, c in enumerate(calls)]
    await run.turn("calling tools", tool_calls=shells)
    return run


async def start_call(run: RunScript, call: str) -> int:
    intent = (await run.call(call).start()).intent
    assert intent is not None
    return intent.revision


async def progress(run: RunScript, call: str, value: str) -> int:
    return (await run.call(call).progress(value)).updates[-1].revision


async def stage(
    run: RunScript, call: str, value: str, *, error: bool = False
) -> pb.StageToolOutcomeResponse:
    staged = (await run.call(call).stage(value, is_error=error)).staged
    assert staged is not None
    return staged


async def finish(run: RunScript, status: snapshot_pb2.OperationResultStatus.ValueType) -> int:
    """End the run with ``status`` (a final assistant message first when it completes)."""
    if status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED:
        await run.turn("all done")
    return (await run.end(status)).revision
