"""Follow a lane live: one snapshot, then every commit folded into it, resumed transparently.

:func:`watch_lane` wraps the WatchLane stream (docs/contract.md, WatchLane) in an async iterator of
:class:`LaneView`::

    async for view in watch_lane(stub, "lane-1"):
        render(view.snapshot)          # always complete and current as of its revision

It yields one view for the initial snapshot (the ``SnapshotHead`` plus its ``following_chunks``
transcript chunks, assembled), then one view per event group (one commit), folded with
:mod:`lane.client.reducer`, and optionally one per heartbeat.

Recovery, without the caller noticing:

* **Resume** from the last folded revision (``WatchLaneRequest.after_revision``) after a
  backoff, when the stream fails with UNAVAILABLE (a server shutting down says
  ``SERVER_SHUTTING_DOWN``); when the connection drops: the stream ends when it was not asked
  to (the server never ends a watch on its own except with an error), fails with CANCELLED,
  UNKNOWN, INTERNAL or ABORTED without a lane.v1 ErrorInfo (the transport's, not the
  service's), or sends nothing for ``idle_timeout`` (the server heartbeats at least every
  10 s); or when it is cut off with RESOURCE_EXHAUSTED ``WATCHER_TOO_SLOW`` (the client read
  too slowly) or refused with RESOURCE_EXHAUSTED ``DATABASE_BUSY`` (every database connection
  of the server was busy). The resume point is always the client's own last folded revision,
  never the server's ``lastRevision``: a write the server gave up on may still have been
  delivered.
* **Re-snapshot** (a new watch without ``after_revision``, at once) on OUT_OF_RANGE
  ``REVISION_OUT_OF_RANGE`` (the revision fell below the retention floor, on resume or while
  the watcher lagged behind retention), on FAILED_PRECONDITION ``LANE_INCARNATION_CHANGED``
  (the lane was deleted and created again under its id while the watch was away: a resume
  names the incarnation its revision belongs to, ``LaneSnapshot.incarnation``, and the
  service refuses it for another), and when a folded group holds ``navigation_end`` (the
  lane's history moved: the reducer's rebase signal). The fresh snapshot is yielded with
  ``resnapshotted=True``; the best-effort fold of a rebase group is never yielded.

Every group must continue exactly from the last folded revision; a gap, a duplicate or a
misplaced message raises :class:`~lane.client.errors.WatchProtocolError` instead of being
folded. Any other failure (NOT_FOUND, INVALID_ARGUMENT, UNAUTHENTICATED, the service's own
INTERNAL, ...) ends the iteration with :class:`~lane.client.errors.LaneError`; so does a
resumable failure once the :class:`~lane.client.retry.RetryPolicy` gives up (``max_attempts``
consecutive attempts, or ``timeout`` seconds, without progress).

The decisions are pure functions, testable without a server: :func:`fold_group` (continuity
check, fold, rebase decision), :func:`check_heartbeat`, :func:`recovery_for` (what to do about
a failure) and :meth:`~lane.client.retry.RetryPolicy.delay` (backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import grpc
from lane.client.connect import CONNECT_TIMEOUT_SECONDS
from lane.client.errors import LaneError, WatchProtocolError, lane_error
from lane.client.errors import reason_name as _reason
from lane.client.message_parts import PartJoiner, PartsError
from lane.client.reach import FirstContact
from lane.client.reducer import fold
from lane.client.retry import RetryPolicy
from lane.v1 import events_pb2, lane_service_pb2, reasons_pb2, snapshot_pb2

if TYPE_CHECKING:
    from lane.v1.lane_service_pb2_grpc import LaneServiceAsyncStub

__all__ = [
    "GroupStep",
    "LaneView",
    "Recovery",
    "RetryPolicy",
    "WatchProtocolError",
    "check_heartbeat",
    "check_incarnation",
    "fold_group",
    "recovery_for",
    "watch_lane",
]

_log = logging.getLogger(__name__)

LaneSnapshot = snapshot_pb2.LaneSnapshot
HarnessEvent = events_pb2.HarnessEvent

#: RESOURCE_EXHAUSTED reasons the watch resumes after (TOO_MANY_WATCHERS: a full server, as
#: in a reconnect storm, says how long to wait in its RetryInfo; the watch waits at least that).
_RESUMED = frozenset(
    _reason(reason)
    for reason in (
        reasons_pb2.REASON_WATCHER_TOO_SLOW,
        reasons_pb2.REASON_DATABASE_BUSY,
        reasons_pb2.REASON_TOO_MANY_WATCHERS,
    )
)


@dataclass(frozen=True, slots=True)
class LaneView:
    """What a watcher sees after each step.

    ``snapshot``
        The lane as a capture at ``snapshot.revision`` would show it. Read-only: the watch
        never changes a snapshot it has yielded, but folds the next commit from it (into a
        copy), so copy it before changing it.
    ``events``
        The events this view folded (one commit), in revision order; empty for the initial
        snapshot and heartbeats. A re-snapshot after a rebase carries the events of the group
        that asked for it (the fresh snapshot already reflects them).
    ``resnapshotted``
        True when ``snapshot`` is a fresh capture replacing the history the caller followed
        (after OUT_OF_RANGE or a rebase): events between the previous view and this one may
        not have been delivered.
    ``heartbeat``
        True for a heartbeat (only with ``include_heartbeats``): the lane is idle at
        ``snapshot.revision``.
    """

    snapshot: snapshot_pb2.LaneSnapshot
    events: tuple[events_pb2.HarnessEvent, ...] = ()
    resnapshotted: bool = False
    heartbeat: bool = False


#: The default: from 0.1-0.2 s, doubling, up to 5-10 s between attempts, for ever. Attempt
#: ``n`` counts consecutive attempts that received nothing.
DEFAULT_RETRY = RetryPolicy(initial_backoff=0.2, max_backoff=10.0)


class Recovery(enum.Enum):
    """What the watch does about a failed or ended stream."""

    #: Reconnect after a backoff and continue after the last folded revision.
    RESUME = "resume"
    #: Start over at once with a fresh snapshot.
    RESNAPSHOT = "resnapshot"
    #: Give up: the error reaches the caller.
    RAISE = "raise"


#: Codes that, without a lane.v1 ErrorInfo, come from the transport (a dropped connection, a
#: proxy resetting the stream), not from the service: resume. With an ErrorInfo they are the
#: service's answer and end the watch.
_TRANSPORT_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
    }
)


def recovery_for(error: LaneError) -> Recovery:
    """How to recover from ``error``, which ended a WatchLane stream."""
    code = error.code
    if code == grpc.StatusCode.UNAVAILABLE:
        return Recovery.RESUME
    if code in _TRANSPORT_CODES and not error.reason:
        # CANCELLED reaches the watch only when it did not cancel: the connection went away.
        return Recovery.RESUME
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason in _RESUMED:
        return Recovery.RESUME
    if error.reason_code in (
        # On resume, or mid-stream when retention removed events the watcher had not read.
        reasons_pb2.REASON_REVISION_OUT_OF_RANGE,
        # On resume: the lane was deleted and created again; its revisions start over.
        reasons_pb2.REASON_LANE_INCARNATION_CHANGED,
    ):
        return Recovery.RESNAPSHOT
    return Recovery.RAISE


@dataclass(frozen=True, slots=True)
class GroupStep:
    """One event group folded: the new snapshot and revision, and the rebase decision."""

    snapshot: snapshot_pb2.LaneSnapshot
    revision: int
    #: The group held ``navigation_end``: ``snapshot`` is only a best effort; re-snapshot.
    rebase: bool


def fold_group(
    snapshot: snapshot_pb2.LaneSnapshot,
    revision: int,
    events: Sequence[events_pb2.HarnessEvent],
) -> GroupStep:
    """Fold one event group into ``snapshot`` (last folded revision ``revision``).

    Raises :class:`WatchProtocolError`, folding nothing, unless the group is non-empty, its
    revisions are exactly ``revision + 1, revision + 2, ...`` and every event belongs to the
    snapshot's lane (or to none). Pure: the inputs are left unchanged.
    """
    if not events:
        raise WatchProtocolError(f"lane {snapshot.lane_id}: empty event group after {revision}")
    expected = revision
    for event in events:
        expected += 1
        if event.revision != expected:
            problem = "duplicate" if event.revision < expected else "gap"
            raise WatchProtocolError(
                f"lane {snapshot.lane_id}: revision {problem}: expected event revision "
                f"{expected} after {revision}, got {event.revision} "
                f"(group revisions {[e.revision for e in events]})"
            )
        if event.lane_id and event.lane_id != snapshot.lane_id:
            raise WatchProtocolError(
                f"lane {snapshot.lane_id}: event {event.revision} belongs to lane {event.lane_id}"
            )
    reduction = fold(snapshot, events)
    return GroupStep(snapshot=reduction.snapshot, revision=expected, rebase=reduction.rebase)


def check_heartbeat(lane_id: str, revision: int, head_revision: int) -> None:
    """Raise :class:`WatchProtocolError` when a heartbeat at ``head_revision`` says events the
    watcher (at ``revision``) never received will not follow."""
    if head_revision > revision:
        raise WatchProtocolError(
            f"lane {lane_id}: heartbeat at head {head_revision} but events after {revision} "
            "were never delivered"
        )


def check_incarnation(lane_id: str, known: str, heartbeat: str) -> str:
    """The incarnation the watch follows after a heartbeat naming ``heartbeat`` ("" from a
    service that names none), when it followed ``known`` ("" if unknown); raise
    :class:`WatchProtocolError` when they differ: the stream is of another lane than the
    watcher's snapshot."""
    if known and heartbeat and heartbeat != known:
        raise WatchProtocolError(
            f"lane {lane_id}: heartbeat of incarnation {heartbeat}, the watch follows {known}"
        )
    return known or heartbeat


