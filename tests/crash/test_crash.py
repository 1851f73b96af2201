"""kill -9 of services and drivers (docs/contract.md: invariant 4, Targets).

One randomized run of the harness (real service and driver processes, at least 20 kills), then
focused deterministic cases of docs/recovery.md, each against a real
``python -m lane.server.app`` and real driver processes. A driver process is the shipped
``lane.client`` Driver (:mod:`tests.crash.driver`); a second one takes a killed one's run over
with ``Driver.recover``:

(i)   a driver (and the service) killed right after a staging commit: the takeover places the
      staged result; the call never runs again;
(ii)  a driver killed while a NEVER call is effect_pending with a checkpoint: the takeover's
      INTERRUPTED result carries the checkpoint, its tool_end is tagged recovery, no new
      tool_start;
(iii) a SAFE call: ReplayToolCall, tool_start tagged recovery with the persisted arguments, one
      re-execution, tool_end tagged recovery;
(iv)  an aborted run whose driver was killed: the service ends it by itself;
(v)   a stale driver (old token) after a takeover: refused with ABORTED STALE_LEASE, nothing
      changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from lane.client.errors import lane_error
from lane.v1 import events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.domain.leases import grants
from tests.crash.checks import INTERRUPTED_MARKER, LaneFindings, check_lane, load
from tests.crash.driver import EXIT_DONE, EXIT_LEASE_LOST
from tests.crash.harness import (
    DriverProcess,
    HarnessConfig,
    ServiceProcess,
    Stub,
    call_statuses,
    lane_stub,
    open_operation,
    reap,
    run_harness,
    spawn_driver,
    tail,
    wait_until,
)
from tests.crash.recording import NEVER_TOOL, SAFE_TOOL, ensure_executions_table

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_SECONDS = 3


# -- the randomized run --------------------------------------------------------------------------


async def test_random_kills_lose_nothing(fresh_database_url: str, tmp_path: Path) -> None:
    lines: list[str] = []
    report = await run_harness(
        HarnessConfig(
            database_url=fresh_database_url,
            workdir=tmp_path,
            seed=20240611,
            kills=22,
            lanes=3,
            services=2,
            progress=lines.append,
        )
    )
    summary = report.summary()
    print(summary)
    assert report.violations == [], summary + "\n" + "\n".join(lines)
    assert report.service_errors == [], summary
    assert report.kills >= 20, summary
    assert report.service_kills >= 1 and report.driver_kills >= 1, summary
    # Every recovery path was taken at least once.
    assert report.takeovers >= 1, summary
    assert report.replays >= 1, summary
    assert report.unsafe_recoveries >= 1, summary
    assert report.reconciliations >= 1, summary
    assert report.parallel_runs >= 1 and report.sequential_runs >= 1, summary


# -- the focused cases ---------------------------------------------------------------------------


@dataclass
class Rig:
    """One real service process, a database connection, a stub, and the drivers started."""

    service: ServiceProcess
    conn: psycopg.AsyncConnection[Any]
    stub: Stub
    database_url: str
    workdir: Path
    drivers: list[DriverProcess] = field(default_factory=list)

    async def driver(self, lane_id: str, name: str, plan: dict[str, Any]) -> DriverProcess:
        started = await spawn_driver(
            [self.service.target],
            lane_id,
            f"{lane_id}-{name}",
            self.database_url,
            self.workdir,
            lease_seconds=LEASE_SECONDS,
            plan=json.dumps(plan),
        )
        self.drivers.append(started)
        return started

    async def finished(self, driver: DriverProcess, status: int = EXIT_DONE) -> None:
        try:
            async with asyncio.timeout(60):
                code = await driver.process.wait()
        except TimeoutError:
            pytest.fail(f"{driver.driver_id} did not finish:\n{tail(driver.log)}")
        assert code == status, f"{driver.driver_id} exited {code}:\n{tail(driver.log)}"

    async def statuses(self, lane_id: str) -> dict[str, tuple[str, bool]]:
        return {c: (s, cp) for c, s, _, cp in await call_statuses(self.conn, lane_id)}

    async def checkpointed(self, lane_id: str, tool_call_id: str) -> None:
        """Wait until ``tool_call_id`` is effect_pending and has a checkpoint."""

        async def reached() -> bool:
            return (await self.statuses(lane_id)).get(tool_call_id) == ("effect_pending", True)

        await wait_until(reached, within=30, what="a checkpoint")

    @staticmethod
    async def kill(driver: DriverProcess) -> None:
        """SIGKILL ``driver`` and wait for it to be gone (it must still be running: a driver
        that ended before its kill raises ProcessLookupError)."""
        driver.process.send_signal(signal.SIGKILL)
        await driver.process.wait()

    async def findings(self, lane_id: str) -> LaneFindings:
        findings = await check_lane(self.conn, self.stub, lane_id)
        assert findings.violations == [], findings.violations
        assert "unexpected error" not in self.service.log.read_text(errors="replace")
        return findings


@contextlib.asynccontextmanager
async def rig(
    database_url: str,
    workdir: Path,
    *,
    orphan_seconds: float = 60.0,
    place_quiet_seconds: float = 5.0,
) -> AsyncIterator[Rig]:
    """A service whose reconciler leaves orphans alone for ``orphan_seconds`` (so a new driver
    surely takes over first; an aborted run is still reconciled as soon as its lease lapses),
    and places results left unplaced on lanes quiet for ``place_quiet_seconds``."""
    service = ServiceProcess(
        0,
        database_url,
        workdir,
        orphan_seconds=orphan_seconds,
        poll_interval=0.2,
        place_quiet_seconds=place_quiet_seconds,
    )
    await service.start()
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    await ensure_executions_table(conn)
    built: Rig | None = None
    try:
        async with lane_stub(service.target) as stub:
            built = Rig(service, conn, stub, database_url, workdir)
            yield built
    except BaseException:
        print(f"--- service log:\n{tail(service.log, 60)}")
        for driver in built.drivers if built else ():
            print(f"--- {driver.driver_id}:\n{tail(driver.log, 40)}")
        raise
    finally:
        for driver in built.drivers if built else ():
            await reap(driver.process)
        await conn.close()
        await service.stop()


def one_turn(*calls: dict[str, Any], mode: str = "parallel") -> dict[str, Any]:
    return {"mode": mode, "turns": [list(calls)]}


def call_id(lane_id: str, index: int) -> str:
    """The id the driver gives call ``index`` of the first run's first tool turn."""
    return f"{lane_id}.r0.t0.c{index}"


