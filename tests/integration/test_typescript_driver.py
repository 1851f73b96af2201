"""The TypeScript Driver against the real service, in Node processes of its own
(clients/typescript/test/driver-process.ts), checked with the crash tests' durability checks
(tests/crash/checks.py: nothing staged lost, nothing placed twice, no unsafe replay, every run
ended, a watcher's fold equals the capture, docs/recovery.md's takeover cases).

- kill -9 of a Node driver in the middle of a parallel batch, a second Node driver takes the
  run over: the SAFE call is replayed, the NEVER call interrupted (its latest checkpoint), the
  staged calls placed and never run again; a TypeScript watcher follows the lane throughout.
- fencing: a Node driver whose lease is renewed keeps other drivers out (LEASE_HELD); frozen
  (SIGSTOP) until its lease lapses, it is taken over, and once thawed its next command is
  refused STALE_LEASE: it exits with LeaseLost and commits nothing more.
- abort by anyone: another client's AbortOperation reaches running tools as their AbortSignal;
  a tool that honours it stages its own result, one that ignores it gets an INTERRUPTED result
  after the grace period, and the run ends ABORTED.

The Node tools append every execution to a file (synced) before their effect begins; the test
copies it into ``crash_executions`` for the checks, as the Python crash driver records them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.app.server import RunningServer
from tests.crash.checks import INTERRUPTED_MARKER, LaneFindings, check_lane, load, traces
from tests.crash.recording import ensure_executions_table
from tests.integration.lanes import new_lane_id
from tests.integration.test_typescript_watcher import NodeFollower
from tests.integration.typescript_driver import TYPESCRIPT_DIR, NodeDriver, start_node_driver

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: How long any wait for the drivers' progress may take.
WAIT_SECONDS = 30.0
EXIT_LEASE_LOST = 3


async def wait_for_state(
    stub: Any,
    lane_id: str,
    operation_id: str,
    ready: Callable[[pb.OperationState], bool],
    driver: NodeDriver,
) -> pb.OperationState:
    """Poll GetOperation until ``ready`` holds (the driver's progress, not a timing)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while True:
        try:
            answer = await stub.GetOperation(
                pb.GetOperationRequest(lane_id=lane_id, operation_id=operation_id)
            )
            state: pb.OperationState = answer.state
            if ready(state):
                return state
        except grpc.aio.AioRpcError as err:
            # The driver has not created the lane or opened the run yet.
            if err.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                raise
        assert driver.process.returncode is None, f"the driver exited early:\n{driver.tail()}"
        assert loop.time() < deadline, f"the run did not get there; driver log:\n{driver.tail()}"
        await asyncio.sleep(0.05)


def statuses(state: pb.OperationState) -> dict[str, tuple[int, bool]]:
    """Call id → (status, has a checkpoint)."""
    return {c.tool_call_id: (c.status, c.HasField("checkpoint")) for c in state.tool_calls}


def execution_rows(path: Path) -> list[dict[str, Any]]:
    """The Node tools' execution records (none when no tool ran)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def copy_executions(conn: psycopg.AsyncConnection[Any], rows: list[dict[str, Any]]) -> None:
    """The Node tools' execution records into ``crash_executions``, where the checks read."""
    await ensure_executions_table(conn)
    for row in rows:
        await conn.execute(
            "INSERT INTO crash_executions (lane_id, operation_id, tool_call_id, attempt_no,"
            " started_at, driver_id, replayed) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                row["lane_id"],
                row["operation_id"],
                row["tool_call_id"],
                row["attempt_no"],
                row["started_at"],
                row["driver_id"],
                row["replayed"],
            ),
        )


def crash_config(
    target: str, lane_id: str, driver_id: str, executions: Path, plan: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "kind": "crash",
        "target": target,
        "lane": lane_id,
        "driverId": driver_id,
        "executions": str(executions),
        "leaseSeconds": 1,
        "plan": plan,
        "operationId": f"{lane_id}.r0",
        **extra,
    }


async def checked(
    database_url: str, stub: Any, lane_id: str, executions: Path, watcher: Any = None
) -> LaneFindings:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await copy_executions(conn, execution_rows(executions))
        findings = await check_lane(conn, stub, lane_id, watcher)
    assert findings.violations == [], findings.violations
    return findings


