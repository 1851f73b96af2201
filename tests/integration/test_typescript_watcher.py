"""The TypeScript watcher against the real service: a Node process follows a lane with the
shipped ``watchLane`` (clients/typescript/examples/follow.ts) while the test drives two runs over
gRPC. Every view the Node side folds is read as it arrives; each must equal the lane the Python
service captures at the same revision.

Needs ``clients/typescript/node_modules``: ``clients/typescript/scripts/test.sh`` installs it,
and ``./dev test`` runs that before pytest. Without it this test fails; it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.app.server import RunningServer
from tests.integration.lanes import (
    Probe,
    assistant,
    new_lane_id,
    presentation_check,
    result,
    text,
    tool_call,
    user,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

TYPESCRIPT_DIR = Path(__file__).resolve().parents[2] / "clients" / "typescript"
FOLLOWER = "examples/follow.ts"
#: Upper bound for any single wait on the Node process (start-up included).
WAIT_SECONDS = 15.0
#: One snapshot line can be long; asyncio's default line limit is 64 KiB.
LINE_LIMIT = 64 * 1024 * 1024

#: How far a tool call got, as a snapshot presents it; it only ever moves forward.
STATES = ("planned", "running", "settled", "placed")


@dataclass(frozen=True)
class View:
    """One line of the follower: the lane as its TypeScript fold shows it."""

    revision: int
    kind: str
    snapshot: snapshot_pb2.LaneSnapshot


class NodeFollower:
    """examples/follow.ts in a subprocess (``node --import tsx``, as the package's tests run
    TypeScript); background tasks read its stdout and stderr as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.views: list[View] = []
        self.failure: BaseException | None = None
        self._stderr = bytearray()
        self._eof = False
        self._changed = asyncio.Event()
        self._readers = [
            asyncio.create_task(self._read_views()),
            asyncio.create_task(self._read_stderr()),
        ]

    @classmethod
    async def start(
        cls, lane_id: str, port: int, target: int | None = None, token: str | None = None
    ) -> NodeFollower:
        node = shutil.which("node")
        if node is None:
            pytest.fail("node is not on PATH: the TypeScript client needs Node 20 or newer")
        if not (TYPESCRIPT_DIR / "node_modules" / "tsx").is_dir():
            pytest.fail(
                f"{TYPESCRIPT_DIR / 'node_modules'} is missing or incomplete: run "
                "clients/typescript/scripts/test.sh first (./dev test runs it before pytest)"
            )
        args = [FOLLOWER, lane_id, f"127.0.0.1:{port}"]
        if target is not None:
            args.append(str(target))
        # Node itself, not `npx tsx`: npm exec dies of SIGTERM without passing it on, which
        # would hide the follower's exit status and orphan it.
        process = await asyncio.create_subprocess_exec(
            node,
            "--import",
            "tsx",
            *args,
            cwd=TYPESCRIPT_DIR,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
            env={**os.environ, "LANE_TOKEN": token or ""},
        )
        return cls(process)

    @property
    def stderr(self) -> str:
        return self._stderr.decode(errors="replace")

    async def _read_views(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            while line := await stdout.readline():
                record = json.loads(line)
                snapshot = json_format.ParseDict(record["snapshot"], snapshot_pb2.LaneSnapshot())
                self.views.append(View(int(record["revision"]), record["kind"], snapshot))
                self._changed.set()
        except Exception as exc:  # reported by the waiter, with the follower's stderr
            self.failure = exc
        finally:
            self._eof = True
            self._changed.set()

    async def _read_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        while chunk := await stderr.read(4096):
            self._stderr.extend(chunk)

    def _problem(self, what: str) -> str:
        seen = [v.revision for v in self.views]
        return f"{what}; revisions seen {seen}; follower stderr:\n{self.stderr}"

    async def reach(self, revision: int) -> View:
        """Wait for the first view at or past ``revision``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        while True:
            if self.failure is not None:
                raise AssertionError(self._problem(f"bad follower line: {self.failure!r}"))
            found = next((v for v in self.views if v.revision >= revision), None)
            if found is not None:
                return found
            if self._eof:
                await self._finish()
                raise AssertionError(
                    self._problem(
                        f"the follower exited ({self.process.returncode}) before revision "
                        f"{revision}"
                    )
                )
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(self._problem(f"no view at revision {revision} in time"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def exit_status(self) -> int:
        """Wait for the follower to exit on its own; its exit status."""
        try:
            await asyncio.wait_for(self._finish(), WAIT_SECONDS)
        except TimeoutError:
            raise AssertionError(self._problem("the follower did not exit")) from None
        assert self.failure is None, self._problem(f"bad follower line: {self.failure!r}")
        code = self.process.returncode
        assert code is not None
        return code

    async def terminate(self) -> int:
        """SIGTERM, then its exit status."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await self.exit_status()

    async def close(self) -> None:
        """Make sure the process is gone and its pipes are drained (for ``finally``)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self._finish()

    async def _finish(self) -> None:
        await self.process.wait()
        await asyncio.gather(*self._readers)


# --- what the views must show ------------------------------------------------------------------


def differing_fields(a: snapshot_pb2.LaneSnapshot, b: snapshot_pb2.LaneSnapshot) -> list[str]:
    """Top-level LaneSnapshot fields that differ (for readable failures)."""
    return [f.name for f in a.DESCRIPTOR.fields if getattr(a, f.name) != getattr(b, f.name)]


def placed_results(snapshot: snapshot_pb2.LaneSnapshot) -> list[messages_pb2.ToolResultMessage]:
    """The tool results in the transcript, in transcript order."""
    return [
        e.message.message.tool_result
        for e in snapshot.transcript
        if e.WhichOneof("payload") == "message"
        and e.message.message.WhichOneof("message") == "tool_result"
    ]


def call_states(snapshot: snapshot_pb2.LaneSnapshot, calls: Sequence[str]) -> dict[str, str]:
    """Each call's state in ``snapshot``; a call is in at most one place."""
    rows: dict[str, str] = {}
    for row in snapshot.operation.running_tools:
        state = row.WhichOneof("state") or "running"
        rows[getattr(row, state).tool_call_id] = state
    placed = {r.tool_call_id for r in placed_results(snapshot)}
    presentation_check(snapshot, [c for c in calls if c in rows or c in placed])
    return {c: "placed" if c in placed else rows.get(c, "planned") for c in calls}


def settled_row(snapshot: snapshot_pb2.LaneSnapshot, call_id: str) -> snapshot_pb2.SettledTool:
    rows = [r.settled for r in snapshot.operation.running_tools if r.HasField("settled")]
    return next(r for r in rows if r.tool_call_id == call_id)


# --- driving the service -----------------------------------------------------------------------


class Driver:
    """Drives one lane through the RPCs; after each step the Probe checks that the Python fold
    equals a fresh capture, and the capture is kept by revision."""

    def __init__(self, stub: Any, probe: Probe) -> None:
        self.stub = stub
        self.probe = probe
        self.lane = probe.lane_id
        self.captures: dict[int, snapshot_pb2.LaneSnapshot] = {}

    async def checkpoint(self, active: Sequence[str] = ()) -> snapshot_pb2.LaneSnapshot:
        await self.probe.check(active)
        self.captures[self.probe.snapshot.revision] = self.probe.snapshot
        return self.probe.snapshot

    async def start_run(self, *blocks: messages_pb2.ContentBlock) -> str:
        """A run whose first assistant message calls ``blocks``; its operation id."""
        run = await self.stub.StartRun(pb.StartRunRequest(lane_id=self.lane, prompt=[user("go")]))
        await self.checkpoint()
        await self.settle(run.operation_id, assistant(text("calling tools"), *blocks))
        operation_id: str = run.operation_id
        return operation_id

    async def settle(self, run_id: str, message: messages_pb2.AssistantMessage) -> None:
        turn = await self.stub.StartTurn(
            pb.StartTurnRequest(lane_id=self.lane, operation_id=run_id)
        )
        await self.stub.SettleAssistantMessage(
            pb.SettleAssistantMessageRequest(
                lane_id=self.lane, operation_id=run_id, turn_id=turn.turn_id, message=message
            )
        )

    async def start_call(self, run_id: str, call_id: str) -> None:
        await self.stub.StartToolCall(
            pb.StartToolCallRequest(
                lane_id=self.lane, operation_id=run_id, tool_call_id=call_id, arguments_json="{}"
            )
        )

    async def progress(self, run_id: str, call_id: str, value: str) -> None:
        await self.stub.UpdateToolCall(
            pb.UpdateToolCallRequest(
                lane_id=self.lane,
                operation_id=run_id,
                tool_call_id=call_id,
                partial_result=result(value),
                checkpoint=True,
            )
        )

    async def stage(self, run_id: str, call_id: str, value: str) -> pb.StageToolOutcomeResponse:
        staged: pb.StageToolOutcomeResponse = await self.stub.StageToolOutcome(
            pb.StageToolOutcomeRequest(
                lane_id=self.lane,
                operation_id=run_id,
                tool_call_id=call_id,
                executed=pb.ExecutedOutcome(result=result(value)),
            )
        )
        return staged

    async def end_run(self, run_id: str, status: int) -> pb.EndRunResponse:
        end: pb.EndRunResponse = await self.stub.EndRun(
            pb.EndRunRequest(lane_id=self.lane, operation_id=run_id, status=status)  # type: ignore[arg-type]
        )
        return end


BATCH = ("a0", "a1", "a2")  # run 1: a parallel batch, the last call settles first
ABORTED = ("b0", "b1")  # run 2: b0 runs when the lane is aborted, b1 never starts


async def drive_parallel_batch(driver: Driver) -> None:
    """Run 1: a2 settles first and stays settled while a1 blocks it; a0 is placed while a1 still
    runs; then a1 settles and a1, a2 are placed together in source order. A final assistant
    message without tool calls lets the run complete."""
    run_id = await driver.start_run(*(tool_call(c, "shell", {"n": i}) for i, c in enumerate(BATCH)))
    await driver.checkpoint()
    for n, call in enumerate(BATCH):
        await driver.start_call(run_id, call)  # leaving `planned` in source order
        await driver.checkpoint(BATCH[: n + 1])
    await driver.progress(run_id, "a0", "a0 half way")
    await driver.checkpoint(BATCH)

    staged = await driver.stage(run_id, "a2", "a2 done")
    assert list(staged.placed_tool_call_ids) == []  # blocked behind a0 and a1
    snapshot = await driver.checkpoint(BATCH)
    assert call_states(snapshot, BATCH) == {"a0": "running", "a1": "running", "a2": "settled"}

    staged = await driver.stage(run_id, "a0", "a0 done")
    assert list(staged.placed_tool_call_ids) == ["a0"] and not staged.batch_complete
    snapshot = await driver.checkpoint(BATCH)
    assert call_states(snapshot, BATCH) == {"a0": "placed", "a1": "running", "a2": "settled"}

    staged = await driver.stage(run_id, "a1", "a1 done")
    assert list(staged.placed_tool_call_ids) == ["a1", "a2"] and staged.batch_complete
    snapshot = await driver.checkpoint(BATCH)
    assert call_states(snapshot, BATCH) == dict.fromkeys(BATCH, "placed")

    await driver.settle(run_id, assistant(text("all done"), stop=messages_pb2.STOP_REASON_STOP))
    await driver.checkpoint(BATCH)
    end = await driver.end_run(run_id, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    assert end.result.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    await driver.checkpoint(BATCH)


async def drive_aborted_run(driver: Driver) -> int:
    """Run 2: b0 is running (with progress) when the lane is aborted; b0 still stages its real
    result, and EndRun gives the never-started b1 its cancelled outcome. The final revision."""
    run_id = await driver.start_run(*(tool_call(c, "shell", {}) for c in ABORTED))
    await driver.checkpoint()
    await driver.start_call(run_id, "b0")
    await driver.checkpoint(["b0"])
    await driver.progress(run_id, "b0", "b0 half way")
    await driver.checkpoint(["b0"])

    abort = await driver.stub.AbortOperation(
        pb.AbortOperationRequest(lane_id=driver.lane, operation_id=run_id)
    )
    assert abort.newly_requested
    snapshot = await driver.checkpoint(["b0"])
    assert snapshot.operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING

    staged = await driver.stage(run_id, "b0", "b0 finished")
    assert staged.cancel_requested
    await driver.checkpoint(["b0"])
    end = await driver.end_run(run_id, snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    assert end.result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
    snapshot = await driver.checkpoint(ABORTED)
    assert not snapshot.HasField("operation")
    assert snapshot.revision == end.revision
    revision: int = end.revision
    return revision


# --- the test ----------------------------------------------------------------------------------


async def test_typescript_watcher_folds_what_the_service_captures(
    lane_stub: Any, lane_server: RunningServer
) -> None:
    probe = Probe(lane_stub, new_lane_id("ts-watch"))
    driver = Driver(lane_stub, probe)
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=probe.lane_id))
    created = await probe.start()
    driver.captures[created.revision] = created

    follower = await NodeFollower.start(probe.lane_id, lane_server.port)
    try:
        # Its first line is the snapshot, taken before anything else happens on the lane.
        first = await follower.reach(created.revision)
        assert (first.kind, first.revision) == ("snapshot", created.revision)

        await drive_parallel_batch(driver)
        final_revision = await drive_aborted_run(driver)
        final = await probe.capture()
        assert final.revision == final_revision

        last = await follower.reach(final_revision)
        # SIGTERM stops it cleanly (exit 0) while it is still following.
        status = await follower.terminate()
        assert status == 0, f"exit status {status} after SIGTERM; stderr:\n{follower.stderr}"
    finally:
        await follower.close()

    views = follower.views
    assert views[0] is first and views[-1] is last, "views after the final revision"
    assert [v.kind for v in views[1:]] == ["events"] * (len(views) - 1), "an unexpected re-snapshot"
    revisions = [v.revision for v in views]
    assert all(a < b for a, b in itertools.pairwise(revisions)), revisions

    # The final fold is the service's snapshot, field by field (message equality).
    assert last.revision == final.revision
    same = last.snapshot == final
    assert same, f"final fold differs in {differing_fields(last.snapshot, final)}"

    # At every revision the Python side captured, the Node fold is that capture.
    by_revision = {v.revision: v.snapshot for v in views}
    missing = sorted(set(driver.captures) - set(by_revision))
    assert not missing, f"no Node view at captured revisions {missing}; Node saw {revisions}"
    for revision, captured in sorted(driver.captures.items()):
        same = by_revision[revision] == captured
        assert same, (
            f"Node fold != capture at revision {revision}: "
            f"{differing_fields(by_revision[revision], captured)}"
        )

    # Presentation, on every Node view (also the staging commits no capture saw): each call is
    # in at most one place and only moves forward: planned, running, settled, placed.
    calls = (*BATCH, *ABORTED)
    states = [call_states(v.snapshot, calls) for v in views]
    for call in calls:
        ranks = [STATES.index(s[call]) for s in states]
        assert ranks == sorted(ranks), f"{call} went backwards: {[s[call] for s in states]}"

    # Run 1: the last call settled early and stayed settled (with its final result) while the
    # first was still running and then placed.
    early = [
        i for i, s in enumerate(states) if s["a2"] == "settled" and s["a0"] in ("running", "placed")
    ]
    assert any(states[i]["a0"] == "running" for i in early), "a2 never settled before a0"
    assert any(states[i]["a0"] == "placed" and states[i]["a1"] == "running" for i in early), (
        "a0 was never placed while a1 still ran and a2 stayed settled"
    )
    for i in early:
        assert settled_row(views[i].snapshot, "a2").result == result("a2 done")
    # a1 and a2 were placed by the same commit, in source order.
    placed_a1 = next(i for i, s in enumerate(states) if s["a1"] == "placed")
    placed_a2 = next(i for i, s in enumerate(states) if s["a2"] == "placed")
    assert placed_a1 == placed_a2
    order = [r.tool_call_id for r in placed_results(views[placed_a2].snapshot)]
    assert order == list(BATCH)

    # Run 2: the Node side saw the abort while b0 still ran, then b0's real result and b1's
    # cancelled one placed, and the run ended ABORTED.
    assert any(
        v.snapshot.operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING
        and s["b0"] == "running"
        for v, s in zip(views, states, strict=True)
    ), "no view of the aborting run with b0 running"
    tail = {r.tool_call_id: r for r in placed_results(last.snapshot)}
    assert [c.text.text for c in tail["b0"].content] == ["b0 finished"]
    assert not tail["b0"].is_error and tail["b1"].is_error
    assert last.snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED

    # A second follower given the final revision as its target snapshots once and exits 0 by
    # itself; its snapshot, assembled from a fresh WatchLane, is the capture too.
    late = await NodeFollower.start(probe.lane_id, lane_server.port, target=final.revision)
    try:
        status = await late.exit_status()
    finally:
        await late.close()
    assert status == 0, f"exit status {status} at its target; stderr:\n{late.stderr}"
    assert [(v.kind, v.revision) for v in late.views] == [("snapshot", final.revision)]
    same = late.views[0].snapshot == final
    assert same, f"fresh snapshot differs in {differing_fields(late.views[0].snapshot, final)}"
