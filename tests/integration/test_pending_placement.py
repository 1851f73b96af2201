"""A placement its own StageToolOutcome could not commit is finished by the service
(service/lane/server/commands/pending_placement.py): by the next command on the lane, or by the
reconciler once the lane stayed quiet. The fault is real: the placement's commit statement
fails with a database error after the staging committed, and the caller is answered
UNAVAILABLE."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
import psycopg
import pytest
from lane.v1 import events_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.maintenance import place_pending_pass
from lane.server.commands.pending_placement import place_quiet_pending
from lane.server.store import DEFAULT_NAMESPACE, LaneRef, lane_store, lane_writes
from lane.server.store.group_commit import GroupCommitter
from lane.server.store.lane_writes import CommitStatement
from tests.integration.lanes import Probe, error_reason, kinds, result
from tests.integration.test_refusals import (
    UNKNOWN_TOOL,
    Ctx,
    assert_unchanged,
    build,
    picture,
    stage,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _placement(statement: CommitStatement) -> bool:
    """Whether ``statement`` is a placement commit: its group starts with a message_start."""
    if statement.events is None:
        return False
    first = events_pb2.HarnessEvent.FromString(statement.events.bodies[0])
    return first.WhichOneof("kind") == "message_start"


async def stage_placement_unavailable(
    stub: Any, monkeypatch: pytest.MonkeyPatch, request: pb.StageToolOutcomeRequest
) -> None:
    """Send ``request`` while the next placement commit fails: the staging commits, the
    placement does not, and the caller gets UNAVAILABLE."""
    real = lane_writes.run_commit
    real_group = GroupCommitter.commit
    failed: list[CommitStatement] = []

    def break_placement(statement: CommitStatement) -> None:
        if not failed and _placement(statement):
            failed.append(statement)
            raise psycopg.OperationalError("the connection broke before placement committed")

    async def breaking(conn: Any, statement: CommitStatement) -> bool:
        break_placement(statement)
        return await real(conn, statement)

    async def breaking_group(self: Any, lane: LaneRef, statement: CommitStatement) -> bool:
        break_placement(statement)
        return await real_group(self, lane, statement)

    with monkeypatch.context() as patch:
        # The placement commits under the lane lock (run_commit) or on the lane kept in
        # memory (the group committer): break it either way.
        patch.setattr(lane_store, "run_commit", breaking)
        patch.setattr(GroupCommitter, "commit", breaking_group)
        with pytest.raises(grpc.aio.AioRpcError) as answered:
            await stub.StageToolOutcome(request)
    assert answered.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failed, "the placement commit was never attempted"


def stage_c0(ctx: Ctx) -> pb.StageToolOutcomeRequest:
    """c0's result, without a request id (a retry is a new request)."""
    return pb.StageToolOutcomeRequest(
        lane_id=ctx.lane_id,
        operation_id=ctx.operation_id,
        tool_call_id="c0",
        executed=pb.ExecutedOutcome(result=result("c0 done")),
    )


PLACED = ["message_start", "message_end", "entry_added"]


async def staged_unplaced(stub: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Ctx, Probe]:
    """A lane whose c0 is staged with its placement lost (c1 still planned)."""
    ctx = await build(stub, "pending", prefix="pending")
    probe = Probe(stub, ctx.lane_id)
    await probe.start()
    await stage_placement_unavailable(stub, monkeypatch, stage_c0(ctx))
    assert kinds(await probe.check()) == ["tool_end"]  # staged, not placed
    return ctx, probe


async def test_a_retry_without_request_id_is_refused_but_the_batch_is_placed(
    lane_stub, store, monkeypatch
) -> None:
    ctx, probe = await staged_unplaced(lane_stub, monkeypatch)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await lane_stub.StageToolOutcome(stage_c0(ctx))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "TOOL_CALL_WRONG_STATUS"
    # The placement is the first call's, committed in a group of its own.
    assert kinds(await probe.check(["c0"])) == PLACED
    assert [e.tool_result.tool_call_id for e in _results(probe)] == ["c0"]
    # Refused again, it now changes nothing at all.
    before = await picture(lane_stub, store, ctx.lane_id)
    with pytest.raises(grpc.aio.AioRpcError):
        await lane_stub.StageToolOutcome(stage_c0(ctx))
    assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), "second retry")


async def group_ends(store: Any, lane_id: str, revisions: list[int]) -> list[int]:
    """The last revision of the commit each of ``revisions`` belongs to."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT group_end FROM events WHERE lane_id = %s AND revision = ANY(%s)"
            " ORDER BY revision",
            (lane_id, revisions),
        )
        return [row[0] for row in await cur.fetchall()]


async def test_the_next_command_places_a_batch_left_unplaced_and_runs(
    lane_stub, store, monkeypatch
) -> None:
    ctx = await build(lane_stub, "pending", prefix="pending")
    probe = Probe(lane_stub, ctx.lane_id)
    await probe.start()
    await stage(lane_stub, ctx, "c1", synthetic=UNKNOWN_TOOL)  # staged, waits behind c0
    await stage_placement_unavailable(lane_stub, monkeypatch, stage_c0(ctx))
    assert kinds(await probe.check()) == ["tool_start", "tool_end", "tool_end"]
    # The batch is complete but unplaced: the run is still in its tools phase, so StartTurn
    # would be refused WRONG_RUN_PHASE. The service places the batch first, then starts the turn.
    turn = await lane_stub.StartTurn(
        pb.StartTurnRequest(lane_id=ctx.lane_id, operation_id=ctx.operation_id)
    )
    events = await probe.check()
    assert kinds(events) == [*PLACED, *PLACED, "turn_end", "turn_start"]
    assert events[-1].turn_start.turn_id == turn.turn_id
    # Two commits: the placement (one group, through turn_end), then the turn's own.
    revisions = [e.revision for e in events]
    ends = await group_ends(store, ctx.lane_id, revisions)
    assert ends == [revisions[-2]] * (len(revisions) - 1) + [revisions[-1]]


async def test_the_reconciler_places_what_no_command_placed(lane_stub, store, monkeypatch) -> None:
    ctx, probe = await staged_unplaced(lane_stub, monkeypatch)
    # A lane that committed just now is left alone: its own command may be placing it.
    before = await picture(lane_stub, store, ctx.lane_id)
    placed = dict(await place_quiet_pending(store, quiet_for=timedelta(hours=1)))
    assert (lane := _ref(ctx)) not in placed
    assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), "a busy lane")
    # Quiet long enough (here: at once), it is placed.
    placed = dict(await place_quiet_pending(store, quiet_for=timedelta(0)))
    assert placed[lane] == ("c0",)
    assert kinds(await probe.check(["c0"])) == PLACED
    # Nothing is left to place: the next pass (the maintenance loop's, too) changes nothing.
    before = await picture(lane_stub, store, ctx.lane_id)
    await place_pending_pass(store)
    assert lane not in dict(await place_quiet_pending(store, quiet_for=timedelta(0)))
    assert_unchanged(before, await picture(lane_stub, store, ctx.lane_id), "second pass")


def _ref(ctx: Ctx) -> LaneRef:
    return LaneRef(DEFAULT_NAMESPACE, ctx.lane_id)


def _results(probe: Probe) -> list[Any]:
    return [
        entry.message.message
        for entry in probe.snapshot.transcript
        if entry.message.message.WhichOneof("message") == "tool_result"
    ]
