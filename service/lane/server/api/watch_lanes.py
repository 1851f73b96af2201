"""WatchLanes: the summaries of many lanes, then their changes, on one stream.

The stream follows its namespace's board in the hub (``hub/lane_changes.py``) *before* it lists,
so no change after the listing passes unseen. It lists the matching lanes in id order, a page
per message (the reads queue with the watchers', ``watcher_reads.py``), the last one marked
``listing_complete``. Then, each time it is woken, it takes its pending changes — at most one
per lane, the latest, however long it was away — and writes them as one message (several when
they run past ``WatchSettings.chunk_bytes``), each summary framed once per process for all
streams. It remembers which incarnation and revision of each lane it sent, so a change the
client already has is skipped, a lane that leaves the requested statuses is sent as removed,
and a deletion is sent only for a lane it sent. A short pause after each wake-up gathers the
commits that land together into one write.

The stream rules are WatchLane's: authenticated first, one watcher slot of the namespace
(``TOO_MANY_WATCHERS``), a heartbeat when idle, the write deadline (``WATCHER_TOO_SLOW``, with
no resume point: the client calls again), ``SERVER_SHUTTING_DOWN`` at shutdown.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.fair_shares import FairShares
from lane.server.api.framing import length_delimited
from lane.server.api.watch import (
    WatchSettings,
    end_stream,
    let_go,
    send_headers,
    serve_watcher,
    shutting_down,
    write_within,
)
from lane.server.api.watcher_reads import WatcherReads
from lane.server.api.write_deadline import WriteDeadline
from lane.server.hub.lane_changes import Follower, LaneChange, LaneChanges
from lane.server.store import LaneFilter

#: Summaries per listing message (each is at most a few hundred bytes).
LISTING_PAGE = 500

_FIELDS = pb.WatchLanesResponse.DESCRIPTOR.fields_by_name
_LANES = _FIELDS["lanes"].number
_REMOVED = _FIELDS["removed"].number
_HEARTBEAT = pb.WatchLanesResponse(heartbeat=True).SerializeToString()
_LISTED = pb.WatchLanesResponse(listing_complete=True).SerializeToString()


def summary_entry(line: pb.LaneSummary) -> bytes:
    """``line`` as one ``lanes`` entry of an encoded WatchLanesResponse."""
    return length_delimited(_LANES, line.SerializeToString())


def _removal_entry(lane_id: str, incarnation: int, *, deleted: bool) -> bytes:
    removal = pb.LaneRemoval(lane_id=lane_id, incarnation=str(incarnation), deleted=deleted)
    return length_delimited(_REMOVED, removal.SerializeToString())


async def watch_lanes(
    reads: WatcherReads,
    changes: LaneChanges,
    shares: FairShares,
    namespace: str,
    lanes: LaneFilter,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    deadline: WriteDeadline,
) -> None:
    """Serve one WatchLanes stream of ``namespace``'s lanes that ``lanes`` admits."""
    await serve_watcher(
        context,
        lambda: shares.acquire(namespace),
        lambda: changes.follow(namespace, lanes),
        lambda follower: _serve(reads, follower, namespace, context, settings, deadline),
        lambda _: let_go(context, settings, "call WatchLanes again (a new listing)", {}),
    )


async def _serve(
    reads: WatcherReads,
    follower: Follower,
    namespace: str,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    deadline: WriteDeadline,
) -> None:
    lanes = follower.lanes
    #: What the client holds of each lane it was sent: (incarnation, revision).
    sent: dict[str, tuple[int, int]] = {}
    await send_headers(context, deadline, 0)
    after = ""
    while True:
        rows = await reads.lane_summaries(namespace, lanes, LISTING_PAGE + 1, after)
        more = len(rows) > LISTING_PAGE
        del rows[LISTING_PAGE:]
        lines = [row.line() for row in rows]
        follower.seen(lines)
        entries = []
        for line in lines:
            sent[line.lane_id] = (int(line.incarnation), line.revision)
            entries.append(summary_entry(line))
        if not more:
            await write_within(context, b"".join(entries) + _LISTED, deadline, 0)
            break
        await write_within(context, b"".join(entries), deadline, 0)
        after = rows[-1].lane_id
    while not follower.closed:
        pending = follower.take()
        if pending:
            await _send_changes(pending, sent, lanes, context, settings, deadline)
            continue
        if not await follower.wait(settings.heartbeat_seconds):
            if not follower.closed:
                await write_within(context, _HEARTBEAT, deadline, 0)
        elif settings.lanes_coalesce_seconds > 0:
            # Commits land together: one message for all of them rather than one each.
            await asyncio.sleep(settings.lanes_coalesce_seconds)
    await end_stream(context, shutting_down("call WatchLanes again on another server", {}))


async def _send_changes(
    pending: list[LaneChange],
    sent: dict[str, tuple[int, int]],
    lanes: LaneFilter,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    deadline: WriteDeadline,
) -> None:
    """Write what of ``pending`` the client does not have, in messages of at most
    ``settings.chunk_bytes`` (one, nearly always)."""
    entries: list[bytes] = []
    size = 0
    for change in pending:
        lane_id = change.lane_id
        held = sent.get(lane_id)
        if change.deleted or change.summary is None:
            if held is None or held[0] > change.incarnation:
                continue  # never sent, or a later incarnation was
            del sent[lane_id]
            entry = _removal_entry(lane_id, held[0], deleted=True)
        elif held is not None and held >= (change.incarnation, change.revision):
            continue  # the client has this or later already (its listing)
        elif lanes.admits_status(change.summary.status):
            sent[lane_id] = (change.incarnation, change.revision)
            entry = change.entry(summary_entry)
        elif held is not None:
            del sent[lane_id]
            entry = _removal_entry(lane_id, held[0], deleted=False)
        else:
            continue  # not in a status the client asked for, and not sent before
        if entries and size + len(entry) > settings.chunk_bytes:
            await write_within(context, b"".join(entries), deadline, 0)
            entries, size = [], 0
        entries.append(entry)
        size += len(entry)
    if entries:
        await write_within(context, b"".join(entries), deadline, 0)
