"""Run ownership and recovery through the real service: leases and fencing, takeover mid-batch
(placement, safe replay, interruption), reconciliation without a driver, terminal clean-up.

Leases lapse and runs orphan on a server of the test's own whose clock the test moves forward
(tests/support/clock.py): no test waits for a lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, NamedTuple

import grpc
import pytest
import pytest_asyncio
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.app.server import RunningServer
from lane.server.domain import results
from tests.integration.lanes import (
    Probe,
    error_reason,
    hand_edit,
    kinds,
    leased_batch,
    new_lane_id,
    result,
    text,
    user,
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
    run_id, token = await leased_batch(lane_stub, probe, "a")
    before = await probe.capture()
    for bad in (0, token + 1):
        error = await refused(
            lane_stub.StartToolCall(
                pb.StartToolCallRequest(
                    lane_id=probe.lane_id,
                    operation_id=run_id,
                    tool_call_id="a",
                    arguments_json="{}",
                    lease_token=bad,
                )
            )
        )
        assert error.code() == grpc.StatusCode.ABORTED
        assert error_reason(error) == "STALE_LEASE"
    assert await probe.capture() == before  # refused commands change nothing
    renewed = await lane_stub.RenewLease(
        pb.RenewLeaseRequest(
            lane_id=probe.lane_id, operation_id=run_id, lease_token=token, lease_seconds=60
        )
    )
    assert renewed.lease.token == token and not renewed.cancel_requested
    # Another driver cannot take a live lease.
    error = await refused(
        lane_stub.AcquireOperation(
            pb.AcquireOperationRequest(
                lane_id=probe.lane_id, operation_id=run_id, driver_id="driver-2"
            )
        )
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(error) == "LEASE_HELD"
    # Released, it can; the old token is then fenced off.
    await lane_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(lane_id=probe.lane_id, operation_id=run_id, lease_token=token)
    )
    taken = await lane_stub.AcquireOperation(
        pb.AcquireOperationRequest(lane_id=probe.lane_id, operation_id=run_id, driver_id="driver-2")
    )
    assert taken.lease.token == token + 1 and taken.lease.driver_id == "driver-2"
    error = await refused(
        lane_stub.RenewLease(
            pb.RenewLeaseRequest(lane_id=probe.lane_id, operation_id=run_id, lease_token=token)
        )
    )
    assert error_reason(error) == "STALE_LEASE"
    await probe.check()


async def test_an_expired_lease_can_be_taken_over(clocked: Clocked) -> None:
    stub = clocked.stub
    probe = Probe(stub, new_lane_id("expire"))
    run_id, token = await leased_batch(stub, probe, "a", seconds=LEASE)
    acquire = pb.AcquireOperationRequest(
        lane_id=probe.lane_id, operation_id=run_id, driver_id="driver-2", lease_seconds=30
    )
    # Shortly before it lapses the lease still holds; at its end it no longer does.
    clocked.clock.advance(LEASE - MARGIN)
    assert error_reason(await refused(stub.AcquireOperation(acquire))) == "LEASE_HELD"
    clocked.clock.advance(MARGIN)
    taken = await stub.AcquireOperation(acquire)
    assert taken.lease.token == token + 1
    # The takeover happened mid-batch: it is a recovery.
    events = await probe.check()
    assert kinds(events) == ["turn_start"] and events[0].recovery
    state = taken.state
    assert state.phase == pb.RUN_PHASE_TOOLS
    assert [c.status for c in state.tool_calls] == [pb.TOOL_CALL_STATUS_PLANNED]


async def test_takeover_mid_batch_places_replays_and_interrupts(lane_stub) -> None:
    probe = Probe(lane_stub, new_lane_id("takeover"))
    lane = probe.lane_id
    run_id, token = await leased_batch(lane_stub, probe, "never", "safe", "staged", "planned")

    def start(call_id: str, replay: pb.ReplayPolicy.ValueType, lease: int) -> Any:
        return lane_stub.StartToolCall(
            pb.StartToolCallRequest(
                lane_id=lane,
                operation_id=run_id,
                tool_call_id=call_id,
                arguments_json=f'{{"effective": "{call_id}", "n": 18446744073709551623}}',
                replay=replay,
                lease_token=lease,
            )
        )

    await start("never", pb.REPLAY_POLICY_NEVER, token)
    await start("safe", pb.REPLAY_POLICY_SAFE, token)
    await start("staged", pb.REPLAY_POLICY_NEVER, token)
    for call_id in ("never", "safe"):
        await lane_stub.UpdateToolCall(
            pb.UpdateToolCallRequest(
                lane_id=lane,
                operation_id=run_id,
                tool_call_id=call_id,
                partial_result=result(f"{call_id} halfway", details_json='{"pct": 50}'),
                checkpoint=True,
                lease_token=token,
            )
        )
    await lane_stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            lane_id=lane,
            operation_id=run_id,
            tool_call_id="staged",
            executed=pb.ExecutedOutcome(result=result("staged result")),
            lease_token=token,
        )
    )
    active = ["never", "safe", "staged"]
    await probe.check(active)
    # The driver dies; its lease is released (as a crash would let it lapse).
    await lane_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(lane_id=lane, operation_id=run_id, lease_token=token)
    )
    taken = await lane_stub.AcquireOperation(
        pb.AcquireOperationRequest(lane_id=lane, operation_id=run_id, driver_id="driver-2")
    )
    new = taken.lease.token
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
    await lane_stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            lane_id=lane,
            operation_id=run_id,
            tool_call_id="never",
            synthetic=pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_INTERRUPTED),
            lease_token=new,
        )
    )
    events = await probe.check(active)
    end = events[0]
    assert kinds(events)[0] == "tool_end" and end.recovery
    assert "tool_start" not in kinds(events)
    assert [b.text.text for b in end.tool_end.result.content] == [
        "never halfway",
        results.INTERRUPTED_TEXT,
    ]
    assert end.tool_end.result.details_json == '{"pct": 50}'
    placed = [
        e.entry_added.entry.message.message.tool_result.tool_call_id
        for e in events
        if e.HasField("entry_added")
    ]
    assert placed == ["never"]  # "safe" still blocks "staged"
    # The old driver is fenced off.
    error = await refused(
        lane_stub.UpdateToolCall(
            pb.UpdateToolCallRequest(
                lane_id=lane,
                operation_id=run_id,
                tool_call_id="safe",
                partial_result=result("zombie"),
                lease_token=token,
            )
        )
    )
    assert error_reason(error) == "STALE_LEASE"
    # SAFE: replay from a cleared checkpoint with the persisted arguments.
    replay = await lane_stub.ReplayToolCall(
        pb.ReplayToolCallRequest(
            lane_id=lane, operation_id=run_id, tool_call_id="safe", lease_token=new
        )
    )
    assert replay.arguments_json == safe_state.arguments_json
    events = await probe.check(active)
    assert kinds(events) == ["tool_start"] and events[0].recovery
    assert not probe.snapshot.operation.running_tools[0].running.HasField("result")
    await lane_stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            lane_id=lane,
            operation_id=run_id,
            tool_call_id="safe",
            executed=pb.ExecutedOutcome(result=result("safe again")),
            lease_token=new,
        )
    )
    events = await probe.check(active)
    assert all(e.recovery for e in events)
    placed = [
        e.entry_added.entry.message.message.tool_result.tool_call_id
        for e in events
        if e.HasField("entry_added")
    ]
    assert placed == ["safe", "staged"]
    # The planned call goes through ordinary clearance; the batch ends with turn_end (recovery).
    await start("planned", pb.REPLAY_POLICY_NEVER, new)
    await lane_stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            lane_id=lane,
            operation_id=run_id,
            tool_call_id="planned",
            executed=pb.ExecutedOutcome(result=result("fresh")),
            lease_token=new,
        )
    )
    events = await probe.check([*active, "planned"])
    assert kinds(events)[-1] == "turn_end" and events[-1].recovery
    assert [r.tool_call_id for r in events[-1].turn_end.tool_results] == [
        "never",
        "safe",
        "staged",
        "planned",
    ]
    # A replay is only for SAFE calls of a taken-over batch.
    state = await lane_stub.GetOperation(pb.GetOperationRequest(lane_id=lane, operation_id=run_id))
    assert state.state.phase == pb.RUN_PHASE_IDLE and not state.state.tool_calls


async def test_the_service_reconciles_an_aborted_run_without_a_driver(clocked: Clocked) -> None:
    lane_stub, store = clocked.stub, clocked.running.store
    probe = Probe(lane_stub, new_lane_id("reconcile"))
    lane = probe.lane_id
    run_id, token = await leased_batch(lane_stub, probe, "running", "waiting", seconds=LEASE)
    await lane_stub.StartToolCall(
        pb.StartToolCallRequest(
            lane_id=lane,
            operation_id=run_id,
            tool_call_id="running",
            arguments_json="{}",
            lease_token=token,
        )
    )
    await lane_stub.UpdateToolCall(
        pb.UpdateToolCallRequest(
            lane_id=lane,
            operation_id=run_id,
            tool_call_id="running",
            partial_result=result("partial"),
            checkpoint=True,
            lease_token=token,
        )
    )
    await lane_stub.AbortOperation(pb.AbortOperationRequest(lane_id=lane, operation_id=run_id))
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
    run_id, _ = await leased_batch(clocked.stub, probe, "a", seconds=LEASE)
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
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=probe.lane_id))
    run = await lane_stub.StartRun(pb.StartRunRequest(lane_id=probe.lane_id, prompt=[user("x")]))
    await lane_stub.AbortOperation(
        pb.AbortOperationRequest(lane_id=probe.lane_id, operation_id=run.operation_id)
    )
    from datetime import timedelta

    assert run.operation_id not in await store.reconcile_orphans(timedelta(0))
    assert (await probe.capture()).operation.id == run.operation_id


async def test_a_lane_that_cannot_be_reconciled_does_not_hold_up_the_others(
    clocked: Clocked,
) -> None:
    # Two abandoned runs; the first (earlier lease expiry) has a corrupt staged result, so
    # ending it faults with LANE_STATE_CORRUPT. The second is ended all the same.
    lane_stub, store = clocked.stub, clocked.running.store
    corrupt, healthy = Probe(lane_stub, new_lane_id("rc-bad")), Probe(lane_stub, new_lane_id("rc"))
    bad_run, bad_token = await leased_batch(lane_stub, corrupt, "c0", seconds=LEASE)
    good_run, _ = await leased_batch(lane_stub, healthy, "c0", seconds=LEASE + 1)
    await lane_stub.StartToolCall(
        pb.StartToolCallRequest(
            lane_id=corrupt.lane_id,
            operation_id=bad_run,
            tool_call_id="c0",
            arguments_json="{}",
            lease_token=bad_token,
        )
    )
    wrong = messages_pb2.ToolResultMessage(tool_call_id="c9", tool_name="t", content=[text("x")])
    async with hand_edit(store) as conn:
        cur = await conn.execute(
            "UPDATE tool_calls SET status = 'outcome_ready', result_message = %s"
            " WHERE operation_id = %s AND tool_call_id = 'c0'",
            (wrong.SerializeToString(), bad_run),
        )
        assert cur.rowcount == 1
    for probe, run in ((corrupt, bad_run), (healthy, good_run)):
        await lane_stub.AbortOperation(
            pb.AbortOperationRequest(lane_id=probe.lane_id, operation_id=run)
        )
    clocked.clock.advance(LEASE + 1)
    try:
        await until_run_ended(healthy)
        # The corrupt run is still open (and capture still reports the corruption).
        async with store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT phase FROM operations WHERE operation_id = %s", (bad_run,)
            )
            row = await cur.fetchone()
            assert row is not None and row[0] != "ended"
    finally:
        # Repair the lane so the service's reconcilers can end it and stop warning.
        async with hand_edit(store) as conn:
            await conn.execute(
                "UPDATE tool_calls SET status = 'effect_pending', result_message = NULL"
                " WHERE operation_id = %s AND tool_call_id = 'c0'",
                (bad_run,),
            )
    await until_run_ended(corrupt)


async def test_runs_that_cannot_be_ended_do_not_starve_the_reconciler(clocked: Clocked) -> None:
    # Two orphaned runs with corrupt staged results expire first; a healthy orphan after them.
    # A pass reading one candidate at a time still reaches the healthy one.
    lane_stub, store = clocked.stub, clocked.running.store
    stuck = []
    for _ in range(2):
        probe = Probe(lane_stub, new_lane_id("stuck"))
        run, token = await leased_batch(lane_stub, probe, "c0", seconds=LEASE)
        await lane_stub.StartToolCall(
            pb.StartToolCallRequest(
                lane_id=probe.lane_id,
                operation_id=run,
                tool_call_id="c0",
                arguments_json="{}",
                lease_token=token,
            )
        )
        wrong = messages_pb2.ToolResultMessage(tool_call_id="c9", tool_name="t")
        async with hand_edit(store) as conn:
            await conn.execute(
                "UPDATE tool_calls SET status = 'outcome_ready', result_message = %s"
                " WHERE operation_id = %s AND tool_call_id = 'c0'",
                (wrong.SerializeToString(), run),
            )
        stuck.append(run)
    healthy = Probe(lane_stub, new_lane_id("unstuck"))
    healthy_run, _ = await leased_batch(lane_stub, healthy, "c0", seconds=LEASE)
    try:
        # Every lease lapses; the server's own reconciler waits out its orphan interval, so
        # only this pass (orphaned for no time at all) ends them.
        clocked.clock.advance(LEASE)
        ended = await store.reconcile_orphans(timedelta(0), limit=1)
        assert healthy_run in ended
        assert not set(stuck) & set(ended)
        assert not (await healthy.capture()).HasField("operation")
    finally:
        async with hand_edit(store) as conn:
            await conn.execute(
                "UPDATE tool_calls SET status = 'effect_pending', result_message = NULL"
                " WHERE operation_id = ANY(%s) AND tool_call_id = 'c0'",
                (stuck,),
            )
