"""Where a watcher stands in its lane's log, and where its next groups come from.

A watcher starts from a snapshot, or resumes after a revision (:func:`resume`: a group boundary
the log still holds, of the incarnation the client followed). From there it takes whole groups
(:func:`next_groups`): from its lane's feed in the hub when the feed can serve it — the common
case, no read — else from the log, a batch at a time, until a short read says it reached the
head and the feed serves it again. The decision and the read that follows it are made here, in
one place; the api only writes the groups it is given (``api/watch.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lane.server.hub.feed import Framer, SharedGroup
from lane.server.hub.hub import Subscription
from lane.server.hub.log_positions import check_start, out_of_range
from lane.server.store import EventGroup, IncarnationGone, LaneRef, ResumePoint, read_was_full


class LogReads(Protocol):
    """The store reads a watcher makes (the api queues them: ``api/watcher_reads.py``)."""

    async def resume_point(self, lane: LaneRef, after_revision: int) -> ResumePoint:
        """See :meth:`lane.server.store.Store.resume_point`."""

    async def lane_head(self, lane: LaneRef) -> tuple[int, int]:
        """See :meth:`lane.server.store.Store.lane_head`."""

    async def read_events(
        self, lane: LaneRef, after_revision: int, limit: int, max_bytes: int, incarnation: int
    ) -> list[EventGroup]:
        """See :meth:`lane.server.store.Store.read_events`."""


class LogGroup(SharedGroup):
    """A group one watcher read from the log for itself: sent once, so its frame is not kept
    (the watcher's batch frees each group as it is written)."""

    __slots__ = ()
    source = "log"

    def frame(self, framer: Framer) -> bytes:
        """The group as one stream message (its bodies are let go)."""
        bodies: Sequence[bytes]
        bodies, self._bodies = self._bodies, ()
        return framer(bodies)


async def resume(
    subscription: Subscription, reads: LogReads, after_revision: int, incarnation: str
) -> None:
    """Start the watcher after ``after_revision`` of the lane's ``incarnation`` ('' for the
    current one): refused FAILED_PRECONDITION ``LANE_INCARNATION_CHANGED`` when the lane was
    created again since, OUT_OF_RANGE when the log no longer (or not yet) holds the revision or
    it is inside a group. At the head, the lane's feed serves the watcher from here on."""
    lane = subscription.lane
    point = await reads.resume_point(lane, after_revision)
    check_start(lane.lane_id, after_revision, incarnation, point)
    head, current = point.head, point.incarnation
    subscription.attached(current)
    subscription.delivered(after_revision)
    if not subscription.deleted and after_revision == head:
        subscription.caught_up()


async def next_groups(
    subscription: Subscription, reads: LogReads, batch: int, max_bytes: int
) -> list[SharedGroup]:
    """The whole groups after the watcher's revision, oldest first; [] when there is nothing
    new yet (wait to be rung).

    From the lane's feed when it can serve the watcher; else read from the log: whole groups
    of the incarnation the watcher follows, within ``batch`` events and ``max_bytes`` bytes
    (at least one group). A short read reached the head: the feed serves the watcher once it
    delivered what was read. A read that finds the incarnation deleted ends the watcher
    (:attr:`Subscription.deleted`); one that finds events it had not read removed by retention
    is refused OUT_OF_RANGE ``REVISION_OUT_OF_RANGE``."""
    shared = subscription.take()
    if shared is not None:
        return shared
    lane, revision, following = subscription.lane, subscription.revision, subscription.incarnation
    assert following is not None  # set by the watcher's first read (attached)
    try:
        groups = await reads.read_events(lane, revision, batch, max_bytes, following)
    except IncarnationGone:
        subscription.gone()  # deleted: this watcher ends, with the lane's others
        return []
    if groups and groups[0].first_revision != revision + 1:
        # Retention removed events this watcher had not read yet.
        head, floor = await reads.lane_head(lane)
        raise out_of_range(lane.lane_id, revision, floor, head)
    if not read_was_full(groups, batch, max_bytes):
        subscription.caught_up(groups[-1].last_revision if groups else revision)
    return [LogGroup(group) for group in groups]