class _IdleTimeout(Exception):
    """The stream sent nothing for the idle timeout."""


@dataclass
class _Position:
    """Where the watch stands between streams."""

    snapshot: snapshot_pb2.LaneSnapshot | None
    #: The last folded revision (resume point); meaningful once ``snapshot`` is set.
    revision: int
    #: The next stream must start with a fresh snapshot.
    need_snapshot: bool
    #: The caller already has a snapshot (yielded, or given): the next snapshot replaces it.
    shown: bool
    #: Events of a rebase group, handed out with the re-snapshot.
    rebase_events: tuple[events_pb2.HarnessEvent, ...] = ()
    #: The lane incarnation ``revision`` belongs to ("" while unknown: not sent on resume).
    incarnation: str = ""
    #: The last stream stopped because a group asked for a rebase.
    rebase_requested: bool = False


async def watch_lane(
    stub: LaneServiceAsyncStub,
    lane_id: str,
    *,
    after_revision: int | None = None,
    snapshot: snapshot_pb2.LaneSnapshot | None = None,
    include_heartbeats: bool = False,
    idle_timeout: float | None = 30.0,
    retry: RetryPolicy = DEFAULT_RETRY,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    on_retry: Callable[[int, LaneError], object] | None = None,
    connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS,
    target: str = "",
) -> AsyncGenerator[LaneView, None]:
    """Watch ``lane_id`` for ever, yielding a :class:`LaneView` per snapshot and commit.

    Without ``snapshot`` the first view is a fresh snapshot. With ``snapshot`` (a capture the
    caller already holds, e.g. from an earlier watch) the watch resumes after its revision and
    yields only commits, unless that revision fell out of retention: then the first view is a
    re-snapshot (``resnapshotted=True``). ``after_revision``, if given, must equal
    ``snapshot.revision``: folding needs the snapshot the revision belongs to.

    ``include_heartbeats`` also yields a view (``heartbeat=True``, unchanged snapshot) for each
    idle heartbeat. A stream that sends nothing for ``idle_timeout`` seconds (default 30: three
    heartbeat intervals; None: wait for ever) counts as a dropped connection: a half-open TCP
    connection never fails on its own. ``retry`` paces resume attempts; ``sleep`` waits out a
    backoff (inject a fake one in tests). ``on_retry(attempt, error)``, if given, is called as
    soon as a stream fails and the watch is about to resume or re-snapshot: ``attempt`` counts
    the consecutive attempts without progress (1, 2, ...), ``error`` is what ended the last
    one; a live view shows it. Stop watching by leaving the ``async for`` (or ``aclose()``):
    the stream is cancelled.

    Failing fast: until the first message arrives, a transport failure (no connection) is
    tried again only for ``connect_timeout`` seconds (5 by default; None: as any other), then
    raises :class:`~lane.client.reach.Unreachable` with the cause and the fix (``target``
    names the service in it). Once the service answered, outages are ridden out as above.

    Raises :class:`LaneError` for failures the watch does not recover from and
    :class:`WatchProtocolError` when the stream breaks its contract.
    """
    if after_revision is not None:
        if snapshot is None:
            raise ValueError("after_revision needs the snapshot at that revision to fold into")
        if after_revision != snapshot.revision:
            raise ValueError(
                f"after_revision {after_revision} is not the snapshot's revision "
                f"{snapshot.revision}"
            )
    if snapshot is not None and snapshot.lane_id != lane_id:
        raise ValueError(f"the snapshot is of lane {snapshot.lane_id!r}, not {lane_id!r}")
    base = None
    if snapshot is not None:
        base = LaneSnapshot()
        base.CopyFrom(snapshot)
    position = _Position(
        snapshot=base,
        revision=base.revision if base is not None else 0,
        need_snapshot=base is None,
        shown=base is not None,
        incarnation=base.incarnation if base is not None else "",
    )
    attempt = 0
    deadline: float | None = None
    first_contact = FirstContact(target, connect_timeout)
    while True:
        request = lane_service_pb2.WatchLaneRequest(lane_id=lane_id)
        if not position.need_snapshot:
            request.after_revision = position.revision
            request.incarnation = position.incarnation
        call = stub.WatchLane(request)
        error: LaneError | None = None
        try:
            async with contextlib.aclosing(
                _follow(call, lane_id, position, include_heartbeats, idle_timeout)
            ) as steps:
                async for view in steps:
                    attempt, deadline = 0, None  # progress
                    first_contact.made()
                    if view is not None:
                        yield view
        except grpc.aio.AioRpcError as err:
            error = lane_error(err)
        except _IdleTimeout:
            error = LaneError(
                grpc.StatusCode.UNAVAILABLE,
                "WATCH_IDLE",
                f"the WatchLane stream of lane {lane_id} sent nothing for {idle_timeout}s",
            )
        finally:
            call.cancel()

        if error is None and position.rebase_requested:
            position.rebase_requested = False
            _log.info("lane %s: rebase at revision %d: re-snapshotting", lane_id, position.revision)
            continue
        if error is None:
            error = LaneError(
                grpc.StatusCode.UNAVAILABLE,
                "STREAM_ENDED",
                f"the WatchLane stream of lane {lane_id} ended without a status",
            )
            recovery = Recovery.RESUME
        else:
            recovery = recovery_for(error)

        if recovery is Recovery.RAISE:
            raise error
        first_contact.check(error)
        attempt += 1
        if attempt == 1:
            deadline = retry.deadline()
        if retry.gives_up(attempt, deadline):
            raise error
        if on_retry is not None:
            on_retry(attempt, error)
        if recovery is Recovery.RESNAPSHOT:
            position.need_snapshot = True
            # At once the first time; a re-snapshot that made no progress backs off like a
            # resume, so a lane that keeps refusing cannot spin the client.
            delay = retry.delay(attempt - 1, random.random()) if attempt > 1 else 0.0
        else:
            delay = retry.delay(attempt, random.random())
        if error.retry_after is not None:
            delay = max(delay, error.retry_after)  # the service said how long
        _log.info(
            "lane %s: watch interrupted (%s); %s in %.2fs",
            lane_id,
            error,
            "re-snapshotting"
            if position.need_snapshot
            else f"resuming after revision {position.revision}",
            delay,
        )
        if delay > 0:
            await sleep(delay)