async def executions(rig: Rig, tool_call_id: str) -> list[tuple[str, bool]]:
    cur = await rig.conn.execute(
        "SELECT driver_id, replayed FROM crash_executions WHERE tool_call_id = %s"
        " ORDER BY attempt_no",
        (tool_call_id,),
    )
    return [(str(d), bool(r)) for d, r in await cur.fetchall()]


def takeover_revision(events: list[events_pb2.HarnessEvent]) -> int:
    found = [e.revision for e in events if e.WhichOneof("kind") == "turn_start" and e.recovery]
    assert len(found) == 1, f"takeovers mid-batch at {found}"
    return found[0]


def of_call(
    events: list[events_pb2.HarnessEvent], kind: str, tool_call_id: str
) -> list[events_pb2.HarnessEvent]:
    return [
        e
        for e in events
        if e.WhichOneof("kind") == kind and getattr(e, kind).tool_call_id == tool_call_id
    ]


def texts(result: messages_pb2.ToolResult) -> list[str]:
    return [block.text.text for block in result.content]


async def checkpoint_of(rig: Rig, tool_call_id: str) -> messages_pb2.ToolResult:
    cur = await rig.conn.execute(
        "SELECT checkpoint FROM tool_calls WHERE tool_call_id = %s", (tool_call_id,)
    )
    row = await cur.fetchone()
    assert row is not None and row[0] is not None
    return messages_pb2.ToolResult.FromString(bytes(row[0]))


# Holds the placement commit of an armed lane: the placement marks outcome_ready calls
# completed (or deletes the batch's rows once it is complete); the trigger sleeps right there,
# inside the placement transaction, after the staging commit.
HOLD_PLACEMENT = """
CREATE TABLE crash_hold (lane_id text PRIMARY KEY);
CREATE FUNCTION crash_hold_placement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'outcome_ready' AND (TG_OP = 'DELETE' OR NEW.status = 'completed')
       AND EXISTS (SELECT 1 FROM crash_hold h JOIN operations o ON o.lane_id = h.lane_id
                   WHERE o.operation_id = OLD.operation_id) THEN
        PERFORM pg_sleep(120);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER crash_hold BEFORE UPDATE OR DELETE ON tool_calls
    FOR EACH ROW EXECUTE FUNCTION crash_hold_placement();
"""


