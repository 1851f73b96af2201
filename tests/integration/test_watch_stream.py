"""WatchLane against real servers: snapshot then groups, resume, heartbeats, retention,
NOTIFY on and off, several processes, a killed LISTEN connection, slow watchers, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
from datetime import timedelta

import grpc
import pytest
from lane.client.reducer import fold
from lane.v1 import events_pb2, lane_service_pb2_grpc, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb
from prometheus_client import CollectorRegistry

from lane.server.api import WatchSettings
from lane.server.store import DEFAULT_NAMESPACE, LaneRef
from lane.server.store.retention import enforce_retention
from tests.integration.lanes import (
    assistant,
    error_info,
    error_reason,
    kinds,
    new_lane_id,
    result,
    tool_call,
    user,
)
from tests.integration.servers import extra_server
from tests.integration.stalled_watcher import frozen_client

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Watcher:
    """Reads one WatchLane stream in the background, folding what it receives."""

    def __init__(self, stub, lane_id: str, after: int | None = None) -> None:
        request = pb.WatchLaneRequest(lane_id=lane_id)
        if after is not None:
            request.after_revision = after
        self.call = stub.WatchLane(request)
        self.snapshot = snapshot_pb2.LaneSnapshot()
        self.groups: list[list[events_pb2.HarnessEvent]] = []
        self.heartbeats: list[int] = []
        self.revision = after or 0
        self.error: grpc.aio.AioRpcError | None = None
        self._moved = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                kind = response.WhichOneof("item")
                if kind == "snapshot":
                    self.snapshot = response.snapshot.snapshot
                    self.revision = self.snapshot.revision
                elif kind == "transcript_chunk":
                    self.snapshot.transcript.extend(response.transcript_chunk.entries)
                elif kind == "event_group":
                    events = list(response.event_group.events)
                    assert events[0].revision == self.revision + 1, "gap or duplicate"
                    self.groups.append(events)
                    self.snapshot = fold(self.snapshot, events).snapshot
                    self.revision = events[-1].revision
                else:
                    self.heartbeats.append(response.heartbeat.head_revision)
                async with self._moved:
                    self._moved.notify_all()
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        async with self._moved:
            self._moved.notify_all()

    async def until(self, done, within: float = 20.0) -> None:
        """Wait until ``done()`` holds (or the stream failed)."""
        async with asyncio.timeout(within), self._moved:
            await self._moved.wait_for(lambda: done() or self.error is not None)
        assert self.error is None, self.error

    async def reach(self, revision: int, within: float = 20.0) -> None:
        """Wait until the stream delivered ``revision``."""
        await self.until(lambda: self.revision >= revision, within)

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def snapshot_of(stub, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    response = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    snapshot: snapshot_pb2.LaneSnapshot = response.snapshot
    return snapshot


async def new_lane(stub) -> str:
    lane_id = new_lane_id("watch")
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    return lane_id


async def enqueue(stub, lane_id: str, n: int = 1) -> int:
    revision = 0
    for i in range(n):
        answer = await stub.EnqueueMessage(
            pb.EnqueueMessageRequest(
                lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user(f"m{i}")
            )
        )
        revision = answer.revision
    return revision


async def test_snapshot_then_whole_groups_live(lane_stub) -> None:
    lane_id = await new_lane(lane_stub)
    watcher = Watcher(lane_stub, lane_id)
    try:
        await watcher.reach(1)
        run = await lane_stub.StartRun(
            pb.StartRunRequest(lane_id=lane_id, prompt=[user("a"), user("b")])
        )
        await watcher.reach(run.revision)
        # One commit, one group: run_start and both prompts' lifecycles arrive together.
        assert kinds(watcher.groups[-1]) == [
            "run_start",
            *["message_start", "message_end", "entry_added"] * 2,
        ]
        assert watcher.snapshot == await snapshot_of(lane_stub, lane_id)
    finally:
        await watcher.close()


async def test_resume_at_floor_and_refusal_outside_the_log(lane_stub, store) -> None:
    lane_id = await new_lane(lane_stub)
    head = await enqueue(lane_stub, lane_id, 6)
    # Retention with a tiny window: keep 2 events, any age.
    floors = await enforce_retention(store.pool, keep_events=2, keep_age=timedelta(0))
    floor = floors[LaneRef(DEFAULT_NAMESPACE, lane_id)]
    assert floor == head - 2  # one event per group here, so the floor is exact
    watcher = Watcher(lane_stub, lane_id, after=floor)
    try:
        await watcher.reach(head)
        assert [g[0].revision for g in watcher.groups] == [floor + 1, floor + 2]
    finally:
        await watcher.close()
    for bad in (floor - 1, head + 1):
        refused = Watcher(lane_stub, lane_id, after=bad)
        await refused.task
        assert refused.error is not None
        assert refused.error.code() == grpc.StatusCode.OUT_OF_RANGE
        assert error_reason(refused.error) == "REVISION_OUT_OF_RANGE"
        info = error_info(refused.error)
        assert (info.metadata["floor"], info.metadata["head"]) == (str(floor), str(head))


async def test_resume_at_every_revision_of_a_multi_event_group(lane_stub) -> None:
    lane_id = await new_lane(lane_stub)  # revision 1
    run = await lane_stub.StartRun(
        pb.StartRunRequest(lane_id=lane_id, prompt=[user("one"), user("two")])
    )
    # The groups as a watch from the start delivers them: the truth each resume is held to.
    full = Watcher(lane_stub, lane_id, after=0)
    try:
        await full.reach(run.revision)
    finally:
        await full.close()
    groups = full.groups
    assert any(len(group) > 2 for group in groups), "the run's start is one multi-event group"
    for group in groups:
        first, last = group[0].revision, group[-1].revision
        for after in range(first - 1, last):
            resumed = Watcher(lane_stub, lane_id, after=after)
            try:
                if after == first - 1:  # a boundary: the whole group comes first
                    await resumed.reach(last)
                    assert resumed.groups[0] == group
                    continue
                await resumed.task
            finally:
                await resumed.close()
            assert resumed.groups == [], f"part of a group sent after revision {after}"
            assert resumed.error is not None
            assert resumed.error.code() == grpc.StatusCode.OUT_OF_RANGE
            assert error_reason(resumed.error) == "REVISION_INSIDE_GROUP"
            metadata = error_info(resumed.error).metadata
            assert (metadata["groupFirst"], metadata["groupLast"]) == (str(first), str(last))


async def test_event_log_reads_hold_whole_groups_within_a_byte_budget(lane_stub, store) -> None:
    lane_id = await new_lane(lane_stub)
    lane = LaneRef(DEFAULT_NAMESPACE, lane_id)
    for n in range(12):  # one group of one event each, 10 KiB more each (the queue grows)
        await lane_stub.EnqueueMessage(
            pb.EnqueueMessageRequest(
                lane_id=lane_id,
                kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                message=user(f"{n}" + "x" * 10_000),
            )
        )
    everything = await store.read_events(lane, 0, 1000, 1 << 30)
    sizes = [sum(len(body) for body in group.bodies) for group in everything]
    # A group comes when it starts within the budget: the bytes before it are fewer.
    three = sum(sizes[1:4])
    read = await store.read_events(lane, 1, 1000, three)
    assert [g.first_revision for g in read] == [2, 3, 4]
    read = await store.read_events(lane, 1, 1000, three + 1)
    assert [g.first_revision for g in read] == [2, 3, 4, 5]
    # The first group always comes, whatever its size: a read makes progress.
    assert [g.first_revision for g in await store.read_events(lane, 1, 1000, 1)] == [2]


async def test_a_resumed_watcher_catches_up_in_reads_within_its_budget(
    session_database_url,
) -> None:
    watch = WatchSettings(stream_bytes=64 * 1024)  # catch-up reads of 32 KiB
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        lane_id = await new_lane(stub)
        for n in range(20):
            answer = await stub.EnqueueMessage(
                pb.EnqueueMessageRequest(
                    lane_id=lane_id,
                    kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                    message=user(f"{n}" + "x" * 10_000),
                )
            )
        reads = running.store.event_log_reads
        watcher = Watcher(stub, lane_id, after=0)
        try:
            await watcher.reach(answer.revision)
        finally:
            await watcher.close()
        assert [g[0].revision for g in watcher.groups] == list(range(1, answer.revision + 1))
        # 21 groups (the lane's creation, then 10, 20, ... 200 KiB): most alone in a 32 KiB read.
        assert running.store.event_log_reads - reads >= 5


async def test_heartbeats_while_idle(session_database_url) -> None:
    watch = WatchSettings(heartbeat_seconds=0.1)
    async with extra_server(session_database_url, watch=watch) as (_, stub):
        lane_id = await new_lane(stub)
        watcher = Watcher(stub, lane_id)
        try:
            await watcher.reach(1)
            await watcher.until(lambda: len(watcher.heartbeats) >= 2)
            assert watcher.heartbeats[:2] == [1, 1]
        finally:
            await watcher.close()


@pytest.mark.parametrize("notify", [True, False], ids=["notify-on", "notify-off"])
async def test_watcher_on_one_process_sees_commits_of_another(session_database_url, notify) -> None:
    # With NOTIFY on, polling is slowed to a minute so only the doorbell can deliver in time.
    poll = 60.0 if notify else 0.2
    async with (
        extra_server(session_database_url, notify=notify, poll_interval=poll) as (_, watched),
        extra_server(session_database_url, notify=notify, poll_interval=poll) as (_, writer),
    ):
        lane_id = await new_lane(writer)
        watcher = Watcher(watched, lane_id)
        try:
            await watcher.reach(1)
            head = await enqueue(writer, lane_id, 5)
            await watcher.reach(head)
            assert watcher.snapshot == await snapshot_of(writer, lane_id)
        finally:
            await watcher.close()


def doorbells_sent(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("lane_doorbells_sent_total") or 0.0


async def until(condition, within: float = 10.0) -> None:
    """Poll ``condition`` (state of another component, which signals nothing) until it holds."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_doorbells_ring_only_lanes_watched_in_another_process(session_database_url) -> None:
    # Polling slowed to a minute: only a doorbell delivers in time.
    async with (
        extra_server(session_database_url, poll_interval=60.0) as (watched_server, watched),
        extra_server(session_database_url, poll_interval=60.0) as (writer_server, writer),
    ):
        for running in (watched_server, writer_server):
            await asyncio.wait_for(running.hub.listening.wait(), 10)
        lane_id, unwatched = await new_lane(writer), await new_lane(writer)
        watcher = Watcher(watched, lane_id)
        try:
            await watcher.reach(1)
            # The watching process announces the lane; the writer hears it.
            await until(
                lambda: writer_server.hub.watched_elsewhere(LaneRef(DEFAULT_NAMESPACE, lane_id))
            )
            assert not writer_server.hub.watched_elsewhere(LaneRef(DEFAULT_NAMESPACE, unwatched))
            before = doorbells_sent(writer_server.registry)
            await enqueue(writer, unwatched, 3)
            head = await enqueue(writer, lane_id, 1)
            await watcher.reach(head)
            # Doorbells go out in commit order: once the watched lane's is counted, any of the
            # unwatched lane's would have been too. Nobody watches that one: it rang no one.
            await until(lambda: doorbells_sent(writer_server.registry) > before)
            assert doorbells_sent(writer_server.registry) - before == 1
            assert watcher.snapshot == await snapshot_of(writer, lane_id)
        finally:
            await watcher.close()


