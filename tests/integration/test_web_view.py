"""The web view in a real browser: headless Chromium (Debian's ``chromium``), driven by Playwright
(``playwright-core``, through clients/typescript/web/e2e/browser.ts), against the real service
with auth on, while the test drives lanes over gRPC one command at a time and reads what the
page shows after each.

- a parallel batch live: the last call settled and "waiting for placement" while the first still
  runs (with its progress and elapsed time); every row leaves exactly when its own entry is
  placed, in every state the page drew (recorded in the page as it draws), errors in red;
- Abort from the page's button reaches the service (AbortOperation), and the run ends aborted;
- an assistant message streaming in (AppendAssistantStream): a failed attempt and its scheduled
  retry with the time left, then the retried attempt growing partial by partial — thinking
  dimmed, the text ending in a cursor, a tool call drawn as its arguments are written — and the
  settled message taking the partial's place in the very redraw that settles it;
- a service restart: the page says it is reconnecting, then resumes after its revision (no new
  snapshot) and shows what was committed after the restart;
- token entry, and a lane of another namespace: absent from the list, NOT_FOUND on its page.

Screenshots of these moments are saved under the pytest base temp directory, in
``web-view-screenshots`` (or in ``$LANE_SCREENSHOTS_DIR``). Needs ``chromium`` (``./dev test``
installs it) and clients/typescript's node_modules (its scripts/test.sh); without either this
test fails, it never skips.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from lane.client.testing import LaneScript, RunScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import assistant, new_lane_id, text, tool_call

pytestmark = pytest.mark.asyncio(loop_scope="session")

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


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def service(session_database_url: str) -> AsyncIterator[Service]:
    settings = Settings(
        database_url=session_database_url, auth_tokens={TOKEN_A: "team-a", TOKEN_B: "team-b"}
    )
    running = await start_server(settings, listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    holder = Service(settings, running)
    try:
        yield holder
    finally:
        await holder.running.stop(grace=0.5)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: $LANE_SCREENSHOTS_DIR, or web-view-screenshots in the pytest
    base temp directory."""
    chosen = os.environ.get("LANE_SCREENSHOTS_DIR")
    path = Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "web-view-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def browser(shots: Path) -> AsyncIterator[Browser]:
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
    opened = Browser(process, shots)
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


# --- reading the page ---------------------------------------------------------------------------


def where(state: dict[str, Any], calls: list[str]) -> dict[str, str]:
    """Each call's place on the page: "running" or "settled" (a row), "placed" (a transcript
    result) or "planned" (neither). Fails when a call is in two places."""
    rows = {r["id"]: r["state"] for r in state["rows"]}
    placed = {r["id"] for r in state["results"]}
    both = sorted(set(rows) & placed)
    assert not both, f"rows still shown for placed calls {both} at revision {state['revision']}"
    return {c: "placed" if c in placed else rows.get(c, "planned") for c in calls}


def row(state: dict[str, Any], call: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in state["rows"] if r["id"] == call)
    return found


ORDER = ("planned", "running", "settled", "placed")


# --- the tests ----------------------------------------------------------------------------------


async def test_a_parallel_batch_live(service: Service, browser: Browser) -> None:
    rpc = Rpc(service, TOKEN_A)
    lane_id = new_lane_id("web-batch")
    batch = ["a0", "a1", "a2"]
    run = await open_run(rpc, lane_id, batch)
    await browser.open_lane(service.origin, lane_id)

    for call in batch:
        revision = await start_call(run, call)
    revision = await progress(run, "a0", "a0 half way")
    state = await browser.at_revision(revision)
    assert where(state, batch) == dict.fromkeys(batch, "running")
    assert state["operation"]["id"] == run.operation_id and state["abortEnabled"]
    assert "a0 half way" in row(state, "a0")["text"]  # the latest progress
    assert re.search(r"running \d+\.\ds", row(state, "a0")["text"])  # the elapsed time

    # The last call settles first: settled, waiting for placement, while a0 and a1 run.
    staged = await stage(run, "a2", "a2 done")
    assert list(staged.placed_tool_call_ids) == []
    state = await browser.at_revision(staged.revision)
    assert where(state, batch) == {"a0": "running", "a1": "running", "a2": "settled"}
    assert "waiting for placement" in row(state, "a2")["text"]
    assert "a2 done" in row(state, "a2")["text"]
    await browser.screenshot("batch-1-a2-waiting-while-a0-runs")

    # a0 is placed (its row leaves, its entry appears); a2 still waits behind a1.
    staged = await stage(run, "a0", "a0 done")
    assert list(staged.placed_tool_call_ids) == ["a0"]
    state = await browser.at_revision(staged.revision)
    assert where(state, batch) == {"a0": "placed", "a1": "running", "a2": "settled"}
    await browser.screenshot("batch-2-a0-placed-a2-still-waiting")

    # a1 fails: a1 and a2 are placed together, in source order; the error is red.
    staged = await stage(run, "a1", "a1 broke", error=True)
    assert list(staged.placed_tool_call_ids) == ["a1", "a2"]
    state = await browser.at_revision(staged.revision)
    assert where(state, batch) == dict.fromkeys(batch, "placed")
    assert [r["id"] for r in state["results"]] == batch
    colors = {r["id"]: (r["error"], r["color"]) for r in state["results"]}
    assert colors["a1"] == (True, RED)
    assert colors["a0"][0] is False and colors["a0"][1] != RED

    revision = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    state = await browser.at_revision(revision)
    assert state["operation"] is None and state["lastResult"] == "completed"
    await browser.screenshot("batch-3-completed")

    # Every state the page drew: no call in two places, none lost once started, none going
    # back; so each row left exactly when its own entry was placed.
    drawn = await browser.recorded()
    assert [s["revision"] for s in drawn] == sorted({s["revision"] for s in drawn})
    places = [where(s, batch) for s in drawn]
    for call in batch:
        ranks = [ORDER.index(p[call]) for p in places]
        assert ranks == sorted(ranks), f"{call} went back: {[p[call] for p in places]}"