async def test_staged_result_is_placed_by_the_takeover_and_never_rerun(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """(i) Placement is held in the database (a trigger sleeps in the placement commit), so the
    staging commit is durable and the placement commit is not: then the driver and the service
    are SIGKILLed, the held transaction dies with its connection, and a new driver takes over.

    The service would place such a result by itself too (docs/recovery.md): on a command
    refused on the lane, or once the lane is quiet for ``LANE_PLACE_QUIET_SECONDS``. So that
    the takeover is what places it here, the new driver starts once the old lease has lapsed
    (its AcquireOperation is not refused), and the service waits an hour for quiet lanes (a
    restart slower than the default 5 s, on a loaded machine, let it place the result first)."""
    lane = "staged"
    target = call_id(lane, 0)
    async with rig(fresh_database_url, tmp_path, place_quiet_seconds=3600) as r:
        await r.conn.execute(HOLD_PLACEMENT)
        await r.conn.execute("INSERT INTO crash_hold VALUES (%s)", (lane,))
        first = await r.driver(lane, "d1", one_turn({"name": NEVER_TOOL, "steps": 1}))

        async def staged() -> bool:
            return (await r.statuses(lane)).get(target, ("",))[0] == "outcome_ready"

        await wait_until(staged, within=30, what="the staging commit")

        async def held() -> bool:
            cur = await r.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        await wait_until(held, within=10, what="the placement held by the trigger")
        await r.kill(first)
        await r.service.kill()
        await r.conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
        )
        await r.conn.execute("DELETE FROM crash_hold")
        await r.service.start()
        assert (await r.statuses(lane))[target][0] == "outcome_ready"  # staged, not placed

        async def lapsed() -> bool:
            return await lease_state(r.conn, lane) == (1, False)

        await wait_until(lapsed, within=LEASE_SECONDS + 10, what="the lease to lapse")
        second = await r.driver(lane, "d2", one_turn({"name": NEVER_TOOL, "steps": 1}))

        async def taken_over() -> bool:
            return (await lease_state(r.conn, lane))[0] > 1

        await wait_until(taken_over, within=30, what="the takeover")
        await r.finished(second)

        events = (await load(r.conn, lane)).events
        taken = takeover_revision(events)
        placed = of_call_entry(events, target)
        assert len(placed) == 1 and placed[0].recovery
        data = await load(r.conn, lane)
        # The takeover commit itself placed it: same event group as the recovery turn_start.
        assert data.group_end[placed[0].revision] == data.group_end[taken]
        assert [e.revision < taken for e in of_call(events, "tool_start", target)] == [True]
        assert len(of_call(events, "tool_end", target)) == 1
        assert await executions(r, target) == [(f"{lane}-d1", False)]
        # The takeover left the batch placed and closed: its turn_end is in the same group.
        batch = next(e.turn_start.turn_id for e in events if e.revision == taken)
        closed = [
            e.revision
            for e in events
            if e.WhichOneof("kind") == "turn_end" and e.turn_end.turn_id == batch
        ]
        assert [data.group_end[at] for at in closed] == [data.group_end[taken]]
        findings = await r.findings(lane)
        assert findings.staged_at_takeover == 1 and findings.runs_completed == 1


async def lease_state(conn: psycopg.AsyncConnection[Any], lane_id: str) -> tuple[int, bool]:
    """How many leases the lane's one run was granted (its fencing token's count within the
    lane's incarnation), and whether its lease is live (open or ended)."""
    cur = await conn.execute(
        "SELECT lease_token, coalesce(lease_expires > now(), false) FROM operations"
        " WHERE lane_id = %s",
        (lane_id,),
    )
    row = await cur.fetchone()
    assert row is not None
    return grants(int(row[0])), bool(row[1])


def of_call_entry(
    events: list[events_pb2.HarnessEvent], tool_call_id: str
) -> list[events_pb2.HarnessEvent]:
    return [
        e
        for e in events
        if e.WhichOneof("kind") == "entry_added"
        and e.entry_added.entry.message.message.tool_result.tool_call_id == tool_call_id
    ]


