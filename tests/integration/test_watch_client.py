"""The Python watch client against the real service and PostgreSQL: snapshot assembly, live
folding, transparent resume across a server restart, re-snapshot on OUT_OF_RANGE, errors.

The rebase decision (``navigation_end``) is tested here as the pure function it is; through the
service (NavigateLane commits ``navigation_end``, the watch re-snapshots) in
tests/integration/test_harness_rpcs.py. The stream is never faked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest
import pytest_asyncio
from lane.client.connect import open_channel
from lane.client.errors import LaneError, WatchProtocolError, lane_error
from lane.client.testing import LaneScript
from lane.client.watch import (
    GroupStep,
    LaneView,
    Recovery,
    RetryPolicy,
    check_heartbeat,
    check_incarnation,
    fold_group,
    recovery_for,
    watch_lane,
)
from lane.v1 import events_pb2, lane_service_pb2_grpc, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api import WatchSettings
from lane.server.app.server import RunningServer, start_server
from tests.support.lanes import events_between, new_lane_id, user

#: Quick resumes for tests; bounded so a broken resume fails instead of hanging.
FAST = RetryPolicy(initial_backoff=0.05, max_backoff=0.3, max_attempts=100)
WAIT_SECONDS = 20.0


# --- helpers ----------------------------------------------------------------------------------


async def capture(stub: Any, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    """A fresh GetLaneSnapshot."""
    response = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    snapshot: snapshot_pb2.LaneSnapshot = response.snapshot
    return snapshot


async def drive_tool_run(stub: Any, lane_id: str, calls: Sequence[str] = ("c1", "c2", "c3")) -> int:
    """One whole run with a parallel tool batch, through the RPCs; return the final revision."""
    run = await LaneScript(stub, lane_id).start_run("go")
    batch = [(c, "shell", {"n": i}) for i, c in enumerate(calls)]
    await run.turn("calling tools", tool_calls=batch)
    for call in calls:
        await run.call(call).start().progress(f"{call} half way")
    for call in reversed(calls):  # out of order: placement waits for source order
        await run.call(call).stage(f"{call} done")
    await run.turn("all done")
    revision: int = (await run.end()).revision
    return revision


async def drive_big_prompt(stub: Any, lane_id: str, messages: int, size: int) -> int:
    """A run whose prompt is ``messages`` user messages of ``size`` characters, then its end
    (aborted: no assistant ever answered, so it cannot complete)."""
    prompt = [user(f"{n:04d} " + "x" * size) for n in range(messages)]
    run = await LaneScript(stub, lane_id).start_run(*prompt)
    end = await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    revision: int = end.revision
    return revision


class Follower:
    """Consumes ``watch_lane`` in a task, keeping every view."""

    def __init__(self, views: AsyncIterator[LaneView]) -> None:
        self.views: list[LaneView] = []
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._consume(views))

    async def _consume(self, views: AsyncIterator[LaneView]) -> None:
        try:
            async for view in views:
                self.views.append(view)
                self._changed.set()
        finally:
            self._changed.set()

    @property
    def latest(self) -> LaneView:
        return self.views[-1]

    async def until(self, revision: int, within: float = WAIT_SECONDS) -> LaneView:
        """Wait for a view at ``revision`` or later; re-raise the watch's failure."""

        async def reached() -> None:
            while not (self.views and self.latest.snapshot.revision >= revision):
                if self._task.done():
                    self._task.result()  # raises the watch's error
                    raise AssertionError("the watch ended")
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), within)
        return self.latest

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def event_revisions(self) -> list[int]:
        return [e.revision for view in self.views for e in view.events]


@contextlib.asynccontextmanager
async def following(views: AsyncIterator[LaneView]) -> AsyncIterator[Follower]:
    follower = Follower(views)
    try:
        yield follower
    finally:
        await follower.close()