async def test_abort_from_the_button(service: Service, browser: Browser) -> None:
    rpc = Rpc(service, TOKEN_A)
    lane_id = new_lane_id("web-abort")
    run = await open_run(rpc, lane_id, ["b0", "b1"])
    await start_call(run, "b0")
    revision = await progress(run, "b0", "b0 working")
    await browser.open_lane(service.origin, lane_id)
    state = await browser.at_revision(revision)
    assert (
        state["operation"] == {"id": run.operation_id, "status": "open"} and state["abortEnabled"]
    )

    await browser.call("click", selector="button#abort")
    state = await browser.state_when("s.operation && s.operation.status === 'aborting'")
    assert not state["abortEnabled"]
    # The page shows what the service committed: the operation is aborting there.
    snapshot = (await rpc("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
    assert snapshot.operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING
    assert snapshot.revision == state["revision"]
    await browser.screenshot("abort-1-requested-from-the-button")

    # The tool sees the abort and stops; the never-started b1 gets its cancelled result.
    staged = await stage(run, "b0", "b0 stopped")
    assert staged.cancel_requested
    revision = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    state = await browser.at_revision(revision)
    assert state["operation"] is None
    assert (state["lastResult"], state["lastResultColor"]) == ("aborted", RED)
    results = {r["id"]: r for r in state["results"]}
    assert "b0 stopped" in results["b0"]["text"]
    assert (results["b1"]["error"], results["b1"]["color"]) == (True, RED)
    await browser.screenshot("abort-2-ended-aborted")


def thinking(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent(thinking=value))


def partial(*blocks: messages_pb2.ContentBlock) -> pb.StreamedPartial:
    """One streamed partial: the message so far."""
    return pb.StreamedPartial(message=assistant(*blocks, stop=messages_pb2.STOP_REASON_PENDING))


async def test_an_assistant_message_streaming_in(service: Service, browser: Browser) -> None:
    rpc = Rpc(service, TOKEN_A)
    lane_id = new_lane_id("web-stream")
    run = await new_run(rpc, lane_id, "read it")
    turn = replace(run.aim, turn_id=await run.start_turn())
    await browser.open_lane(service.origin, lane_id)
    await browser.call("eval", expr=RECORD_STREAM_JS)

    async def stream(*blocks: messages_pb2.ContentBlock) -> dict[str, Any]:
        """Commit ``blocks`` as the latest partial; what the page drew for it."""
        appended = await rpc(
            "AppendAssistantStream",
            turn.request(pb.AppendAssistantStreamRequest, partials=[partial(*blocks)]),
        )
        return await browser.stream_at(appended.revision)

    # A first attempt fails mid-stream: the failed message is placed (red), the partial is gone,
    # and the retry line names the attempt scheduled and the time left until it.
    state = await stream(text("Let me"))
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("text", "assistant Let me▍", True)
    ]
    failed = assistant(text("Let me"), stop=messages_pb2.STOP_REASON_ERROR)
    failed.error_message = "529 overloaded"
    scheduled = await rpc(
        "ScheduleRetry",
        turn.request(
            pb.ScheduleRetryRequest,
            failed_message=failed,
            max_attempts=3,
            delay_ms=60_000,
            error_message="529 overloaded",
        ),
    )
    state = await browser.stream_at(scheduled.revision)
    assert state["streaming"] is None
    assert state["transcript"][-1] == {
        "kind": "error",
        "text": "assistant error: 529 overloaded",
        "color": RED,
        "fontStyle": "normal",
    }
    retry = state["retry"]
    at = scheduled.next_attempt_time
    assert (retry["attempt"], retry["maxAttempts"]) == (2, 3)
    # protobuf-es's timestampMs rounds the nanoseconds to the nearest millisecond.
    assert retry["nextAttemptMs"] == at.seconds * 1000 + (at.nanos + 500_000) // 1_000_000
    left = re.fullmatch(
        r"model call failed: 529 overloaded · attempt 2 of 3 in (\d+\.\d)s", retry["text"]
    )
    assert left is not None, retry["text"]
    assert 0 < float(left[1]) <= 60.0
    await browser.screenshot("stream-1-retry-scheduled")
    started = await rpc("StartRetry", turn.request(pb.StartRetryRequest))
    state = await browser.stream_at(started.revision)
    assert state["retry"] is None and state["streaming"] is None

    # The retried attempt streams: thinking first, dimmed and set apart from the text.
    state = await stream(thinking("The user wants"))
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("thinking", "thinking The user wants", False)
    ]
    assert (state["streaming"][0]["color"], state["streaming"][0]["fontStyle"]) == (DIM, "italic")
    first_revision = state["revision"]

    # The text grows, ending in the cursor while it is the last block.
    think = thinking("The user wants the README.")
    state = await stream(think, text("I will"))
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("thinking", "thinking The user wants the README.", False),
        ("text", "assistant I will▍", True),
    ]
    dimmed, plain = state["streaming"]
    assert (plain["color"], plain["fontStyle"]) != (DIM, "italic")
    assert (dimmed["color"], dimmed["fontStyle"]) == (DIM, "italic")

    # A tool call being written: its arguments so far, cut JSON as it is; the text is no longer
    # last, so it has no cursor.
    state = await stream(
        think, text("I will read it."), tool_call("r1", "read_file", '{"path": "REA')
    )
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("thinking", "thinking The user wants the README.", False),
        ("text", "assistant I will read it.", False),
        ("call", '→ read_file {"path": "REA …', False),
    ]
    await browser.screenshot("stream-2-thinking-text-and-a-call-being-written")

    # Settled: the partial is gone and the message is in the transcript, thinking still dimmed,
    # the call with its whole arguments.
    read = tool_call("r1", "read_file", {"path": "README.md"})
    settled = (
        await run.settle(turn.turn_id, message=assistant(think, text("I will read it."), read))
    ).settled
    state = await browser.stream_at(settled.revision)
    assert state["streaming"] is None and state["retry"] is None
    message = [(e["kind"], e["text"]) for e in state["transcript"][-3:]]
    assert message == [
        ("thinking", "thinking The user wants the README."),
        ("assistant", "assistant I will read it."),
        ("call", '→ read_file {"path":"README.md"}'),
    ]
    assert (state["transcript"][-3]["color"], state["transcript"][-3]["fontStyle"]) == (
        DIM,
        "italic",
    )
    await browser.screenshot("stream-3-settled")

    # Every state the page drew of the retried attempt: the partial only grew, and gave way to
    # the settled message in one redraw — never both on the page, never neither.
    recorded: list[dict[str, Any]] = await browser.call("eval", expr="window.__streams")
    drawn = [s for s in recorded if s["revision"] >= first_revision]
    assert [s["revision"] for s in drawn] == sorted({s["revision"] for s in drawn})
    assert drawn[-1]["revision"] == settled.revision
    lengths = []
    for s in drawn:
        placed = ("assistant", "assistant I will read it.") in [
            (e["kind"], e["text"]) for e in s["transcript"]
        ]
        assert (s["streaming"] is None) == placed, s
        assert placed == (s["revision"] >= settled.revision), s
        if s["streaming"] is not None:
            lengths.append(sum(len(b["text"]) for b in s["streaming"]))
    assert lengths == sorted(lengths) and len(lengths) == 3

    await start_call(run, "r1")
    await stage(run, "r1", "# lane")
    revision = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    state = await browser.at_revision(revision)
    assert state["lastResult"] == "completed"