async def test_never_call_with_checkpoint_is_interrupted_not_rerun(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """(ii)"""
    lane = "never"
    target = call_id(lane, 0)
    plan = one_turn({"name": NEVER_TOOL, "steps": 200, "delay": 0.15, "checkpoint": True})
    async with rig(fresh_database_url, tmp_path) as r:
        first = await r.driver(lane, "d1", plan)
        await r.checkpointed(lane, target)
        await r.kill(first)
        checkpoint = await checkpoint_of(r, target)

        second = await r.driver(lane, "d2", plan)
        await r.finished(second)

        events = (await load(r.conn, lane)).events
        taken = takeover_revision(events)
        ends = of_call(events, "tool_end", target)
        assert len(ends) == 1 and ends[0].revision > taken and ends[0].recovery
        result = ends[0].tool_end.result
        assert texts(result)[:-1] == texts(checkpoint)  # the latest durable snapshot
        assert texts(result)[-1].startswith(INTERRUPTED_MARKER)
        assert ends[0].tool_end.is_error
        # No new tool_start: the running row came from the snapshot.
        assert [e.revision < taken for e in of_call(events, "tool_start", target)] == [True]
        assert await executions(r, target) == [(f"{lane}-d1", False)]
        findings = await r.findings(lane)
        assert findings.unsafe_recoveries == 1 and findings.replays == 0

        # The checker is not vacuous: a second execution of this NEVER call is a violation.
        await r.conn.execute(
            "INSERT INTO crash_executions (lane_id, operation_id, tool_call_id, attempt_no)"
            " VALUES (%s, %s, %s, 2)",
            (lane, f"{lane}.r0", target),
        )
        tampered = await check_lane(r.conn, r.stub, lane)
        assert any("executed 2 times" in v for v in tampered.violations), tampered.violations


async def test_safe_call_is_replayed_with_its_persisted_arguments(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """(iii)"""
    lane = "safe"
    target = call_id(lane, 0)
    plan = one_turn({"name": SAFE_TOOL, "steps": 8, "delay": 0.25, "checkpoint": True})
    async with rig(fresh_database_url, tmp_path) as r:
        first = await r.driver(lane, "d1", plan)
        await r.checkpointed(lane, target)
        await r.kill(first)

        second = await r.driver(lane, "d2", plan)
        await r.finished(second)

        events = (await load(r.conn, lane)).events
        taken = takeover_revision(events)
        starts = of_call(events, "tool_start", target)
        assert len(starts) == 2
        fresh, replayed = starts
        assert fresh.revision < taken < replayed.revision
        assert replayed.recovery and not fresh.recovery
        assert replayed.tool_start.arguments_json == fresh.tool_start.arguments_json
        ends = of_call(events, "tool_end", target)
        assert len(ends) == 1 and ends[0].recovery and not ends[0].tool_end.is_error
        assert texts(ends[0].tool_end.result) == [f"{SAFE_TOOL} {target} done (attempt 2)"]
        # The replay's progress is tagged recovery too, and comes after the replay start.
        updates = [u for u in of_call(events, "tool_update", target) if u.revision > taken]
        assert updates and all(u.recovery and u.revision > replayed.revision for u in updates)
        assert await executions(r, target) == [(f"{lane}-d1", False), (f"{lane}-d2", True)]
        findings = await r.findings(lane)
        assert findings.replays == 1 and findings.interruptions == 0

        # The checker is not vacuous: a watcher whose fold differs from the capture is caught.
        capture = (await r.stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))).snapshot
        wrong = snapshot_pb2.LaneSnapshot()
        wrong.CopyFrom(capture)
        wrong.stats.message_count += 1
        tampered = await check_lane(r.conn, r.stub, lane, wrong)
        assert any("watcher fold" in v for v in tampered.violations), tampered.violations


