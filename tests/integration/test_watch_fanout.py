"""WatchLane fan-out: one read per commit, shared.

A commit made in a process reaches that process's watchers of its lane from memory (no read of
the event log at all); a commit made in another process is read once per lane and process,
however many watchers the lane has there; a watcher resumed behind its lane's feed catches up
from the log and then shares the feed again. Reads are counted by each server's store
(``Store.event_log_reads``), so servers in one test process do not mix their counts.
"""

from __future__ import annotations

import asyncio

import pytest

from lane.server.api import WatchSettings
from lane.server.hub import feed
from lane.server.store import DEFAULT_NAMESPACE, LaneRef
from tests.integration.servers import extra_server
from tests.integration.test_watch_stream import (
    Watcher,
    enqueue,
    new_lane,
    snapshot_of,
    until,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Commits per phase.
COMMITS = 5


async def attach(stub, lane_id: str, n: int, head: int) -> list[Watcher]:
    """``n`` watchers of ``lane_id``, each past its snapshot at ``head``."""
    watchers = [Watcher(stub, lane_id) for _ in range(n)]
    for watcher in watchers:
        await watcher.reach(head)
    return watchers


async def close_all(watchers: list[Watcher]) -> None:
    for watcher in watchers:
        await watcher.close()


async def test_a_local_commit_reaches_every_watcher_without_a_read(session_database_url) -> None:
    # Polling slowed to a minute: it cannot read anything during the test.
    async with extra_server(session_database_url, poll_interval=60.0) as (running, stub):
        lane_id = await new_lane(stub)
        head = 1
        for n in (1, 10):
            settled = running.hub.shared_reads
            watchers = await attach(stub, lane_id, n, head)
            try:
                # The lane's first watcher is announced to other processes, and its feed read
                # once shortly after (a commit made elsewhere meanwhile rang no doorbell here).
                # That read is not a commit's: let it pass before counting.
                await until(lambda: running.hub.shared_reads > settled)  # noqa: B023
                reads = running.store.event_log_reads
                for _ in range(COMMITS):
                    head = await enqueue(stub, lane_id)
                for watcher in watchers:
                    await watcher.reach(head)
                # No read at all, with one watcher or ten: every group came from memory.
                assert running.store.event_log_reads == reads
                captured = await snapshot_of(stub, lane_id)
                for watcher in watchers:
                    assert watcher.snapshot == captured
                    assert [g[0].revision for g in watcher.groups][-COMMITS:] == list(
                        range(head - COMMITS + 1, head + 1)
                    )
            finally:
                await close_all(watchers)


async def test_commits_of_another_process_are_read_once_per_lane(session_database_url) -> None:
    # Polling slowed to a minute: only doorbells deliver in time.
    async with (
        extra_server(session_database_url, poll_interval=60.0) as (watched_server, watched),
        extra_server(session_database_url, poll_interval=60.0) as (writer_server, writer),
    ):
        for running in (watched_server, writer_server):
            await asyncio.wait_for(running.hub.listening.wait(), 10)
        lane_id = await new_lane(writer)
        lane = LaneRef(DEFAULT_NAMESPACE, lane_id)
        head = 1
        reads_per_phase = []
        for n in (1, 10):
            watchers = await attach(watched, lane_id, n, head)
            try:
                # The watching process announced the lane: the writer rings it.
                await until(lambda: writer_server.hub.watched_elsewhere(lane))
                reads = watched_server.store.event_log_reads
                for _ in range(COMMITS):
                    head = await enqueue(writer, lane_id)
                    for watcher in watchers:
                        await watcher.reach(head)
                reads_per_phase.append(watched_server.store.event_log_reads - reads)
                captured = await snapshot_of(writer, lane_id)
                for watcher in watchers:
                    assert watcher.snapshot == captured
            finally:
                await close_all(watchers)
        # One read per commit for the lane, whatever the number of its watchers (at most one
        # more: the read the hub makes shortly after it first announces a lane).
        for reads in reads_per_phase:
            assert COMMITS <= reads <= COMMITS + 1, reads_per_phase
        assert writer_server.store.event_log_reads == 0  # nobody watches there


async def test_a_watcher_resumed_far_behind_catches_up_then_shares(
    session_database_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A feed of 4 groups, and reads of 3 events: a resume 20 commits back must read the log in
    # several batches before it reaches the feed.
    monkeypatch.setattr(feed, "FEED_MAX_GROUPS", 4)
    watch = WatchSettings(read_batch=3)
    async with extra_server(session_database_url, poll_interval=60.0, watch=watch) as (
        running,
        stub,
    ):
        lane_id = await new_lane(stub)
        live = Watcher(stub, lane_id)
        watchers = [live]
        try:
            await live.reach(1)
            head = await enqueue(stub, lane_id, 20)
            await live.reach(head)
            # Resumed within the feed: served from it, no read.
            reads = running.store.event_log_reads
            near = Watcher(stub, lane_id, after=head - 2)
            watchers.append(near)
            await near.reach(head)
            assert running.store.event_log_reads == reads
            # Resumed far behind the feed: reads the log itself, in batches, up to the feed's
            # start (the last 4 groups) ... (the hub's own reads for the feed, which a refresh
            # may make meanwhile, are not the watcher's)
            shared = running.hub.shared_reads
            far = Watcher(stub, lane_id, after=2)
            watchers.append(far)
            await far.reach(head)
            own_reads = running.store.event_log_reads - reads - (running.hub.shared_reads - shared)
            assert own_reads == (head - 4 - 2) // watch.read_batch
            assert [g[0].revision for g in far.groups] == list(range(3, head + 1))
            # ... and then shares the feed: the next commits cost no read of a watcher's own
            # (the hub's listener may still refresh the feed meanwhile: a shared read).
            reads, shared = running.store.event_log_reads, running.hub.shared_reads
            head = await enqueue(stub, lane_id, COMMITS)
            for watcher in watchers:
                await watcher.reach(head)
            assert running.store.event_log_reads - reads == running.hub.shared_reads - shared
            assert [g[0].revision for g in far.groups] == list(range(3, head + 1))
            captured = await snapshot_of(stub, lane_id)
            for watcher in watchers:
                assert watcher.revision == head
            assert live.snapshot == captured
        finally:
            await close_all(watchers)


async def test_fold_equals_capture_with_shared_groups_across_two_processes(
    session_database_url,
) -> None:
    async with (
        extra_server(session_database_url, poll_interval=0.2) as (first_server, first),
        extra_server(session_database_url, notify=False, poll_interval=0.2) as (
            _,
            second,
        ),
    ):
        await asyncio.wait_for(first_server.hub.listening.wait(), 10)
        lane_ids = [await new_lane(first), await new_lane(second)]
        watchers = [Watcher(stub, lane_id) for stub in (first, second) for lane_id in lane_ids * 3]
        try:
            for watcher in watchers:
                await watcher.reach(1)
            # Commits through both processes, concurrently, on both lanes.
            for _ in range(4):
                await asyncio.gather(
                    *(enqueue(stub, lane_id, 3) for stub in (first, second) for lane_id in lane_ids)
                )
            heads = {lane_id: (await snapshot_of(first, lane_id)).revision for lane_id in lane_ids}
            for watcher, lane_id in zip(watchers, lane_ids * 6, strict=True):
                await watcher.reach(heads[lane_id])
            captures = {lane_id: await snapshot_of(second, lane_id) for lane_id in lane_ids}
            for watcher, lane_id in zip(watchers, lane_ids * 6, strict=True):
                assert watcher.snapshot == captures[lane_id]
            # Every watcher saw every revision once, in order (Watcher checks each group).
            for watcher in watchers:
                revisions = [e.revision for group in watcher.groups for e in group]
                assert revisions == list(range(2, watcher.revision + 1))
        finally:
            await close_all(watchers)