async def test_killed_listen_connection_recovers_without_gap(session_database_url, store) -> None:
    async with (
        extra_server(session_database_url, poll_interval=60.0) as (watched_server, watched),
        extra_server(session_database_url, poll_interval=60.0) as (_, writer),
    ):
        lane_id = await new_lane(writer)
        watcher = Watcher(watched, lane_id)
        try:
            await watcher.reach(1)
            hub = watched_server.hub
            await asyncio.wait_for(hub.listening.wait(), 10)
            async with store.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE query = 'LISTEN lane_events' AND datname = current_database()"
                    " AND pid IN (SELECT pid FROM pg_stat_activity"
                    "  WHERE application_name = '' OR application_name IS NOT NULL)"
                )
                assert any(row[0] for row in await cur.fetchall())
            # Commits while the listener is down reach nobody by NOTIFY ...
            head = await enqueue(writer, lane_id, 3)
            # ... but the reconnected hub catches every watcher up from its revision.
            await watcher.reach(head)
            assert [g[0].revision for g in watcher.groups] == list(range(2, head + 1))
            assert watcher.snapshot == await snapshot_of(writer, lane_id)
        finally:
            await watcher.close()


def _has_snapshot(watcher: Watcher) -> bool:
    return watcher.revision > 0


async def admitted(stub, lane_id: str, within: float) -> Watcher:
    """A watcher of ``lane_id`` that got its snapshot, trying again while the lane is full."""
    async with asyncio.timeout(within):
        while True:
            watcher = Watcher(stub, lane_id)
            with contextlib.suppress(AssertionError):
                await watcher.until(functools.partial(_has_snapshot, watcher))
                return watcher
            assert watcher.error is not None
            assert error_reason(watcher.error) == "TOO_MANY_WATCHERS", watcher.error
            await asyncio.sleep(0.2)