async def test_service_reconciles_an_aborted_run_without_any_driver(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """(iv) A parallel batch with one call of each state (effect_pending with a checkpoint,
    outcome_ready behind it, planned), the driver SIGKILLed, the run aborted: the service alone
    settles and places every call and ends the run ABORTED, every event tagged recovery."""
    lane = "abort"
    pending, staged, planned = (call_id(lane, i) for i in range(3))
    plan = one_turn(
        {"name": NEVER_TOOL, "steps": 400, "delay": 0.15, "checkpoint": True},
        {"name": NEVER_TOOL, "steps": 1, "delay": 0.05},
        {"name": SAFE_TOOL, "steps": 1, "start_delay": 600},
    )
    async with rig(fresh_database_url, tmp_path) as r:
        first = await r.driver(lane, "d1", plan)

        async def in_position() -> bool:
            return await r.statuses(lane) == {
                pending: ("effect_pending", True),
                staged: ("outcome_ready", False),
                planned: ("planned", False),
            }

        await wait_until(in_position, within=30, what="one call of each state")
        await r.kill(first)
        checkpoint = await checkpoint_of(r, pending)
        operation_id = await open_operation(r.stub, lane)
        await r.stub.AbortOperation(
            pb.AbortOperationRequest(lane_id=lane, operation_id=operation_id)
        )

        async def ended() -> bool:
            return not await open_operation(r.stub, lane)

        await wait_until(ended, within=LEASE_SECONDS + 15, what="the service's reconciliation")

        data = await load(r.conn, lane)
        events = data.events
        run_end = events[-1]
        assert run_end.WhichOneof("kind") == "run_end" and run_end.recovery
        assert run_end.run_end.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
        group = [e for e in events if data.group_end[e.revision] == run_end.revision]
        assert all(e.recovery for e in group)
        kinds = [(e.WhichOneof("kind"), _call_of(e)) for e in group]
        assert kinds == [
            ("tool_end", pending),  # interruption: no tool_start, the running row exists
            ("message_start", pending),
            ("message_end", pending),
            ("entry_added", pending),
            ("message_start", staged),
            ("message_end", staged),
            ("entry_added", staged),
            ("tool_start", planned),  # cancelled while planned: start + end at staging
            ("tool_end", planned),
            ("message_start", planned),
            ("message_end", planned),
            ("entry_added", planned),
            ("turn_end", ""),
            ("run_end", ""),
        ], kinds
        interrupted = group[0].tool_end.result
        assert texts(interrupted)[:-1] == texts(checkpoint)
        assert texts(interrupted)[-1].startswith(INTERRUPTED_MARKER)
        assert "cancelled" in texts(group[8].tool_end.result)[0]
        assert await executions(r, pending) == [(f"{lane}-d1", False)]
        assert await executions(r, planned) == []
        findings = await r.findings(lane)
        assert findings.reconciliations == 1 and findings.takeovers == 0


def _call_of(event: events_pb2.HarnessEvent) -> str:
    kind = event.WhichOneof("kind") or ""
    body = getattr(event, kind)
    if kind in ("tool_start", "tool_update", "tool_end"):
        return str(body.tool_call_id)
    if kind in ("message_start", "message_end"):
        return str(body.message.tool_result.tool_call_id)
    if kind == "entry_added":
        return str(body.entry.message.message.tool_result.tool_call_id)
    return ""


async def test_stale_driver_is_refused_and_changes_nothing(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """(v) The first driver is frozen (SIGSTOP) mid-call until its lease lapses; the run is taken
    over; every command with the old token is refused ABORTED STALE_LEASE and changes nothing;
    thawed, the old driver gets the same refusal and gives up."""
    lane = "stale"
    target = call_id(lane, 0)
    plan = one_turn({"name": NEVER_TOOL, "steps": 400, "delay": 0.15, "checkpoint": True})
    # Orphans are reconciled only after a minute: the frozen driver's run stays open.
    async with rig(fresh_database_url, tmp_path) as r:
        first = await r.driver(lane, "d1", plan)
        await r.checkpointed(lane, target)
        first.process.send_signal(signal.SIGSTOP)
        operation_id = await open_operation(r.stub, lane)
        old_token = (
            await r.stub.GetOperation(
                pb.GetOperationRequest(lane_id=lane, operation_id=operation_id)
            )
        ).state.lease.token

        async def taken() -> pb.AcquireOperationResponse | None:
            try:
                answer: pb.AcquireOperationResponse = await r.stub.AcquireOperation(
                    pb.AcquireOperationRequest(
                        lane_id=lane,
                        operation_id=operation_id,
                        driver_id="tester",
                        lease_seconds=120,
                    )
                )
            except grpc.aio.AioRpcError as err:
                assert lane_error(err).reason == "LEASE_HELD"
                return None
            return answer

        acquired = await wait_until(taken, within=LEASE_SECONDS + 10, interval=0.2)
        new_token = acquired.lease.token
        assert new_token > old_token
        before = await _state(r, lane, operation_id)

        ids = {"lane_id": lane, "operation_id": operation_id, "lease_token": old_token}
        stale: list[tuple[str, Any]] = [
            (
                "UpdateToolCall",
                pb.UpdateToolCallRequest(
                    **ids,
                    tool_call_id=target,
                    partial_result=messages_pb2.ToolResult(),
                    checkpoint=True,
                ),
            ),
            (
                "StageToolOutcome",
                pb.StageToolOutcomeRequest(
                    **ids,
                    tool_call_id=target,
                    executed=pb.ExecutedOutcome(result=messages_pb2.ToolResult()),
                ),
            ),
            (
                "StageToolOutcome",
                pb.StageToolOutcomeRequest(
                    **ids,
                    tool_call_id=target,
                    synthetic=pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_INTERRUPTED),
                ),
            ),
            ("ReplayToolCall", pb.ReplayToolCallRequest(**ids, tool_call_id=target)),
            ("StartTurn", pb.StartTurnRequest(**ids)),
            (
                "EndRun",
                pb.EndRunRequest(**ids, status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED),
            ),
            ("RenewLease", pb.RenewLeaseRequest(**ids)),
            ("ReleaseLease", pb.ReleaseLeaseRequest(**ids)),
        ]
        for method, request in stale:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await getattr(r.stub, method)(request)
            error = lane_error(refused.value)
            assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "STALE_LEASE"), method
            assert await _state(r, lane, operation_id) == before, f"{method} changed something"

        # Thawed, the old driver's next command is refused the same way; it gives up.
        first.process.send_signal(signal.SIGCONT)
        await r.finished(first, EXIT_LEASE_LOST)
        assert await _state(r, lane, operation_id) == before

        # Hand the run on: a new driver interrupts the call (it ran once) and completes.
        await r.stub.ReleaseLease(
            pb.ReleaseLeaseRequest(lane_id=lane, operation_id=operation_id, lease_token=new_token)
        )
        last = await r.driver(lane, "d2", plan)
        await r.finished(last)
        assert await executions(r, target) == [(f"{lane}-d1", False)]
        findings = await r.findings(lane)
        assert findings.takeovers == 2 and findings.runs_completed == 1