async def test_queued_messages_show_until_a_run_takes_them(
    service: Service, browser: Browser
) -> None:
    rpc = Rpc(service, TOKEN_A)
    stub: Any = RpcStub(rpc)
    script = await LaneScript.create(stub, new_lane_id("web-queue"))
    await script.enqueue("Also list the files.", snapshot_pb2.QUEUE_KIND_STEER)
    queued = await script.enqueue("Then tidy up.", snapshot_pb2.QUEUE_KIND_NEXT_RUN)
    await browser.open_lane(service.origin, script.lane_id)
    state = await browser.at_revision(queued.revision)
    assert state["queued"] == ["queued steer Also list the files.", "queued next run Then tidy up."]
    await browser.screenshot("queue-1-before-the-run")
    run = await script.start_run("go")
    state = await browser.at_revision(run.started.revision)
    assert state["queued"] == []  # the run took them into its transcript


async def test_resume_after_a_service_restart(service: Service, browser: Browser) -> None:
    rpc = Rpc(service, TOKEN_A)
    lane_id = new_lane_id("web-restart")
    run = await open_run(rpc, lane_id, ["c0"])
    revision = await start_call(run, "c0")
    await browser.open_lane(service.origin, lane_id)
    before = await browser.at_revision(revision)
    assert where(before, ["c0"]) == {"c0": "running"} and before["snapshots"] == 1

    stopped = asyncio.create_task(service.restart())
    try:
        state = await browser.state_when("s.connection === 'reconnecting'")
        assert re.match(r"reconnecting · attempt \d+ · ", state["connectionText"])
        # Still the lane as last seen, while the service is away.
        assert state["revision"] == before["revision"] and where(state, ["c0"])["c0"] == "running"
        await browser.screenshot("restart-1-reconnecting")
    finally:
        await stopped

    # Committed after the restart, seen live: the page resumed after its revision (no second
    # snapshot) and shows the result placed.
    staged = await stage(run, "c0", "c0 done after the restart")
    state = await browser.at_revision(staged.revision)
    assert where(state, ["c0"]) == {"c0": "placed"}
    assert state["snapshots"] == 1, "the page re-snapshotted instead of resuming"
    assert state["connectionText"] == "live"
    await browser.screenshot("restart-2-resumed")
    await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)