async def test_slow_watcher_is_cut_off_and_nobody_else_waits(session_database_url) -> None:
    # A deadline far above any scheduling hiccup of a loaded test machine, so only the client
    # that stopped reading can miss it. Two slots: the stalled client's and a healthy one's.
    watch = WatchSettings(write_deadline_seconds=2.0, max_watchers_per_lane=2)
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        lane_id = new_lane_id("slow")
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        run = await stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
        run_id = run.operation_id
        turn = await stub.StartTurn(pb.StartTurnRequest(lane_id=lane_id, operation_id=run_id))
        await stub.SettleAssistantMessage(
            pb.SettleAssistantMessageRequest(
                lane_id=lane_id,
                operation_id=run_id,
                turn_id=turn.turn_id,
                message=assistant(tool_call("big", "t", {})),
            )
        )
        await stub.StartToolCall(
            pb.StartToolCallRequest(
                lane_id=lane_id, operation_id=run_id, tool_call_id="big", arguments_json="{}"
            )
        )
        # The stalled client is a process of its own, frozen once it has its snapshot: it stops
        # reading down to its socket, as a hung client does.
        async with frozen_client(running.port, lane_id) as stalled:
            assert stalled.stdout is not None
            healthy = Watcher(stub, lane_id)
            payload = "x" * 500_000  # within the 512 KiB payload limit
            head = 0
            for _ in range(80):  # 40 MB: more than gRPC and both kernels' buffers can hold
                answer = await stub.UpdateToolCall(
                    pb.UpdateToolCallRequest(
                        lane_id=lane_id,
                        operation_id=run_id,
                        tool_call_id="big",
                        partial_result=result(payload),
                    )
                )
                head = answer.revision
            # Commits went through while the stalled watcher held its stream, and a healthy
            # watcher got everything.
            try:
                await healthy.reach(head, within=60)
                assert healthy.snapshot == await snapshot_of(stub, lane_id)
                # The stalled client's slot is freed at its deadline while it is still frozen:
                # a third watcher gets in beside the healthy one.
                third = await admitted(stub, lane_id, within=60)
                await third.close()
            finally:
                await healthy.close()
            # Once thawed, the stalled client finds what was buffered, then the cut-off.
            stalled.send_signal(signal.SIGCONT)
            line = await asyncio.wait_for(stalled.stdout.readline(), 60)
            outcome = json.loads(line)
            assert (outcome["code"], outcome["reason"]) == (
                "RESOURCE_EXHAUSTED",
                "WATCHER_TOO_SLOW",
            )
            assert outcome["received"] < 80  # it was cut off before the end
            # ... naming a revision it had: at most what it received, events of 1 revision each.
            snapshot_revision = head - 80
            assert snapshot_revision <= int(outcome["lastRevision"]) <= head - 1


