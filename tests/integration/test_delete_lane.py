"""DeleteLane: a lane and every row of it go in one transaction; refused while an operation is
open unless forced; its watchers end NOT_FOUND LANE_DELETED, in this process and in others; a
retry with the request id answers as the first call; the id can be used again, fresh."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from lane.client.testing import LaneScript, RunScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import start_server
from lane.server.store import DEFAULT_NAMESPACE, LaneRef, Store
from lane.server.store.lane_removal import LANE_TABLES
from tests.integration.lanes import (
    Probe,
    error_info,
    leased_run,
    new_lane_id,
)
from tests.integration.servers import extra_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any
NEXT_RUN = snapshot_pb2.QUEUE_KIND_NEXT_RUN
#: Generous bounds that only keep a broken test from hanging; nothing is timed by them.
PATIENCE = 30.0


async def busy_lane(stub: Stub, lane_id: str) -> RunScript:
    """A lane with a leased run, a started tool call, a usage row, a queued message and a
    recorded answer: a row in every table a lane has."""
    run = await leased_run(stub, Probe(stub, lane_id), "c1")
    await run.call("c1").start().progress("half", checkpoint=True)
    await stub.RecordUsage(
        pb.RecordUsageRequest(lane_id=lane_id, usage=messages_pb2.Usage(input=3, total_tokens=3))
    )
    await run.lane.enqueue("later", request_id="queued-1")
    return run


async def rows_of(store: Store, lane_id: str) -> dict[str, int]:
    """How many rows each table holds for the lane (the lanes table included)."""
    counts: dict[str, int] = {}
    async with store.pool.connection() as conn:
        for table in (*LANE_TABLES, "lanes"):
            cur = await conn.execute(
                f"SELECT count(*) FROM {table} WHERE namespace = %s AND lane_id = %s",
                (DEFAULT_NAMESPACE, lane_id),
            )
            row = await cur.fetchone()
            assert row is not None
            counts[table] = row[0]
    return counts


async def refusal(awaitable: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await awaitable
    info = error_info(raised.value)
    return raised.value.code(), info.reason, dict(info.metadata)


class Watcher:
    """A WatchLane stream read to its end in the background: its revisions and final status."""

    def __init__(self, stub: Stub, lane_id: str) -> None:
        self.call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        self.revision = 0
        self.seen = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> grpc.aio.AioRpcError | None:
        try:
            async for response in self.call:
                kind = response.WhichOneof("item")
                if kind == "snapshot":
                    self.revision = response.snapshot.snapshot.revision
                elif kind == "event_group":
                    self.revision = response.event_group.events[-1].revision
                self.seen.set()
        except grpc.aio.AioRpcError as error:
            return error
        return None

    async def attached(self) -> None:
        await asyncio.wait_for(self.seen.wait(), PATIENCE)

    async def end(self) -> tuple[grpc.StatusCode, str, dict[str, str]]:
        error = await asyncio.wait_for(self.task, PATIENCE)
        assert error is not None, "the stream ended OK"
        info = error_info(error)
        return error.code(), info.reason, dict(info.metadata)


async def watched_then_deleted(stub: Stub, lane_id: str) -> Watcher:
    """A watcher attached to the new lane ``lane_id``, which is then deleted."""
    await LaneScript.create(stub, lane_id)
    watcher = Watcher(stub, lane_id)
    await watcher.attached()
    await stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
    return watcher


def table_names_of_schema() -> set[str]:
    """Every table the migrations create, but the service's own bookkeeping."""
    import re

    from lane.server.store.migrations import available_migrations

    names = set()
    for _, _, sql in available_migrations():
        names.update(re.findall(r"CREATE TABLE (\w+)", sql))
    return names - {"schema_migrations"}


async def test_every_table_of_a_lane_is_deleted() -> None:
    # A table added later and forgotten in LANE_TABLES would keep deleted lanes' rows.
    assert table_names_of_schema() == {*LANE_TABLES, "lanes"}


async def test_an_idle_lane_is_deleted_with_every_row(lane_stub: Stub, store: Store) -> None:
    lane_id = new_lane_id("del")
    await (await LaneScript.create(lane_stub, lane_id)).enqueue("hi", NEXT_RUN)
    before = await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    deleted = await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
    assert (deleted.revision, deleted.operation_id) == (before.snapshot.revision, "")
    assert set((await rows_of(store, lane_id)).values()) == {0}
    assert await refusal(lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))) == (
        grpc.StatusCode.NOT_FOUND,
        "LANE_NOT_FOUND",
        {"laneId": lane_id},
    )
    # Deleting again: the lane is not there.
    code, reason, _ = await refusal(lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id)))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "LANE_NOT_FOUND")
    listed = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=1000))
    assert lane_id not in [lane.lane_id for lane in listed.lanes]