class RecordingSleep:
    """A ``sleep`` for watch_lane that records its delays (and sleeps them, briefly)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(delay)


#: The small-limits server: 2 KiB snapshot chunks, 0.3 s heartbeats, a 0.5 s write deadline.
SMALL = WatchSettings(chunk_bytes=2048, heartbeat_seconds=0.3, write_deadline_seconds=0.5)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def small_server(
    session_database_url: str, lane_server: RunningServer
) -> AsyncIterator[RunningServer]:
    """A second whole service on the session database with the :data:`SMALL` watch limits."""
    running = await start_server(session_database_url, watch=SMALL)
    try:
        yield running
    finally:
        await running.stop(0.5)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def small_chunk_stub(small_server: RunningServer) -> AsyncIterator[Any]:
    """A stub to :func:`small_server` through :func:`open_channel`."""
    channel = open_channel(f"127.0.0.1:{small_server.port}")
    try:
        yield lane_service_pb2_grpc.LaneServiceStub(channel)
    finally:
        await channel.close()


# --- (a) live folding -------------------------------------------------------------------------


async def test_snapshot_then_live_groups_fold_to_the_capture(lane_stub) -> None:
    lane = new_lane_id("watch")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    start = await capture(lane_stub, lane)
    async with following(watch_lane(lane_stub, lane, retry=FAST)) as follower:
        first = await follower.until(start.revision)
        assert first == LaneView(snapshot=start)  # the initial view: the snapshot, nothing else
        await drive_tool_run(lane_stub, lane)
        await drive_tool_run(lane_stub, lane, calls=("d1",))
        fresh = await capture(lane_stub, lane)
        await follower.until(fresh.revision)
        assert follower.latest.snapshot == fresh
        # One view per commit, revisions exactly start+1 .. fresh, each group in order.
        assert follower.event_revisions() == list(range(start.revision + 1, fresh.revision + 1))
        for view in follower.views[1:]:
            assert view.events and not view.resnapshotted and not view.heartbeat
            assert view.snapshot.revision == view.events[-1].revision
        kinds = {e.WhichOneof("kind") for view in follower.views for e in view.events}
        assert {"run_start", "tool_start", "tool_update", "tool_end", "run_end"} <= kinds
        assert not fresh.HasField("operation") and fresh.last_result.operation_id


async def test_resuming_from_a_held_snapshot_yields_only_commits(lane_stub) -> None:
    lane = new_lane_id("watch")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    held = await capture(lane_stub, lane)
    await drive_tool_run(lane_stub, lane, calls=("a",))
    fresh = await capture(lane_stub, lane)
    views = watch_lane(lane_stub, lane, after_revision=held.revision, snapshot=held, retry=FAST)
    async with following(views) as follower:
        await follower.until(fresh.revision)
        assert follower.latest.snapshot == fresh
        assert not any(view.resnapshotted for view in follower.views)
        assert follower.event_revisions() == list(range(held.revision + 1, fresh.revision + 1))
    with pytest.raises(ValueError):
        await anext(watch_lane(lane_stub, lane, after_revision=held.revision))


# --- (b) a transcript of many chunks ----------------------------------------------------------


async def test_chunked_snapshot_is_assembled(lane_stub, small_chunk_stub) -> None:
    lane = new_lane_id("chunks")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    await drive_big_prompt(lane_stub, lane, messages=12, size=900)
    await drive_tool_run(lane_stub, lane)
    fresh = await capture(lane_stub, lane)
    # The raw stream really is chunked: a head and several transcript chunks.
    call = small_chunk_stub.WatchLane(pb.WatchLaneRequest(lane_id=lane))
    try:
        head = await call.read()
        assert head.WhichOneof("item") == "snapshot"
        chunks = head.snapshot.following_chunks
        assert chunks >= 4, chunks
        for _ in range(chunks):
            assert (await call.read()).WhichOneof("item") == "transcript_chunk"
    finally:
        call.cancel()
    async with following(watch_lane(small_chunk_stub, lane, retry=FAST)) as follower:
        view = await follower.until(fresh.revision)
        assert view.snapshot == fresh
        assert len(view.snapshot.transcript) == len(fresh.transcript) > 12
        # Live groups keep folding after an assembled snapshot.
        await drive_big_prompt(lane_stub, lane, messages=3, size=3000)
        fresh = await capture(lane_stub, lane)
        await follower.until(fresh.revision)
        assert follower.latest.snapshot == fresh


async def test_heartbeats_are_yielded_on_request(lane_stub, small_chunk_stub) -> None:
    lane = new_lane_id("beat")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    start = await capture(lane_stub, lane)
    views = watch_lane(small_chunk_stub, lane, include_heartbeats=True, retry=FAST)
    try:
        first = await anext(views)
        beat = await asyncio.wait_for(anext(views), WAIT_SECONDS)
        assert first.snapshot == start and not first.heartbeat
        assert beat.heartbeat and beat.snapshot == start and beat.events == ()
    finally:
        await views.aclose()


# --- (c) transparent resume across a server restart -------------------------------------------


async def test_resumes_on_the_same_port_after_the_server_went_away(
    lane_stub, session_database_url: str
) -> None:
    lane = new_lane_id("restart")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    await drive_tool_run(lane_stub, lane, calls=("r1",))
    running = await start_server(session_database_url, listen="127.0.0.1:0")
    port = running.port
    channel = open_channel(f"127.0.0.1:{port}")
    stub = lane_service_pb2_grpc.LaneServiceStub(channel)
    sleep = RecordingSleep()
    restarted: RunningServer | None = None
    try:
        async with following(watch_lane(stub, lane, retry=FAST, sleep=sleep)) as follower:
            before = await capture(lane_stub, lane)
            await follower.until(before.revision)
            start_revision = follower.views[0].snapshot.revision
            await drive_tool_run(lane_stub, lane, calls=("r2",))  # live, through the old server
            await follower.until((await capture(lane_stub, lane)).revision)

            await running.stop(0)
            # Commits while the watched server is gone, through another server instance.
            await drive_tool_run(lane_stub, lane, calls=("r3", "r4"))
            await asyncio.sleep(0.5)  # let the client notice and back off at least once
            restarted = await start_server(session_database_url, listen=f"127.0.0.1:{port}")
            await drive_tool_run(lane_stub, lane, calls=("r5",))
            fresh = await capture(lane_stub, lane)
            await follower.until(fresh.revision)

            assert follower.latest.snapshot == fresh
            assert follower.event_revisions() == list(
                range(start_revision + 1, fresh.revision + 1)
            ), "gap or duplicate across the restart"
            assert not any(view.resnapshotted for view in follower.views)
            assert sum(1 for view in follower.views if not view.events) == 1  # one snapshot
            assert sleep.delays, "the client never backed off"
            assert all(0 < delay <= FAST.max_backoff for delay in sleep.delays)
    finally:
        await channel.close()
        await running.stop(0)
        if restarted is not None:
            await restarted.stop(0)


async def test_a_watcher_cut_off_as_too_slow_resumes_seamlessly(
    lane_stub, small_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lane.client.watch")
    lane = new_lane_id("slow")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    # No BDP probing: the stream's flow-control window stays at 64 KiB, so a watcher that does
    # not read blocks the server's writes after a few big groups.
    channel = open_channel(
        f"127.0.0.1:{small_server.port}", extra_options=[("grpc.http2.bdp_probe", 0)]
    )
    views = watch_lane(lane_service_pb2_grpc.LaneServiceStub(channel), lane, retry=FAST)
    try:
        seen = [await anext(views)]
        for _ in range(6):  # about 80 KB per commit while the watcher reads nothing
            await drive_big_prompt(lane_stub, lane, messages=20, size=4000)
        await asyncio.sleep(SMALL.write_deadline_seconds * 4)  # the server gives up on it
        fresh = await capture(lane_stub, lane)
        while seen[-1].snapshot.revision < fresh.revision:
            seen.append(await asyncio.wait_for(anext(views), WAIT_SECONDS))
        assert seen[-1].snapshot == fresh
        revisions = [e.revision for view in seen for e in view.events]
        assert revisions == list(range(seen[0].snapshot.revision + 1, fresh.revision + 1))
        assert not any(view.resnapshotted for view in seen)
        assert "WATCHER_TOO_SLOW" in caplog.text, "the server never cut the watcher off"
    finally:
        await views.aclose()
        await channel.close()


async def test_server_shutdown_ends_watches_without_server_errors(
    lane_stub, session_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ending a watch on shutdown is routine: the server must not log it as an error."""
    lane = new_lane_id("shutdown")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    running = await start_server(session_database_url)
    channel = open_channel(f"127.0.0.1:{running.port}")
    views = watch_lane(lane_service_pb2_grpc.LaneServiceStub(channel), lane, retry=FAST)
    try:
        await anext(views)
        caplog.set_level(logging.INFO)
        await running.stop(0.5)
        errors = [
            f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR
        ]
        assert not errors, errors
    finally:
        await views.aclose()
        await channel.close()
        await running.stop(0)


