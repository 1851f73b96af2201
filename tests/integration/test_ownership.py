"""Run ownership and recovery through the real service: leases and fencing, takeover mid-batch
(placement, safe replay, interruption), reconciliation without a driver, terminal clean-up.

Leases lapse and runs orphan on a server of the test's own whose clock the test moves forward
(tests/support/clock.py): no test waits for a lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any, NamedTuple

import grpc
import pytest
import pytest_asyncio
from lane.client.testing import LaneScript, RunScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.app.server import RunningServer
from lane.server.domain import results
from tests.integration.lanes import (
    Probe,
    error_reason,
    hand_edit,
    kinds,
    leased_run,
    new_lane_id,
    result,
    text,
)
from tests.integration.servers import extra_server
from tests.support.clock import OffsetClock

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: The lease every clocked test's driver takes: far longer than any test runs, so only moving
#: the clock makes it lapse.
LEASE = 30
#: The clocked server's orphan interval (the service's default is 600 s).
ORPHAN = 60
#: How far short of a deadline a test stops the clock to see it not reached yet: more than the
#: real time a test's few commands take (the clock keeps flowing), on a busy machine too.
MARGIN = 5


class Clocked(NamedTuple):
    """A server of the test's own on the session database, deciding with ``clock``."""

    clock: OffsetClock
    running: RunningServer
    stub: Any


@pytest_asyncio.fixture(loop_scope="session")
async def clocked(session_database_url: str) -> AsyncIterator[Clocked]:
    """A server whose clock only this test moves (the session server's leases never lapse by
    it: the session server keeps the real time)."""
    clock = OffsetClock()
    async with extra_server(session_database_url, clock=clock, orphan_seconds=ORPHAN) as (
        running,
        stub,
    ):
        yield Clocked(clock, running, stub)


def placed_calls(events: list[Any]) -> list[str]:
    """The tool call ids whose results ``events`` placed, in order."""
    return [
        e.entry_added.entry.message.message.tool_result.tool_call_id
        for e in events
        if e.HasField("entry_added")
    ]


async def until_run_ended(probe: Probe) -> None:
    """Poll captures until the lane has no open operation (the service's reconciler passes
    every second)."""
    async with asyncio.timeout(20):
        while (await probe.capture()).HasField("operation"):  # noqa: ASYNC110
            await asyncio.sleep(0.2)


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_a_leased_run_refuses_commands_without_its_current_token(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("lease"))
    run = await leased_run(lane_stub, probe, "a")
    token = run.lease_token
    before = await probe.capture()
    for bad in (0, token + 1):
        # The run's own StartToolCall, under a token that is not the lease's.
        error = await refused(replace(run, lease_token=bad).call("a").start())
        assert error.code() == grpc.StatusCode.ABORTED
        assert error_reason(error) == "STALE_LEASE"
    assert await probe.capture() == before  # refused commands change nothing
    renewed = await lane_stub.RenewLease(run.aim.request(pb.RenewLeaseRequest, lease_seconds=60))
    assert renewed.lease.token == token and not renewed.cancel_requested
    # Another driver cannot take a live lease.
    acquire = run.aim.request(pb.AcquireOperationRequest, driver_id="driver-2")
    error = await refused(lane_stub.AcquireOperation(acquire))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(error) == "LEASE_HELD"
    # Released, it can; the old token is then fenced off.
    await run.release()
    taken = await lane_stub.AcquireOperation(acquire)
    assert taken.lease.token == token + 1 and taken.lease.driver_id == "driver-2"
    error = await refused(lane_stub.RenewLease(run.aim.request(pb.RenewLeaseRequest)))
    assert error_reason(error) == "STALE_LEASE"
    await probe.check()