async def test_an_open_run_refuses_the_delete_and_nothing_changes(
    lane_stub: Stub, store: Store
) -> None:
    lane_id = new_lane_id("del-busy")
    operation = (await busy_lane(lane_stub, lane_id)).operation_id
    rows = await rows_of(store, lane_id)
    assert all(rows.values()), rows  # a row in every table
    before = await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    code, reason, metadata = await refusal(
        lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id, request_id="del-1"))
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LANE_BUSY")
    assert metadata["openOperationId"] == operation
    assert await rows_of(store, lane_id) == rows
    after = await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert after == before


async def test_force_deletes_the_open_run_with_the_lane(lane_stub: Stub, store: Store) -> None:
    lane_id = new_lane_id("del-force")
    run = await busy_lane(lane_stub, lane_id)
    deleted = await lane_stub.DeleteLane(
        pb.DeleteLaneRequest(lane_id=lane_id, force=True, request_id="del-1")
    )
    assert deleted.operation_id == run.operation_id
    # Only the delete's own answer stays (under its request id), for a retry.
    rows = await rows_of(store, lane_id)
    assert rows.pop("requests") == 1
    assert set(rows.values()) == {0}
    # The run's driver learns it at its next command.
    code, reason, _ = await refusal(lane_stub.RenewLease(run.aim.request(pb.RenewLeaseRequest)))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "LANE_NOT_FOUND")
    # A retry of the delete answers as the first call did; a different request under the
    # same id is refused.
    again = await lane_stub.DeleteLane(
        pb.DeleteLaneRequest(lane_id=lane_id, force=True, request_id="del-1")
    )
    assert again == deleted
    code, reason, _ = await refusal(
        lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id, request_id="del-1"))
    )
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED")


async def test_the_id_can_be_used_again_and_the_lane_starts_fresh(
    lane_stub: Stub, store: Store
) -> None:
    lane_id = new_lane_id("del-again")
    await busy_lane(lane_stub, lane_id)
    await lane_stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id, force=True))
    created = await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    assert (created.created, created.revision) == (True, 1)
    probe = Probe(lane_stub, lane_id)
    fresh = await probe.start()
    assert (len(fresh.transcript), fresh.tip_id, list(fresh.queues)) == (0, "", [])
    assert not fresh.HasField("operation") and not fresh.HasField("last_result")
    assert fresh.stats.message_count == 0 and fresh.stats.usage.total_tokens == 0
    # The new lane works, and its events are its own (fold equals capture from revision 0).
    assert (await leased_run(lane_stub, probe, "c1")).operation_id
    await probe.check()
    assert probe.events[0].revision == 2


async def test_a_watcher_in_this_process_ends_lane_deleted(lane_stub: Stub) -> None:
    lane_id = new_lane_id("del-watch")
    watcher = await watched_then_deleted(lane_stub, lane_id)
    code, reason, metadata = await watcher.end()
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "LANE_DELETED")
    assert metadata == {"laneId": lane_id, "lastRevision": "1"}
    # A new watcher of the id gets the plain answer for a lane that does not exist.
    late = Watcher(lane_stub, lane_id)
    assert (await late.end())[:2] == (grpc.StatusCode.NOT_FOUND, "LANE_NOT_FOUND")


@pytest.mark.parametrize("notify", [True, False], ids=["notice", "poll"])
async def test_a_watcher_on_another_server_ends_lane_deleted(
    session_database_url: str, lane_stub: Stub, notify: bool
) -> None:
    # With NOTIFY the deletion notice ends it, and the poll (one a minute) cannot; without
    # NOTIFY the poll finds the lane gone.
    poll = 60.0 if notify else 0.2
    async with (
        extra_server(session_database_url, notify=notify, poll_interval=poll) as (watching, stub),
        extra_server(session_database_url, notify=notify, poll_interval=poll) as (deleting, other),
    ):
        if notify:
            for running in (watching, deleting):
                await asyncio.wait_for(running.hub.listening.wait(), PATIENCE)
        lane_id = new_lane_id("del-remote")
        await other.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        watchers = [Watcher(stub, lane_id) for _ in range(3)]
        for watcher in watchers:
            await watcher.attached()
        await other.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
        for watcher in watchers:
            assert (await watcher.end())[:2] == (grpc.StatusCode.NOT_FOUND, "LANE_DELETED")
        assert watching.hub.watcher_count(LaneRef(DEFAULT_NAMESPACE, lane_id)) == 0