async def test_a_silent_stream_counts_as_dropped_and_resumes(lane_stub) -> None:
    """The session server heartbeats every 10 s; with a 0.3 s idle timeout the watch keeps
    resuming (after its revision, no new snapshot) and still folds every commit once."""
    lane = new_lane_id("idle")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    sleep = RecordingSleep()
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.1, max_attempts=None)
    views = watch_lane(lane_stub, lane, idle_timeout=0.3, retry=policy, sleep=sleep)
    async with following(views) as follower:
        start = await follower.until(0)
        await asyncio.sleep(1.5)
        assert len(sleep.delays) >= 2, "the silent stream was never given up on"
        await drive_tool_run(lane_stub, lane, calls=("i",))
        fresh = await capture(lane_stub, lane)
        await follower.until(fresh.revision)
        assert follower.latest.snapshot == fresh
        assert follower.event_revisions() == list(
            range(start.snapshot.revision + 1, fresh.revision + 1)
        )
        assert not any(view.resnapshotted for view in follower.views)


# --- (d) OUT_OF_RANGE → re-snapshot -----------------------------------------------------------


async def test_resume_below_the_retention_floor_resnapshots(lane_stub, lane_server) -> None:
    lane = new_lane_id("retained")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    held = await capture(lane_stub, lane)
    floor = await drive_tool_run(lane_stub, lane)  # the end of a commit group, as retention
    head = await drive_tool_run(lane_stub, lane, calls=("y",))  # keeps whole groups
    async with lane_server.store.pool.connection() as conn:  # simulated retention
        await conn.execute(
            "UPDATE lanes SET retention_floor = %s WHERE lane_id = %s", (floor, lane)
        )
        await conn.execute(
            "DELETE FROM events WHERE lane_id = %s AND revision <= %s", (lane, floor)
        )

    # The raw refusal the client recovers from.
    call = lane_stub.WatchLane(pb.WatchLaneRequest(lane_id=lane, after_revision=held.revision))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    error = lane_error(refused.value)
    assert error.code == grpc.StatusCode.OUT_OF_RANGE
    assert error.reason == "REVISION_OUT_OF_RANGE"
    assert error.metadata["floor"] == str(floor) and error.metadata["head"] == str(head)

    views = watch_lane(lane_stub, lane, after_revision=held.revision, snapshot=held, retry=FAST)
    async with following(views) as follower:
        first = await follower.until(head)
        assert first.resnapshotted and first.events == ()
        assert first.snapshot == await capture(lane_stub, lane)
        await drive_tool_run(lane_stub, lane, calls=("z",))
        fresh = await capture(lane_stub, lane)
        await follower.until(fresh.revision)
        assert follower.latest.snapshot == fresh
        assert follower.event_revisions() == list(range(head + 1, fresh.revision + 1))
        assert [view.resnapshotted for view in follower.views].count(True) == 1

    # At the floor itself resuming works: the events after it are kept.
    kept = await events_between(lane_stub, lane, floor, fresh.revision)
    assert [e.revision for e in kept] == list(range(floor + 1, fresh.revision + 1))