async def test_an_expired_lease_can_be_taken_over(clocked: Clocked) -> None:
    stub = clocked.stub
    probe = Probe(stub, new_lane_id("expire"))
    run = await leased_run(stub, probe, "a", seconds=LEASE)
    acquire = run.aim.request(pb.AcquireOperationRequest, driver_id="driver-2", lease_seconds=30)
    # Shortly before it lapses the lease still holds; at its end it no longer does.
    clocked.clock.advance(LEASE - MARGIN)
    assert error_reason(await refused(stub.AcquireOperation(acquire))) == "LEASE_HELD"
    clocked.clock.advance(MARGIN)
    taken = await stub.AcquireOperation(acquire)
    assert taken.lease.token == run.lease_token + 1
    # The takeover happened mid-batch: it is a recovery.
    events = await probe.check()
    assert kinds(events) == ["turn_start"] and events[0].recovery
    state = taken.state
    assert state.phase == pb.RUN_PHASE_TOOLS
    assert [c.status for c in state.tool_calls] == [pb.TOOL_CALL_STATUS_PLANNED]


async def test_takeover_mid_batch_places_replays_and_interrupts(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("takeover"))
    run = await leased_run(lane_stub, probe, "never", "safe", "staged", "planned")

    def start(driver: RunScript, call_id: str, replay: pb.ReplayPolicy.ValueType) -> Any:
        arguments = f'{{"effective": "{call_id}", "n": 18446744073709551623}}'
        return driver.call(call_id).start(arguments, replay=replay)

    await start(run, "never", pb.REPLAY_POLICY_NEVER)
    await start(run, "safe", pb.REPLAY_POLICY_SAFE)
    await start(run, "staged", pb.REPLAY_POLICY_NEVER)
    for call_id in ("never", "safe"):
        await run.call(call_id).progress(
            f"{call_id} halfway", checkpoint=True, details_json='{"pct": 50}'
        )
    await run.call("staged").stage("staged result")
    active = ["never", "safe", "staged"]
    await probe.check(active)
    # The driver dies; its lease is released (as a crash would let it lapse).
    await run.release()
    taken = await lane_stub.AcquireOperation(
        run.aim.request(pb.AcquireOperationRequest, driver_id="driver-2")
    )
    new = replace(run, lease_token=taken.lease.token)
    events = await probe.check(active)
    assert kinds(events) == ["turn_start"] and events[0].recovery  # "never" blocks placement
    statuses = {c.tool_call_id: c.status for c in taken.state.tool_calls}
    assert statuses == {
        "never": pb.TOOL_CALL_STATUS_EFFECT_PENDING,
        "safe": pb.TOOL_CALL_STATUS_EFFECT_PENDING,
        "staged": pb.TOOL_CALL_STATUS_OUTCOME_READY,
        "planned": pb.TOOL_CALL_STATUS_PLANNED,
    }
    safe_state = next(c for c in taken.state.tool_calls if c.tool_call_id == "safe")
    assert safe_state.replay == pb.REPLAY_POLICY_SAFE
    assert safe_state.checkpoint == result("safe halfway", details_json='{"pct": 50}')
    assert safe_state.arguments_json.endswith('"n": 18446744073709551623}')
    # NEVER: the interruption result from its checkpoint; only tool_end, tagged recovery.
    await new.call("never").synthetic(pb.SYNTHETIC_CAUSE_INTERRUPTED)
    events = await probe.check(active)
    end = events[0]
    assert kinds(events)[0] == "tool_end" and end.recovery
    assert "tool_start" not in kinds(events)
    assert [b.text.text for b in end.tool_end.result.content] == [
        "never halfway",
        results.INTERRUPTED_TEXT,
    ]
    assert end.tool_end.result.details_json == '{"pct": 50}'
    assert placed_calls(events) == ["never"]  # "safe" still blocks "staged"
    # The old driver is fenced off.
    error = await refused(run.call("safe").progress("zombie"))
    assert error_reason(error) == "STALE_LEASE"
    # SAFE: replay from a cleared checkpoint with the persisted arguments.
    replay = await lane_stub.ReplayToolCall(new.call("safe").aim.request(pb.ReplayToolCallRequest))
    assert replay.arguments_json == safe_state.arguments_json
    events = await probe.check(active)
    assert kinds(events) == ["tool_start"] and events[0].recovery
    assert not probe.snapshot.operation.running_tools[0].running.HasField("result")
    await new.call("safe").stage("safe again")
    events = await probe.check(active)
    assert all(e.recovery for e in events)
    assert placed_calls(events) == ["safe", "staged"]
    # The planned call goes through ordinary clearance; the batch ends with turn_end (recovery).
    await start(new, "planned", pb.REPLAY_POLICY_NEVER).stage("fresh")
    events = await probe.check([*active, "planned"])
    assert kinds(events)[-1] == "turn_end" and events[-1].recovery
    assert [r.tool_call_id for r in events[-1].turn_end.tool_results] == [
        "never",
        "safe",
        "staged",
        "planned",
    ]
    # A replay is only for SAFE calls of a taken-over batch.
    state = await lane_stub.GetOperation(run.aim.request(pb.GetOperationRequest))
    assert state.state.phase == pb.RUN_PHASE_IDLE and not state.state.tool_calls