async def test_shutdown_ends_streams_with_unavailable(session_database_url) -> None:
    async with extra_server(session_database_url) as (running, stub):
        lane_id = await new_lane(stub)
        watcher = Watcher(stub, lane_id)
        await watcher.reach(1)
        await running.stop(grace=30)
        await asyncio.wait_for(watcher.task, 10)
        assert watcher.error is not None
        assert watcher.error.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(watcher.error) == "SERVER_SHUTTING_DOWN"


async def test_a_watcher_cut_before_its_first_message_went_out_is_cut_quietly(
    session_database_url, caplog
) -> None:
    # A client that reads nothing, with a small flow-control window (no BDP probing): the
    # first message (the snapshot head, near 1 MiB with this inbox) cannot go out. Were the
    # stream's headers held with it, gRPC would refuse the status that ends the stream
    # (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, logged at ERROR) and the client would never learn
    # why. The cut is quiet, the slot freed, and the client reads WATCHER_TOO_SLOW.
    watch = WatchSettings(write_deadline_seconds=1.0)
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        lane_id = await new_lane(stub)
        for n in range(3):
            await stub.EnqueueMessage(
                pb.EnqueueMessageRequest(
                    lane_id=lane_id,
                    kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                    message=user(f"{n}" + "x" * 300_000),
                )
            )
        small_window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)]
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}", options=small_window)
        try:
            with caplog.at_level(logging.WARNING):
                call = lane_service_pb2_grpc.LaneServiceStub(channel).WatchLane(
                    pb.WatchLaneRequest(lane_id=lane_id)
                )
                await call.wait_for_connection()
                async with asyncio.timeout(30):
                    while not running.hub.watcher_count():  # noqa: ASYNC110 (no event for it)
                        await asyncio.sleep(0.05)
                    while running.hub.watcher_count():  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    async with asyncio.timeout(30):
                        async for _ in call:
                            pass
                assert error_reason(caught.value) == "WATCHER_TOO_SLOW"
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        finally:
            await channel.close()