# --- (e) the rebase decision and the other pure decisions --------------------------------------


def _event(revision: int, lane: str = "l", **kind: Any) -> events_pb2.HarnessEvent:
    return events_pb2.HarnessEvent(lane_id=lane, revision=revision, **kind)


def test_navigation_end_asks_for_a_rebase() -> None:
    base = snapshot_pb2.LaneSnapshot(lane_id="l", revision=4)
    plain = fold_group(base, 4, [_event(5, turn_start=events_pb2.TurnStartEvent())])
    assert plain == GroupStep(snapshot=plain.snapshot, revision=5, rebase=False)
    assert plain.snapshot.revision == 5 and base.revision == 4  # pure: the input is unchanged
    group = [
        _event(5, navigation_start=events_pb2.NavigationStartEvent(run_id="n")),
        _event(6, navigation_end=events_pb2.NavigationEndEvent()),
    ]
    rebased = fold_group(base, 4, group)
    assert rebased.rebase and rebased.revision == 6


@pytest.mark.parametrize(
    ("revisions", "problem"),
    [([6], "gap"), ([4], "duplicate"), ([5, 5], "duplicate"), ([5, 7], "gap")],
)
def test_groups_must_continue_exactly(revisions: list[int], problem: str) -> None:
    base = snapshot_pb2.LaneSnapshot(lane_id="l", revision=4)
    group = [_event(r, turn_start=events_pb2.TurnStartEvent()) for r in revisions]
    with pytest.raises(WatchProtocolError, match=problem):
        fold_group(base, 4, group)