async def test_a_lane_created_again_is_watched_afresh_after_the_delete(lane_stub: Stub) -> None:
    lane_id = new_lane_id("del-rewatch")
    old = await watched_then_deleted(lane_stub, lane_id)
    lane = await LaneScript.create(lane_stub, lane_id)
    new = Watcher(lane_stub, lane_id)
    await new.attached()
    assert (await old.end())[1] == "LANE_DELETED"
    queued = await lane.enqueue("hi", NEXT_RUN)
    while new.revision < queued.revision:
        new.seen.clear()
        await asyncio.wait_for(new.seen.wait(), PATIENCE)
    assert new.revision == queued.revision == 2
    new.call.cancel()


async def test_watchers_started_before_their_lanes_exist_never_end_lane_deleted(
    session_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing is deleted here. The race, made to happen every time: watchers subscribe before
    # their lanes exist; the hub's poll reads the lanes' heads then (none is there) and hands
    # its answer over only once the lanes were created and every watcher read its snapshot, as
    # a busy process would. That poll must not take the lanes for deleted. A pool of 2 (the
    # watchers' reads one at a time) as in the load run that found it.
    settings = Settings(
        database_url=session_database_url, db_pool_size=2, poll_interval_seconds=0.1
    )
    running = await start_server(settings, listen="127.0.0.1:0")
    lane_ids = {new_lane_id("early") for _ in range(50)}
    read_heads, read_snapshot = running.store.lane_heads, running.store.snapshot_outline
    polled, created, attached = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def late_heads(lanes: Any) -> Any:
        heads = await read_heads(lanes)
        # The first poll of the watched lanes (of some of them, if it came in the middle).
        if not polled.is_set() and any(lane.lane_id in lane_ids for lane in lanes):
            assert not any(lane.lane_id in lane_ids for lane in heads)  # none exists yet
            polled.set()
            await attached.wait()
        return heads

    async def snapshot_once_created(lane: Any) -> Any:
        await created.wait()
        return await read_snapshot(lane)

    monkeypatch.setattr(running.store, "lane_heads", late_heads)
    monkeypatch.setattr(running.store, "snapshot_outline", snapshot_once_created)
    channel = grpc.aio.insecure_channel(running.address)
    try:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        watchers = [Watcher(stub, lane_id) for lane_id in lane_ids]
        await asyncio.wait_for(polled.wait(), PATIENCE)
        for lane_id in lane_ids:
            await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
        created.set()
        for watcher in watchers:
            await watcher.attached()
        attached.set()
        # That poll's answer, and many polls after it.
        await asyncio.sleep(0.5)
        ended = [watcher.task.result() for watcher in watchers if watcher.task.done()]
        assert [(e.code(), error_info(e).reason) for e in ended if e is not None] == []
        assert running.hub.watcher_count() == len(watchers)
        for watcher in watchers:
            watcher.call.cancel()
        await asyncio.gather(*(watcher.task for watcher in watchers), return_exceptions=True)
    finally:
        await channel.close()
        await running.stop(grace=0.5)


async def test_a_watcher_elsewhere_ends_lane_deleted_when_its_lane_was_created_again(
    session_database_url: str,
) -> None:
    # No deletion notice (NOTIFY off), and the lane deleted, created again and grown past the
    # watcher's revision between two polls: the poll finds the lane, but another incarnation
    # of it. The watcher ends LANE_DELETED and never gets the new lane's events.
    async with (
        extra_server(session_database_url, notify=False, poll_interval=2.0) as (_, stub),
        extra_server(session_database_url, notify=False, poll_interval=2.0) as (_, other),
    ):
        lane_id = new_lane_id("del-again-remote")
        lane = await LaneScript.create(other, lane_id)
        await lane.enqueue("old", NEXT_RUN)
        watcher = Watcher(stub, lane_id)
        await watcher.attached()
        assert watcher.revision == 2
        await other.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
        again = await LaneScript.create(other, lane_id)
        for n in range(3):
            await again.enqueue(f"new {n}", NEXT_RUN)
        code, reason, metadata = await watcher.end()
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "LANE_DELETED")
        assert metadata["lastRevision"] == "2" and watcher.revision == 2
