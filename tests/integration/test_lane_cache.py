"""The store keeps lanes it commanded in memory and commits on them with one statement that
checks the lane's version: these tests check that the copy is used, and that it is never used
once the lane moved on elsewhere (another process, a hand edit)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2
from prometheus_client import CollectorRegistry

from lane.server.app.server import RunningServer
from lane.server.store import LANE_SCAN
from tests.integration.lanes import (
    Probe,
    error_reason,
    hand_edit,
    leased_batch,
    new_lane_id,
    result,
    text,
)
from tests.integration.servers import extra_server
from tests.integration.statements import recording


def commits(registry: CollectorRegistry, path: str) -> float:
    value = registry.get_sample_value("lane_store_commits_total", {"path": path})
    return value or 0.0


async def update(stub: Any, lane_id: str, run: str, token: int, call: str, note: str) -> Any:
    return await stub.UpdateToolCall(
        pb.UpdateToolCallRequest(
            lane_id=lane_id,
            operation_id=run,
            tool_call_id=call,
            partial_result=result(note),
            lease_token=token,
        )
    )


async def start_call(stub: Any, lane_id: str, run: str, token: int, call: str) -> Any:
    return await stub.StartToolCall(
        pb.StartToolCallRequest(
            lane_id=lane_id,
            operation_id=run,
            tool_call_id=call,
            arguments_json="{}",
            lease_token=token,
        )
    )


async def test_commands_after_the_first_commit_on_the_kept_lane(
    lane_stub: Any, lane_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = Probe(lane_stub, new_lane_id("cache"))
    run, token = await leased_batch(lane_stub, probe, "c0")
    await start_call(lane_stub, probe.lane_id, run, token, "c0")
    optimistic = commits(lane_server.registry, "optimistic")
    # The lane's own statements, not the process's commit counters: every server of the
    # process counts into those (the session server's upkeep retries the corrupt lanes other
    # tests leave, one locked commit each, at any moment).
    async with recording(monkeypatch) as recorder:
        for n in range(5):
            await update(lane_stub, probe.lane_id, run, token, "c0", f"step {n}")
    mine = [
        s
        for s in recorder.statements
        if isinstance(s.params, dict) and s.params.get("lane") == probe.lane_id
    ]
    # One versioned commit statement each, none loading the lane under its lock first.
    assert len(mine) == 5
    assert all(s.sql.startswith("WITH lane AS (UPDATE lanes SET version") for s in mine)
    assert all(s.transaction is None for s in mine)
    assert commits(lane_server.registry, "optimistic") - optimistic >= 5
    events = await probe.check(active=["c0"])
    assert [e.tool_update.partial_result.content[0].text.text for e in events[-5:]] == [
        f"step {n}" for n in range(5)
    ]


async def test_two_processes_alternating_on_one_lane_lose_nothing(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str
) -> None:
    # Each server keeps its own copy of the lane; every command of the other makes it stale.
    probe = Probe(lane_stub, new_lane_id("cache-two"))
    run, token = await leased_batch(lane_stub, probe, "c0")
    async with extra_server(session_database_url) as (_, other):
        stubs = (lane_stub, other)
        await start_call(other, probe.lane_id, run, token, "c0")
        revisions = []
        locked = commits(lane_server.registry, "locked")
        for n in range(8):
            answer = await update(stubs[n % 2], probe.lane_id, run, token, "c0", f"step {n}")
            revisions.append(answer.revision)
        # Every command found the other's commit: none was lost or written twice.
        assert revisions == list(range(revisions[0], revisions[0] + 8))
        assert commits(lane_server.registry, "locked") - locked >= 7
        events = await probe.check(active=["c0"])
        assert [e.tool_update.partial_result.content[0].text.text for e in events[-8:]] == [
            f"step {n}" for n in range(8)
        ]


async def test_a_hand_edit_is_seen_by_the_next_command(lane_stub: Any, store: Any) -> None:
    probe = Probe(lane_stub, new_lane_id("cache-edit"))
    run, token = await leased_batch(lane_stub, probe, "c0")
    await start_call(lane_stub, probe.lane_id, run, token, "c0")
    await update(lane_stub, probe.lane_id, run, token, "c0", "kept in memory")
    # An operator stages the call by hand: the kept copy (call running) is now stale.
    staged = messages_pb2.ToolResultMessage(
        tool_call_id="c0", tool_name="t", content=[text("by hand")]
    )
    async with hand_edit(store) as conn:
        cur = await conn.execute(
            "UPDATE tool_calls SET status = 'outcome_ready', result_message = %s"
            " WHERE operation_id = %s AND tool_call_id = 'c0'",
            (staged.SerializeToString(), run),
        )
        assert cur.rowcount == 1
    # On the kept copy the update would be accepted; the lane as stored refuses it.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await update(lane_stub, probe.lane_id, run, token, "c0", "too late")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # The hand-staged call is a ready prefix no command placed: refused on the stored lane, the
    # command had the service place it first (service/lane/server/commands/pending_placement.py), so
    # it finds the batch complete.
    assert error_reason(refused.value) == "WRONG_RUN_PHASE"
    placed = (await probe.capture()).transcript[-1].message.message.tool_result
    assert (placed.tool_call_id, placed.content[0].text.text) == ("c0", "by hand")


async def test_a_tool_calls_life_on_the_kept_lane_is_one_statement_per_commit(
    lane_stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = Probe(lane_stub, new_lane_id("cache-sql"))
    run, token = await leased_batch(lane_stub, probe, "c0", "c1")
    await start_call(lane_stub, probe.lane_id, run, token, "c0")  # the lane is kept from here
    async with recording(monkeypatch) as recorder:
        await start_call(lane_stub, probe.lane_id, run, token, "c1")
        await update(lane_stub, probe.lane_id, run, token, "c1", "half way")
        await lane_stub.UpdateToolCall(
            pb.UpdateToolCallRequest(
                lane_id=probe.lane_id,
                operation_id=run,
                tool_call_id="c1",
                partial_result=result("checkpoint"),
                checkpoint=True,
                lease_token=token,
            )
        )
        for call in ("c0", "c1"):
            staged = pb.StageToolOutcomeRequest(
                lane_id=probe.lane_id, operation_id=run, tool_call_id=call, lease_token=token
            )
            staged.executed.result.content.append(text(f"{call} done"))
            await lane_stub.StageToolOutcome(staged)
    mine = [
        s
        for s in recorder.statements
        if not s.sql.startswith(LANE_SCAN)
        and isinstance(s.params, dict)
        and s.params.get("lane") == probe.lane_id
    ]
    # Commits: intent, progress, checkpoint, then per call staging and placement (c0's
    # placement and c1's staging and placement): 7 commits, each one statement of its own
    # (no load before it; the group committer sends it between BEGIN and COMMIT, with the
    # statements of other lanes ready at the same moment).
    assert [s.transaction for s in mine] == [None] * 7
    assert all(s.sql.startswith("WITH lane AS (UPDATE lanes SET version") for s in mine)
    events = await probe.check()
    assert [e.tool_end.tool_call_id for e in events if e.HasField("tool_end")] == ["c0", "c1"]