async def test_token_entry_and_another_namespace(service: Service, browser: Browser) -> None:
    ours, theirs = new_lane_id("web-team-a"), new_lane_id("web-team-b")
    await Rpc(service, TOKEN_A)("CreateLane", pb.CreateLaneRequest(lane_id=ours))
    await Rpc(service, TOKEN_B)("CreateLane", pb.CreateLaneRequest(lane_id=theirs))

    # Without a token, the service refuses and the page asks for one.
    await browser.call("goto", url=f"{service.origin}/")
    await browser.call("eval", expr="sessionStorage.clear()")
    await browser.call("goto", url=f"{service.origin}/index.html#/")  # a new page load
    message = await browser.wait(
        "document.body.dataset.page === 'token'"
        " && document.querySelector('#token-form').textContent"
    )
    assert "UNAUTHENTICATED" in message
    await browser.screenshot("token-1-asked")

    await browser.call("fill", selector="#token", value=TOKEN_A)
    await browser.call("click", selector="#token-form button[type=submit]")
    lanes = await browser.wait(
        f"""(() => {{
          const ids = [...document.querySelectorAll("tr.lane")].map((r) => r.dataset.laneId);
          return ids.includes("{ours}") ? ids : null;
        }})()"""
    )
    assert theirs not in lanes  # team-b's lane is not listed for team-a's token
    await browser.screenshot("token-2-lanes-of-team-a")

    # Asked for by name, it does not exist for this token.
    await browser.call("goto", url=f"{service.origin}/#/lanes/{theirs}")
    fatal = await browser.wait(
        "document.querySelector('#fatal') && document.querySelector('#fatal').textContent"
    )
    assert fatal.startswith("NOT_FOUND LANE_NOT_FOUND")
    color = await browser.call(
        "eval", expr="getComputedStyle(document.querySelector('#fatal')).color"
    )
    assert color == RED
    await browser.screenshot("token-3-other-namespace-not-found")


async def test_a_malformed_lane_address_is_said_so(service: Service, browser: Browser) -> None:
    lane_id = new_lane_id("web-address")
    await Rpc(service, TOKEN_A)("CreateLane", pb.CreateLaneRequest(lane_id=lane_id))
    await browser.open_lane(service.origin, lane_id)  # live
    # An address whose escape is malformed: decoding it throws URIError. The page says the
    # address names no lane, and nothing of the lane's page stays up calling itself live.
    await browser.call("eval", expr="location.hash = '#/lanes/%E0%A4%A'")
    message = await browser.wait(
        "document.body.dataset.page === 'invalid'"
        " && document.querySelector('#bad-address').textContent"
    )
    assert message.startswith("not a valid lane address: #/lanes/%E0%A4%A")
    assert await browser.call("eval", expr="document.querySelector('#connection')") is None
    assert await browser.call("eval", expr="document.querySelector('#lane')") is None
    await browser.screenshot("address-1-malformed")
    # Its link leads back to the lanes.
    await browser.call("click", selector="#bad-address a")
    await browser.wait("document.body.dataset.page === 'lanes'")