async def stage_a_wrong_result(store: Any, operation_ids: list[str], content: str = "") -> None:
    """Hand-edit call c0 of each run to outcome_ready with a result of another call (c9): a
    run the service cannot end until :func:`repair` undoes it."""
    wrong = messages_pb2.ToolResultMessage(
        tool_call_id="c9", tool_name="t", content=[text(content)] if content else []
    )
    async with hand_edit(store) as conn:
        cur = await conn.execute(
            "UPDATE tool_calls SET status = 'outcome_ready', result_message = %s"
            " WHERE operation_id = ANY(%s) AND tool_call_id = 'c0'",
            (wrong.SerializeToString(), operation_ids),
        )
        assert cur.rowcount == len(operation_ids)


async def repair(store: Any, operation_ids: list[str]) -> None:
    """Undo :func:`stage_a_wrong_result`, so the service's reconcilers can end the runs and
    stop warning."""
    async with hand_edit(store) as conn:
        await conn.execute(
            "UPDATE tool_calls SET status = 'effect_pending', result_message = NULL"
            " WHERE operation_id = ANY(%s) AND tool_call_id = 'c0'",
            (operation_ids,),
        )


async def test_the_service_reconciles_an_aborted_run_without_a_driver(clocked: Clocked) -> None:
    lane_stub, store = clocked.stub, clocked.running.store
    probe = Probe(lane_stub, new_lane_id("reconcile"))
    lane = probe.lane_id
    run = await leased_run(lane_stub, probe, "running", "waiting", seconds=LEASE)
    run_id = run.operation_id
    await run.call("running").start().progress("partial", checkpoint=True)
    await run.abort()
    await probe.check(["running"])
    # Aborted, but the lease is live: the driver may still be at it, so the run stays open.
    assert run_id not in await store.reconcile_orphans(timedelta(seconds=ORPHAN))
    # No driver comes back: once the lease lapses the service ends the run itself.
    clocked.clock.advance(LEASE)
    await until_run_ended(probe)
    events = await probe.check(["running", "waiting"])
    assert all(e.recovery for e in events)
    assert kinds(events) == [
        "tool_end", "message_start", "message_end", "entry_added",  # running: interrupted
        "tool_start", "tool_end", "message_start", "message_end", "entry_added",  # cancelled
        "turn_end",
        "run_end",
    ]  # fmt: skip
    assert events[0].tool_end.result.content[0].text.text == "partial"
    assert events[5].tool_end.result.content[0].text.text == results.CANCELLED_TEXT
    assert probe.snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
    # Clean-up: nothing of the run remains but entries, usage rows, events and its result.
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM tool_calls WHERE operation_id = %s", (run_id,)
        )
        assert await cur.fetchone() == (0,)
        cur = await conn.execute(
            "SELECT phase, turn_id, batch_entry_id, lease_holder, recovering, result IS NOT NULL"
            " FROM operations WHERE operation_id = %s",
            (run_id,),
        )
        assert await cur.fetchone() == ("ended", None, None, None, False, True)
        cur = await conn.execute(
            "SELECT current_operation_id, last_operation_id FROM lanes WHERE lane_id = %s", (lane,)
        )
        assert await cur.fetchone() == (None, run_id)