def test_other_protocol_violations() -> None:
    base = snapshot_pb2.LaneSnapshot(lane_id="l", revision=4)
    with pytest.raises(WatchProtocolError, match="empty"):
        fold_group(base, 4, [])
    with pytest.raises(WatchProtocolError, match="belongs to lane other"):
        fold_group(base, 4, [_event(5, lane="other", turn_start=events_pb2.TurnStartEvent())])
    check_heartbeat("l", 4, 4)
    check_heartbeat("l", 4, 3)
    with pytest.raises(WatchProtocolError, match="never delivered"):
        check_heartbeat("l", 4, 5)
    # A heartbeat names the incarnation: learned when unknown, never another.
    assert (check_incarnation("l", "", "5"), check_incarnation("l", "5", "")) == ("5", "5")
    with pytest.raises(WatchProtocolError, match="incarnation 6"):
        check_incarnation("l", "5", "6")


def test_recovery_table_and_backoff() -> None:
    code = grpc.StatusCode
    assert recovery_for(LaneError(code.UNAVAILABLE)) is Recovery.RESUME
    assert recovery_for(LaneError(code.UNAVAILABLE, "SERVER_SHUTTING_DOWN")) is Recovery.RESUME
    assert recovery_for(LaneError(code.CANCELLED)) is Recovery.RESUME
    too_slow = LaneError(code.RESOURCE_EXHAUSTED, "WATCHER_TOO_SLOW", "", {"lastRevision": "3"})
    assert recovery_for(too_slow) is Recovery.RESUME
    assert recovery_for(LaneError(code.RESOURCE_EXHAUSTED, "DATABASE_BUSY")) is Recovery.RESUME
    assert recovery_for(LaneError(code.RESOURCE_EXHAUSTED)) is Recovery.RAISE
    out = LaneError(code.OUT_OF_RANGE, "REVISION_OUT_OF_RANGE")
    assert recovery_for(out) is Recovery.RESNAPSHOT
    assert recovery_for(LaneError(code.OUT_OF_RANGE, "OTHER")) is Recovery.RAISE
    recreated = LaneError(code.FAILED_PRECONDITION, "LANE_INCARNATION_CHANGED")
    assert recovery_for(recreated) is Recovery.RESNAPSHOT
    for refused in (code.NOT_FOUND, code.INVALID_ARGUMENT, code.UNAUTHENTICATED, code.INTERNAL):
        assert recovery_for(LaneError(refused, "X")) is Recovery.RAISE
    # The same codes without an ErrorInfo come from the transport: a dropped connection.
    for dropped in (code.CANCELLED, code.UNKNOWN, code.INTERNAL, code.ABORTED):
        assert recovery_for(LaneError(dropped, "", "RST_STREAM")) is Recovery.RESUME
    for refused in (code.NOT_FOUND, code.INVALID_ARGUMENT, code.UNAUTHENTICATED):
        assert recovery_for(LaneError(refused)) is Recovery.RAISE
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, multiplier=2.0, jitter=0.5)
    assert [policy.delay(n, 0.0) for n in (1, 2, 3, 4, 5, 10_000)] == [0.1, 0.2, 0.4, 0.8, 1, 1]
    assert policy.delay(1, 0.999) == pytest.approx(0.05, rel=0.01)