async def _state(rig: Rig, lane_id: str, operation_id: str) -> tuple[Any, ...]:
    snapshot = (await rig.stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
    operation = (
        await rig.stub.GetOperation(
            pb.GetOperationRequest(lane_id=lane_id, operation_id=operation_id)
        )
    ).state
    cur = await rig.conn.execute("SELECT count(*) FROM requests WHERE lane_id = %s", (lane_id,))
    row = await cur.fetchone()
    return snapshot, operation, row[0] if row else None


async def test_callers_going_away_mid_call_do_not_break_other_callers(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """A client killed mid-call, or whose deadline passes, cancels its RPC in the service; that
    must not hurt other callers. Found by the harness (a healthy driver's GetLaneSnapshot
    answered INTERNAL after other drivers were killed): here the clients that go away are calls
    with deadlines of a few milliseconds, while bystanders read snapshots with a generous one.
    """
    message = messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(
            content=[messages_pb2.ContentBlock(text=messages_pb2.TextContent(text="x"))]
        )
    )
    async with rig(fresh_database_url, tmp_path) as r:
        lanes = [f"bystander-{i}" for i in range(4)]
        for lane in lanes:
            await r.stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
        failures: list[str] = []
        loop = asyncio.get_running_loop()
        until = loop.time() + 20
        rng = random.Random(5)

        async def going_away() -> None:
            while loop.time() < until and not failures:
                lane = rng.choice(lanes)
                deadline = rng.uniform(0.0005, 0.006)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    if rng.random() < 0.5:
                        await r.stub.GetLaneSnapshot(
                            pb.GetLaneSnapshotRequest(lane_id=lane), timeout=deadline
                        )
                    else:
                        await r.stub.EnqueueMessage(
                            pb.EnqueueMessageRequest(
                                lane_id=lane,
                                kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                                message=message,
                            ),
                            timeout=deadline,
                        )

        async def bystander() -> None:
            while loop.time() < until and not failures:
                try:
                    await r.stub.GetLaneSnapshot(
                        pb.GetLaneSnapshotRequest(lane_id=rng.choice(lanes)), timeout=10
                    )
                except grpc.aio.AioRpcError as err:
                    failures.append(str(lane_error(err)))

        await asyncio.gather(going_away(), going_away(), going_away(), bystander(), bystander())
        log = r.service.log.read_text(errors="replace")
        errors = sorted({line for line in log.splitlines() if line.startswith("psycopg.errors")})
        assert not failures, f"bystanders failed: {failures[:3]}; service errors: {errors}"
        assert "unexpected error" not in log, errors