async def test_an_orphaned_run_is_reconciled_after_the_orphan_timeout(clocked: Clocked) -> None:
    probe = Probe(clocked.stub, new_lane_id("orphan"))
    run_id = (await leased_run(clocked.stub, probe, "a", seconds=LEASE)).operation_id
    orphan_after = timedelta(seconds=ORPHAN)
    # Lapsed, but orphaned for less than the orphan interval: the driver may yet come back.
    clocked.clock.advance(LEASE + ORPHAN - MARGIN)
    assert run_id not in await clocked.running.store.reconcile_orphans(orphan_after)
    assert (await probe.capture()).operation.id == run_id
    clocked.clock.advance(MARGIN)
    await until_run_ended(probe)
    events = await probe.check(["a"])
    assert kinds(events)[-1] == "run_end" and all(e.recovery for e in events)
    assert probe.snapshot.last_result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED


async def test_an_unleased_run_is_never_reconciled(lane_stub, store) -> None:
    probe = Probe(lane_stub, new_lane_id("unleased"))
    run = await (await LaneScript.create(lane_stub, probe.lane_id)).start_run("x")
    await run.abort()
    assert run.operation_id not in await store.reconcile_orphans(timedelta(0))
    assert (await probe.capture()).operation.id == run.operation_id


async def test_a_lane_that_cannot_be_reconciled_does_not_hold_up_the_others(
    clocked: Clocked,
) -> None:
    # Two abandoned runs; the first (earlier lease expiry) has a corrupt staged result, so
    # ending it faults with LANE_STATE_CORRUPT. The second is ended all the same.
    lane_stub, store = clocked.stub, clocked.running.store
    corrupt, healthy = Probe(lane_stub, new_lane_id("rc-bad")), Probe(lane_stub, new_lane_id("rc"))
    bad = await leased_run(lane_stub, corrupt, "c0", seconds=LEASE)
    good = await leased_run(lane_stub, healthy, "c0", seconds=LEASE + 1)
    await bad.call("c0").start()
    await stage_a_wrong_result(store, [bad.operation_id], "x")
    for run in (bad, good):
        await run.abort()
    clocked.clock.advance(LEASE + 1)
    try:
        await until_run_ended(healthy)
        # The corrupt run is still open (and capture still reports the corruption).
        async with store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT phase FROM operations WHERE operation_id = %s", (bad.operation_id,)
            )
            row = await cur.fetchone()
            assert row is not None and row[0] != "ended"
    finally:
        await repair(store, [bad.operation_id])
    await until_run_ended(corrupt)


async def test_runs_that_cannot_be_ended_do_not_starve_the_reconciler(clocked: Clocked) -> None:
    # Two orphaned runs with corrupt staged results expire first; a healthy orphan after them.
    # A pass reading one candidate at a time still reaches the healthy one.
    lane_stub, store = clocked.stub, clocked.running.store
    stuck = []
    for _ in range(2):
        run = await leased_run(
            lane_stub, Probe(lane_stub, new_lane_id("stuck")), "c0", seconds=LEASE
        )
        await run.call("c0").start()
        await stage_a_wrong_result(store, [run.operation_id])
        stuck.append(run.operation_id)
    healthy = Probe(lane_stub, new_lane_id("unstuck"))
    healthy_run = (await leased_run(lane_stub, healthy, "c0", seconds=LEASE)).operation_id
    try:
        # Every lease lapses; the server's own reconciler waits out its orphan interval, so
        # only this pass (orphaned for no time at all) ends them.
        clocked.clock.advance(LEASE)
        ended = await store.reconcile_orphans(timedelta(0), limit=1)
        assert healthy_run in ended
        assert not set(stuck) & set(ended)
        assert not (await healthy.capture()).HasField("operation")
    finally:
        await repair(store, stuck)