# --- (f) errors that end the watch ------------------------------------------------------------


async def test_unknown_lane_raises_lane_not_found(lane_stub) -> None:
    lane = new_lane_id("missing")
    with pytest.raises(LaneError) as raised:
        await anext(watch_lane(lane_stub, lane, retry=FAST))
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert raised.value.reason == "LANE_NOT_FOUND"
    assert raised.value.message


async def test_invalid_lane_id_raises_invalid_argument(lane_stub) -> None:
    with pytest.raises(LaneError) as raised:
        await anext(watch_lane(lane_stub, "", retry=FAST))
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_unreachable_server_gives_up_after_max_attempts(unused_tcp_port: int) -> None:
    channel = open_channel(f"127.0.0.1:{unused_tcp_port}")
    sleep = RecordingSleep()
    policy = RetryPolicy(initial_backoff=0.01, max_backoff=0.02, max_attempts=3)
    try:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        with pytest.raises(LaneError) as raised:
            await anext(watch_lane(stub, "lane", retry=policy, sleep=sleep))
        assert raised.value.code == grpc.StatusCode.UNAVAILABLE
        assert len(sleep.delays) == 3
    finally:
        await channel.close()


async def test_a_full_server_is_waited_for_as_long_as_it_asks(session_database_url) -> None:
    # One watcher per lane, and a refusal that asks for 0.4 s: longer than FAST's backoff.
    watch = WatchSettings(max_watchers_per_lane=1, full_retry_seconds=0.4)
    running = await start_server(session_database_url, watch=watch)
    channel = open_channel(f"127.0.0.1:{running.port}")
    try:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        lane = new_lane_id("full")
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
        holder = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane))
        await holder.read()  # the lane's one slot is taken
        sleep = RecordingSleep()
        refusals: list[LaneError] = []
        refused_twice = asyncio.Event()

        def refused(_: int, err: LaneError) -> None:
            refusals.append(err)
            if len(refusals) >= 2:
                refused_twice.set()

        views = watch_lane(stub, lane, retry=FAST, sleep=sleep, on_retry=refused)
        async with following(views) as follower:
            await asyncio.wait_for(refused_twice.wait(), WAIT_SECONDS)
            assert follower.views == []
            holder.cancel()  # the slot is free: the next attempt gets in
            await follower.until(1)
        assert refusals and {err.reason for err in refusals} == {"TOO_MANY_WATCHERS"}
        assert all(err.retry_after == 0.4 for err in refusals)
        assert sleep.delays and min(sleep.delays) >= 0.4
    finally:
        await channel.close()
        await running.stop(0)