async def _follow(
    call: grpc.aio.UnaryStreamCall[
        lane_service_pb2.WatchLaneRequest, lane_service_pb2.WatchLaneResponse
    ],
    lane_id: str,
    position: _Position,
    include_heartbeats: bool,
    idle_timeout: float | None,
) -> AsyncGenerator[LaneView | None, None]:
    """Read one stream, updating ``position``; yield a view per step (None: progress only).

    Returns when the stream ends or when a group asks for a rebase
    (``position.rebase_requested``).
    """
    head: LaneSnapshot | None = None
    chunks_left = 0
    # A message over the service's message limit comes in parts: only whole ones are read.
    parts: PartJoiner[lane_service_pb2.WatchLaneResponse] = PartJoiner()
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                received = await call.read()
        except TimeoutError:
            raise _IdleTimeout from None
        if received is grpc.aio.EOF:
            return
        try:
            whole = parts.take(cast(lane_service_pb2.WatchLaneResponse, received))
        except PartsError as exc:
            raise WatchProtocolError(f"lane {lane_id}: {exc}") from None
        if whole is None:
            yield None  # a part: the message is not whole yet
            continue
        response = whole
        kind = response.WhichOneof("item")
        if kind == "snapshot":
            if not position.need_snapshot or head is not None:
                raise WatchProtocolError(f"lane {lane_id}: unexpected snapshot head")
            if response.snapshot.snapshot.lane_id != lane_id:
                raise WatchProtocolError(
                    f"lane {lane_id}: snapshot of lane {response.snapshot.snapshot.lane_id!r}"
                )
            if response.snapshot.following_chunks < 0:
                raise WatchProtocolError(
                    f"lane {lane_id}: following_chunks {response.snapshot.following_chunks}"
                )
            head = response.snapshot.snapshot
            chunks_left = response.snapshot.following_chunks
        elif kind == "transcript_chunk":
            if head is None or chunks_left <= 0:
                raise WatchProtocolError(f"lane {lane_id}: unexpected transcript chunk")
            head.transcript.extend(response.transcript_chunk.entries)
            chunks_left -= 1
        elif kind == "event_group":
            if position.need_snapshot or position.snapshot is None:
                raise WatchProtocolError(
                    f"lane {lane_id}: event group before the snapshot was complete"
                )
            events = tuple(response.event_group.events)
            step = fold_group(position.snapshot, position.revision, events)
            position.snapshot = step.snapshot
            position.revision = step.revision
            if step.rebase:
                position.need_snapshot = True
                position.rebase_events = events
                position.rebase_requested = True
                yield None
                return
            yield LaneView(snapshot=step.snapshot, events=events)
            continue
        elif kind == "heartbeat":
            if position.need_snapshot or position.snapshot is None:
                raise WatchProtocolError(
                    f"lane {lane_id}: heartbeat before the snapshot was complete"
                )
            check_heartbeat(lane_id, position.revision, response.heartbeat.head_revision)
            position.incarnation = check_incarnation(
                lane_id, position.incarnation, response.heartbeat.incarnation
            )
            if include_heartbeats:
                yield LaneView(snapshot=position.snapshot, heartbeat=True)
            else:
                yield None
            continue
        else:
            yield None  # a message kind this client does not know yet: skip it
            continue

        if head is not None and chunks_left == 0:
            # The snapshot is complete.
            view = LaneView(
                snapshot=head,
                events=position.rebase_events,
                resnapshotted=position.shown,
            )
            position.snapshot = head
            position.revision = head.revision
            position.incarnation = head.incarnation
            position.need_snapshot = False
            position.shown = True
            position.rebase_events = ()
            head = None
            yield view
        else:
            yield None