async def test_kill_9_mid_batch_and_a_second_node_driver_takes_over(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("ts-crash")
    operation_id = f"{lane_id}.r0"
    # Long enough to be killed in the middle (the kill follows the first checkpoints); the
    # replay runs it whole again, with the arguments its intent stored.
    slow = {"steps": 10, "delay": 0.2, "checkpoint": True}
    plan = {
        "mode": "parallel",
        "turns": [
            [
                {"name": "safe_read", **slow},
                {"name": "never_write", **slow},
                {"name": "never_write", "steps": 1, "delay": 0.05, "checkpoint": True},
                {"name": "nosuch", "steps": 1, "delay": 0},
            ],
            [{"name": "safe_read", "steps": 1, "delay": 0.05}],
        ],
    }
    executions = tmp_path / "executions.jsonl"
    c0, c1, c2, c3 = (f"{operation_id}.t0.c{i}" for i in range(4))

    created = await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    follower = await NodeFollower.start(lane_id, lane_server.port)
    first = await start_node_driver(
        crash_config(target, lane_id, "node-a", executions, plan), tmp_path / "a.log"
    )
    second: NodeDriver | None = None
    try:
        await follower.reach(created.revision)

        def mid_batch(state: pb.OperationState) -> bool:
            calls = statuses(state)
            return (
                calls.get(c0) == (pb.TOOL_CALL_STATUS_EFFECT_PENDING, True)
                and calls.get(c1) == (pb.TOOL_CALL_STATUS_EFFECT_PENDING, True)
                and calls.get(c2, (0, False))[0] == pb.TOOL_CALL_STATUS_OUTCOME_READY
                and calls.get(c3, (0, False))[0] == pb.TOOL_CALL_STATUS_OUTCOME_READY
            )

        await wait_for_state(lane_stub, lane_id, operation_id, mid_batch, first)
        first.process.send_signal(signal.SIGKILL)
        code, _ = await first.finish()
        assert code == -signal.SIGKILL

        second = await start_node_driver(
            crash_config(target, lane_id, "node-b", executions, plan, recover=True),
            tmp_path / "b.log",
        )
        result = await second.result()
        assert result["status"] == "COMPLETED", second.tail()
        snapshot = (
            await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
        ).snapshot
        last = await follower.reach(snapshot.revision)
    finally:
        first.kill()
        if second is not None:
            second.kill()
        await follower.close()

    findings = await checked(session_database_url, lane_stub, lane_id, executions, last.snapshot)
    assert findings.batch_takeovers == 1 and findings.takeovers == 1
    assert findings.replays == 1  # c0, SAFE
    assert findings.unsafe_recoveries == 1  # c1, NEVER: interrupted
    assert findings.staged_at_takeover == 2  # c2 and c3 waited behind c0 and c1
    assert findings.runs_completed == 1

    async with await psycopg.AsyncConnection.connect(session_database_url, autocommit=True) as conn:
        data = await load(conn, lane_id)
    calls = traces(data.events)
    assert [len(data.executions.get(c, [])) for c in (c0, c1, c2, c3)] == [2, 1, 1, 0]
    interrupted = calls[c1].ends[0].tool_end.result
    texts = [b.text.text for b in interrupted.content]
    assert texts[-1].startswith(INTERRUPTED_MARKER) and texts[0].startswith(f"{c1} step ")
    assert calls[c0].ends[0].tool_end.result.content[0].text.text.endswith("(attempt 2)")
    # The watcher never had to start again: one snapshot, then every group folded.
    assert [v.kind for v in follower.views].count("snapshot") == 1


async def test_renewed_lease_fences_a_frozen_node_driver_out_after_takeover(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("ts-fence")
    operation_id = f"{lane_id}.r0"
    plan = {
        "mode": "sequential",
        "turns": [
            [{"name": "never_write", "steps": 40, "delay": 0.1, "checkpoint": True}],
            [{"name": "safe_read", "steps": 20, "delay": 0.1}],
        ],
    }
    executions = tmp_path / "executions.jsonl"
    call = f"{operation_id}.t0.c0"
    holder = await start_node_driver(
        crash_config(target, lane_id, "node-a", executions, plan), tmp_path / "a.log"
    )
    taker: NodeDriver | None = None
    try:
        # Checkpoint 15 of the call: 1.5 s of work, past the 1 s lease, so it was renewed.
        def far_enough(state: pb.OperationState) -> bool:
            checkpoint = next(
                (c.checkpoint for c in state.tool_calls if c.tool_call_id == call), None
            )
            return checkpoint is not None and any(
                b.text.text == f"{call} step 15/40" for b in checkpoint.content
            )

        await wait_for_state(lane_stub, lane_id, operation_id, far_enough, holder)
        with pytest.raises(grpc.aio.AioRpcError) as held:
            await lane_stub.AcquireOperation(
                pb.AcquireOperationRequest(
                    lane_id=lane_id, operation_id=operation_id, driver_id="intruder"
                )
            )
        assert held.value.code() == grpc.StatusCode.FAILED_PRECONDITION, held.value

        holder.process.send_signal(signal.SIGSTOP)
        taker = await start_node_driver(
            crash_config(target, lane_id, "node-b", executions, plan, recover=True),
            tmp_path / "b.log",
        )

        def taken(state: pb.OperationState) -> bool:
            return (
                state.lease.driver_id == "node-b"
                and state.phase == pb.RUN_PHASE_TOOLS
                and (
                    statuses(state).get(f"{operation_id}.t1.c0", (0, False))[0]
                    == pb.TOOL_CALL_STATUS_EFFECT_PENDING
                )
            )

        await wait_for_state(lane_stub, lane_id, operation_id, taken, taker)
        holder.process.send_signal(signal.SIGCONT)
        code, _ = await holder.finish()
        assert code == EXIT_LEASE_LOST, holder.tail()
        assert "STALE_LEASE" in holder.tail() or "lease lost" in holder.tail()
        result = await taker.result()
        assert result["status"] == "COMPLETED", taker.tail()
    finally:
        holder.process.send_signal(signal.SIGCONT) if holder.process.returncode is None else None
        holder.kill()
        if taker is not None:
            taker.kill()

    findings = await checked(session_database_url, lane_stub, lane_id, executions)
    assert findings.takeovers == 1 and findings.unsafe_recoveries == 1
    snapshot = (
        await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    ).snapshot
    assert snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED


async def test_abort_by_another_client_reaches_tools_and_the_grace_period_interrupts(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    lane_id = new_lane_id("ts-abort")
    driver = await start_node_driver(
        {"kind": "abort-grace", "target": target, "lane": lane_id, "graceMs": 300},
        tmp_path / "driver.log",
    )
    try:
        operation_id = ""

        async def running() -> pb.OperationState:
            nonlocal operation_id
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_SECONDS
            while not operation_id:
                try:
                    snapshot = (
                        await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
                    ).snapshot
                    operation_id = snapshot.operation.id
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                assert loop.time() < deadline, driver.tail()
                await asyncio.sleep(0.05)
            return await wait_for_state(
                lane_stub,
                lane_id,
                operation_id,
                lambda s: (
                    len(s.tool_calls) == 3
                    and all(c.status == pb.TOOL_CALL_STATUS_EFFECT_PENDING for c in s.tool_calls)
                    and any(c.HasField("checkpoint") for c in s.tool_calls)
                ),
                driver,
            )

        state = await running()
        abort = await lane_stub.AbortOperation(
            pb.AbortOperationRequest(lane_id=lane_id, operation_id=operation_id)
        )
        assert abort.newly_requested
        result = await driver.result()
    finally:
        driver.kill()
    assert result == {"status": "ABORTED", "turns": 1, "signalSeen": True}, driver.tail()

    findings = await checked(session_database_url, lane_stub, lane_id, tmp_path / "none.jsonl")
    assert findings.runs_aborted == 1
    async with await psycopg.AsyncConnection.connect(session_database_url, autocommit=True) as conn:
        data = await load(conn, lane_id)
    calls = traces(data.events)
    by_name = {c.tool_name: c for c in calls.values() if c.tool_name == "stubborn"}
    stubborn = by_name["stubborn"].ends[0].tool_end
    texts = [b.text.text for b in stubborn.result.content]
    assert texts[0] == "halfway" and texts[-1].startswith(INTERRUPTED_MARKER), texts
    polite = [c for c in calls.values() if c.tool_name == "polite"]
    assert len(polite) == 2 and len(state.tool_calls) == 3
    for trace in polite:
        end = trace.ends[0].tool_end
        assert end.is_error and [b.text.text for b in end.result.content] == [
            "stopped on the abort signal"
        ]
        assert not trace.ends[0].recovery


async def test_the_agent_example_runs_a_shell_command_and_a_file_read_at_once(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    """examples/agent.ts, as the README runs it: both tools' results placed in source order,
    the file read staged while the shell command still ran."""
    node = shutil.which("node")
    assert node is not None, "node is not on PATH"
    lane_id = new_lane_id("ts-agent")
    process = await asyncio.create_subprocess_exec(
        node,
        "--import",
        "tsx",
        "examples/agent.ts",
        lane_id,
        f"127.0.0.1:{lane_server.port}",
        cwd=TYPESCRIPT_DIR,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), WAIT_SECONDS)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text
    assert "ended COMPLETED after 2 turns" in text, text

    snapshot = (
        await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    ).snapshot
    assert snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    async with await psycopg.AsyncConnection.connect(session_database_url, autocommit=True) as conn:
        data = await load(conn, lane_id)
    calls = traces(data.events)
    assert len(calls) == 2
    shell, read = (
        next(t for t in calls.values() if t.tool_name == n) for n in ("shell", "read_file")
    )
    assert read.ends[0].revision < shell.ends[0].revision  # ran at once: the read finished first
    assert read.placed[0].revision > shell.ends[0].revision  # yet placed after the shell's result
    shell_text = shell.ends[0].tool_end.result.content[0].text.text
    assert not shell.ends[0].tool_end.is_error and "package.json" in shell_text
    assert '"name": "@lane/client"' in read.ends[0].tool_end.result.content[0].text.text
