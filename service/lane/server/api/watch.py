"""WatchLane: one snapshot, then every event group committed after it, then heartbeats.

The watcher subscribes to the hub *before* capturing, so no commit after its snapshot can pass
unseen. It then sends the groups after its revision from its lane's feed in the hub
(``service/lane/server/hub/feed.py``): the groups of the lane's latest commits, the bytes the store
wrote, framed once for all the lane's watchers (framing.py) — no read per watcher. A watcher the
feed cannot serve (it resumed, or fell behind the feed's start) reads the log itself, a batch at a
time — whole groups within half its byte budget — until it has caught up, then takes from the
feed again: the hub decides which and reads (``service/lane/server/hub/catch_up.py``); this
module writes what it is given. It takes the next group only after its previous write went out,
so commits never wait for it, and one message in flight is all it holds. A watcher whose client
takes nothing for the write deadline is cut off with RESOURCE_EXHAUSTED naming its last delivered
revision, its slot freed at once (:func:`_let_go`). Its database reads go through
:class:`~lane.server.api.watcher_reads.WatcherReads`, a few at a time per process, so a reconnect
storm queues instead of taking the pool from commands.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.rpc import code_pb2
from lane.limits import (
    DEFAULT_MAX_WATCHERS,
    DEFAULT_MAX_WATCHERS_PER_LANE,
    DEFAULT_MAX_WATCHERS_PER_NAMESPACE,
    HEARTBEAT_SECONDS,
    MAX_MESSAGE_BYTES,
)
from lane.v1 import lane_service_pb2 as pb
from psycopg import OperationalError
from psycopg_pool import PoolTimeout

from lane.server import metrics, traces
from lane.server.api.errors import status_of
from lane.server.api.fair_shares import FairShares, Share
from lane.server.api.framing import event_group_frame
from lane.server.api.instrument import error_reason, status_code_name
from lane.server.api.message_parts import split_watch
from lane.server.api.snapshot_stream import snapshot_frames
from lane.server.api.watcher_reads import WatcherReads
from lane.server.api.write_deadline import DeadlinePassed, WriteDeadline, end_cut_off
from lane.server.domain.errors import LaneError, ResourceExhausted
from lane.server.hub import Hub, Subscription
from lane.server.hub.catch_up import next_groups, resume
from lane.server.hub.idle import Bell
from lane.server.store import LaneRef
from lane.server.store.pool import DatabaseBusy

DEFAULT_WRITE_DEADLINE_SECONDS = 30.0
DEFAULT_STREAM_BYTES = 8 << 20
#: What a watcher stream follows: a lane's subscription or a namespace's follower.
F = TypeVar("F", bound=Bell)


@dataclass(frozen=True)
class WatchSettings:
    """Published watch limits."""

    heartbeat_seconds: float = HEARTBEAT_SECONDS
    #: A write the client has not taken within this long ends the stream WATCHER_TOO_SLOW.
    write_deadline_seconds: float = DEFAULT_WRITE_DEADLINE_SECONDS
    #: Events read per catch-up batch (whole commit groups, so a batch may run over by one).
    read_batch: int = 500
    #: The byte budget of one stream: a catch-up batch holds whole groups within half of it
    #: (at least one group), the other half covers the frame in flight and gRPC's copy of it.
    stream_bytes: int = DEFAULT_STREAM_BYTES
    #: Transcript bytes per snapshot message.
    chunk_bytes: int = 1 << 20
    #: The largest message the stream sends: a larger one (an event group, a snapshot head)
    #: goes in parts (message_parts.py), each at most this long.
    message_bytes: int = MAX_MESSAGE_BYTES
    #: Concurrent WatchLane streams of one lane, and of all lanes, in this process; a stream
    #: over any of these is refused with RESOURCE_EXHAUSTED ``TOO_MANY_WATCHERS``.
    max_watchers_per_lane: int = DEFAULT_MAX_WATCHERS_PER_LANE
    max_watchers_per_process: int = DEFAULT_MAX_WATCHERS
    #: ... and of one namespace (fair_shares.py: one tenant cannot hold every slot).
    max_watchers_per_namespace: int = DEFAULT_MAX_WATCHERS_PER_NAMESPACE
    #: Database reads watchers make at once in this process (snapshots, resumes, catch-up):
    #: a reconnect storm of thousands queues here, leaving the rest of the pool to commands.
    max_concurrent_reads: int = 4
    #: The retry delay a TOO_MANY_WATCHERS refusal asks for (google.rpc.RetryInfo).
    full_retry_seconds: float = 2.0
    #: How long a WatchLanes stream, woken by a change, gathers more before it writes: the
    #: changes of commits that land together go out as one message.
    lanes_coalesce_seconds: float = 0.02

    @property
    def read_bytes(self) -> int:
        """Bytes of events one catch-up batch reads at most (beyond its first group)."""
        return self.stream_bytes // 2


def admit(hub: Hub, shares: FairShares, lane: LaneRef, settings: WatchSettings) -> Share:
    """A watcher slot of ``lane``'s namespace, or the refusal (RESOURCE_EXHAUSTED
    ``TOO_MANY_WATCHERS``) over a limit: of the lane, of its namespace, of the process. Called
    right before the watcher subscribes, with no await between; the slot is held while the
    subscription is."""
    count = hub.watcher_count(lane)
    if count >= settings.max_watchers_per_lane:
        refusal = ResourceExhausted(
            "TOO_MANY_WATCHERS",
            f"lane {lane.lane_id} has {count} watchers on this server, its limit; retry later",
            laneId=lane.lane_id,
            scope="lane",
            watchers=count,
            limit=settings.max_watchers_per_lane,
        )
        refusal.retry_after_seconds = settings.full_retry_seconds
        raise refusal
    return shares.acquire(lane.namespace, laneId=lane.lane_id)


class WatcherGone(Exception):
    """The client cancelled or the connection dropped: stop quietly."""


class WatcherTooSlow(Exception):
    """The client did not take a write within the deadline; it had ``revision``."""

    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


async def write_within(
    context: grpc.aio.ServicerContext[Any, Any],
    message: pb.WatchLaneResponse | bytes | None,
    deadline: WriteDeadline,
    revision: int,
    task: asyncio.Task[Any] | None = None,
) -> None:
    """Write ``message`` (None: the stream's headers alone, see :func:`send_headers`) under
    the write deadline: WatcherTooSlow when cut off, WatcherGone when the peer is gone.
    ``task``: the stream's task, if the caller keeps it (``WriteDeadline.write``)."""
    try:
        await deadline.write(context, message, task)
    except DeadlinePassed:
        # HTTP/2 flow control: the client's window and the sockets are full, it is not reading.
        raise WatcherTooSlow(revision) from None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        # grpcio raises an internal error type when the peer is already gone.
        raise WatcherGone from exc


async def write_frames(
    context: grpc.aio.ServicerContext[Any, Any],
    message: bytes,
    deadline: WriteDeadline,
    revision: int,
    limit: int,
    task: asyncio.Task[Any] | None = None,
) -> None:
    """Write the encoded WatchLaneResponse ``message`` as :func:`write_within` does; one over
    ``limit`` bytes goes in parts, each written under the deadline."""
    if len(message) <= limit:
        await write_within(context, message, deadline, revision, task)
        return
    for part in split_watch(message, limit):
        await write_within(context, part, deadline, revision, task)


async def send_headers(
    context: grpc.aio.ServicerContext[Any, Any], deadline: WriteDeadline, revision: int
) -> None:
    """Send the stream's headers on their own, right before its first message.

    Otherwise gRPC sends them with the first message, and until that write completes grpc.aio
    counts them unsent: a stream cut while its first message is held back by flow control
    would then be ended with the headers sent again beside the status, which gRPC core
    refuses (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and the client would never get its
    ``WATCHER_TOO_SLOW``. Refusals before the first message stay trailers-only."""
    await write_within(context, None, deadline, revision)


async def _let_go(
    context: grpc.aio.ServicerContext[Any, Any], settings: WatchSettings, revision: int
) -> None:
    """End a stream whose client stopped reading (its slot is free already)."""
    await let_go(
        context,
        settings,
        "resume after the last revision received (the stream had delivered at least revision "
        f"{revision})",
        {"lastRevision": str(revision)},
    )


async def let_go(
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    advice: str,
    metadata: dict[str, str],
) -> None:
    """End a watcher stream whose client stopped reading, RESOURCE_EXHAUSTED
    ``WATCHER_TOO_SLOW`` with ``advice`` (what to do now) and ``metadata``."""
    status = status_of(
        code_pb2.RESOURCE_EXHAUSTED,
        "WATCHER_TOO_SLOW",
        f"the watcher did not read for {settings.write_deadline_seconds:g}s; {advice}",
        metadata,
    )
    await end_cut_off(context, status)


async def end_stream(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> None:
    """End the stream with ``status`` (raises grpc's AbortError, as an abort does)."""
    try:
        await context.abort_with_status(status)
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        # The status cannot be sent: the peer is gone or a write is still stuck.
        raise WatcherGone from exc


async def watch_lane(
    store: WatcherReads,
    hub: Hub,
    shares: FairShares,
    lane: LaneRef,
    request: pb.WatchLaneRequest,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    deadline: WriteDeadline,
) -> None:
    """Serve one WatchLane stream of ``lane`` until the client leaves or the server stops."""
    await serve_watcher(
        context,
        lambda: admit(hub, shares, lane, settings),
        lambda: hub.subscribe(lane),
        lambda subscription: _serve(store, subscription, request, context, settings, deadline),
        lambda slow: _let_go(context, settings, slow.revision),
    )


async def serve_watcher(
    context: grpc.aio.ServicerContext[Any, Any],
    admission: Callable[[], AbstractContextManager[object]],
    follow: Callable[[], AbstractContextManager[F]],
    serve: Callable[[F], Awaitable[None]],
    let_go_slow: Callable[[WatcherTooSlow], Awaitable[None]],
) -> None:
    """A watcher stream's start and end, shared by WatchLane and WatchLanes: take the slot
    (``admission``), start following (``follow``) and ``serve`` until the stream ends; count it
    in the watcher metrics by how it ended. A client that stopped reading is let go once out
    of the slot (``let_go_slow``); one that left needs nothing; anything else propagates."""
    metrics.current.watchers_active.inc()
    ended = "error"
    following: F | None = None
    try:
        with admission(), follow() as following:
            await serve(following)
    except BaseException as exc:
        ended = ended_reason(exc, context, following is not None and following.closed)
        if isinstance(exc, WatcherTooSlow):
            # Out of the slot: it is free now, whenever the client reads again.
            await let_go_slow(exc)
            return
        if isinstance(exc, WatcherGone):
            return
        raise
    finally:
        metrics.current.watchers_active.dec()
        metrics.current.watchers_ended.labels(ended).inc()


def ended_reason(
    exc: BaseException, context: grpc.aio.ServicerContext[Any, Any], shutting_down: bool
) -> str:
    """The ``lane_watchers_ended_total`` reason of a watcher stream that ended with ``exc``
    (``shutting_down``: the server asked it to end)."""
    if isinstance(exc, WatcherGone):
        return "client_left"
    if isinstance(exc, WatcherTooSlow):
        return "too_slow"
    if isinstance(exc, asyncio.CancelledError):
        # The client cancelled, or shutdown's grace period ran out during a write.
        return "shutdown" if shutting_down else "client_left"
    if isinstance(exc, grpc.aio.AbortError):
        # Ended with a status (see end_stream).
        reasons = {
            "WATCHER_TOO_SLOW": "too_slow",
            "SERVER_SHUTTING_DOWN": "shutdown",
            "LANE_DELETED": "lane_deleted",
        }
        return reasons.get(error_reason(context)) or status_code_name(context).lower()
    if isinstance(exc, LaneError):
        return exc.code.name.lower()  # out_of_range, not_found, ...
    if isinstance(exc, (OperationalError, PoolTimeout, DatabaseBusy)):
        return "database"  # an outage or a full pool, not a fault of the service
    return "error"


async def _serve(
    store: WatcherReads,
    subscription: Subscription,
    request: pb.WatchLaneRequest,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    deadline: WriteDeadline,
) -> None:
    lane_id = subscription.lane.lane_id
    if request.HasField("after_revision"):
        revision = request.after_revision
        await resume(subscription, store, revision, request.incarnation)
        if not subscription.deleted:
            await send_headers(context, deadline, revision)
    else:
        with traces.span("lane.watch.snapshot"):
            revision = await _send_snapshot(store, subscription, context, settings, deadline)
            traces.annotate("lane.revision", revision)
        subscription.delivered(revision)
        if not subscription.deleted:
            subscription.caught_up()
    following = subscription.incarnation
    assert following is not None  # set by the first read (attached)
    task = asyncio.current_task()
    limit = settings.message_bytes
    while not subscription.closed and not subscription.deleted:
        groups = await next_groups(subscription, store, settings.read_batch, settings.read_bytes)
        if groups:
            # The common path, once per watcher and commit: kept lean (no span while traces
            # are off, the task known, no timer per wait: hub/idle.py).
            for group in groups:
                frame = group.frame(event_group_frame)
                if traces.tracer is None:
                    await write_frames(context, frame, deadline, revision, limit, task)
                else:
                    with traces.delivery(group.first, group.last, group.source):
                        await write_frames(context, frame, deadline, revision, limit, task)
                metrics.current.delivery_seconds.observe(max(0.0, time.time() - group.committed_at))
                revision = group.last
                subscription.delivered(revision)
            continue
        # Nothing new. Wait until rung: a commit here, a shared read after a doorbell or the
        # poll, or shutdown (a ring while this watcher wrote ends the wait at once). A
        # heartbeat needs no read: nothing rang, nothing is new.
        while not await subscription.wait(settings.heartbeat_seconds) and not (
            subscription.closed or subscription.deleted
        ):
            heartbeat = pb.WatchLaneResponse(
                heartbeat=pb.Heartbeat(head_revision=revision, incarnation=str(following))
            )
            await write_within(context, heartbeat, deadline, revision)
    if subscription.deleted and not subscription.closed:
        await end_stream(
            context,
            status_of(
                code_pb2.NOT_FOUND,
                "LANE_DELETED",
                f"lane {lane_id} was deleted (after revision {revision})",
                {"laneId": lane_id, "lastRevision": str(revision)},
            ),
        )
    await end_stream(
        context,
        shutting_down(f"resume after revision {revision}", {"lastRevision": str(revision)}),
    )


async def _send_snapshot(
    store: WatcherReads,
    subscription: Subscription,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
    deadline: WriteDeadline,
) -> int:
    """Send the lane's snapshot (head, then transcript chunks); return its revision. Its own
    function so that nothing of the snapshot outlives it: an idle watcher keeps no transcript.
    Nothing is sent when the hub already knows the incarnation read was deleted."""
    lane = subscription.lane
    outline = await store.snapshot_outline(lane)
    revision = outline.snapshot.revision
    subscription.attached(int(outline.snapshot.incarnation))
    if subscription.deleted:
        return revision
    await send_headers(context, deadline, revision)
    read_entries = functools.partial(store.entry_bodies, lane)
    async for frame in snapshot_frames(outline, read_entries, settings.chunk_bytes):
        await write_frames(context, frame, deadline, revision, settings.message_bytes)
    return revision


def shutting_down(advice: str, metadata: dict[str, str]) -> grpc.Status:
    """The status ending a stream at shutdown: UNAVAILABLE ``SERVER_SHUTTING_DOWN``."""
    return status_of(
        code_pb2.UNAVAILABLE,
        "SERVER_SHUTTING_DOWN",
        f"the server is shutting down; {advice}",
        metadata,
    )
