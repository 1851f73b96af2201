"""The per-process hub: each watched lane's feed of recent groups, one LISTEN connection,
coalesced doorbells, a polling fallback.

Each lane with watchers here has a feed (``feed.py``): its most recent event groups, the bytes
as the store wrote them, shared by all of the lane's watchers. Three things bring groups in:

- a commit in this process hands its group over from memory (the store's commit listener):
  its watchers send it without any read;
- a NOTIFY from another process (payload: ``namespace/lane_id``) makes the hub read the lane's
  event log after its feed's end, once for all of the lane's watchers here;
- a poll every ``poll_interval`` seconds reads the head of every watched lane and does the same
  for each lane whose head moved past its feed — the fallback when NOTIFY is off, lost, or the
  listener is down.

A deleted lane's watchers are ended (:attr:`Subscription.deleted`): at once when the lane was
deleted in this process (the store's delete listener); on a deletion notice (payload
``-namespace/lane_id``, then the incarnation deleted) from the process that deleted it; and,
failing that, by the poll, which finds the lane gone or another incarnation of it.

Incarnations: a lane id may be deleted and created again; each lane row has its own
incarnation, a number that grows with each creation. A watcher reports the incarnation its
first read found (:meth:`Subscription.attached`); all the watchers of a feed follow one
incarnation, the feed's, and its groups are that incarnation's (shared reads check it). Only a
watcher whose incarnation is known to be gone is ended: a lane that is absent from a poll, or
deleted, ends none of the watchers that have not read it yet — they started before it existed,
and their own reads tell what they follow. Such watchers stay, on a feed of their own.

Correctness never depends on NOTIFY, nor on the feed: the log is the source of truth, a feed
holds only whole groups that continue each other, and a watcher the feed cannot serve reads the
log itself (``catch_up.py``).

Doorbells are sent after commit, outside the writer's transaction (NOTIFY takes a cluster-wide
lock through commit), coalesced per lane, from one task: once per group commit (the store
commits the lanes ready together in one transaction, and their listeners run in one turn of
the event loop), and once for all the commits made while a NOTIFY is out — and only for lanes
another process watches (``interest.py``): a lone process, or lanes nobody elsewhere follows,
cost no NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from lane.server import metrics
from lane.server.hub import interest
from lane.server.hub.feed import FEED_MAX_BYTES, Feed, FeedMemory, SharedGroup
from lane.server.hub.idle import Bell, IdleWakeups
from lane.server.hub.lane_changes import LaneChanges
from lane.server.log_repeats import RepeatLimiter
from lane.server.store import (
    ChannelError,
    EventGroup,
    IncarnationGone,
    LaneRef,
    Notifier,
    Store,
    read_was_full,
)
from lane.server.store.pool import DEFAULT_RECONNECT_SECONDS, reconnect_delay

log = logging.getLogger(__name__)
#: While the database is away the listener fails every second: one line, then a count.
_outage_log = RepeatLimiter(log)

CHANNEL = "lane_events"
#: The application name of every hub's LISTEN connection (to find them in pg_stat_activity).
LISTENER_NAME = "lane-hub"
#: After announcing a lane, its feed is brought up to date again this much later: a commit made
#: elsewhere before the announcement arrived got no doorbell.
ANNOUNCE_SETTLE_SECONDS = 0.2
#: Events, and bytes, one shared read of a lane's log takes at most (whole groups, so it may run
#: over by one): no more than its feed keeps.
SHARED_READ_BATCH = 500
SHARED_READ_BYTES = FEED_MAX_BYTES
#: A lost LISTEN connection is opened again after this long the first time (it may have been
#: killed alone); after that, on the pool's schedule (``LANE_DB_RECONNECT_SECONDS``).
LISTEN_RETRY_FIRST_SECONDS = 0.1
#: A failed shared read is tried again after this long, doubling up to the maximum.
SHARED_READ_RETRY_SECONDS = 0.1
SHARED_READ_RETRY_MAX_SECONDS = 1.0


class Subscription(Bell):
    """One watcher's interest in one lane: its progress, its doorbell, its end.

    The watcher reports what it delivered (:meth:`delivered`, :meth:`caught_up`), takes the
    groups after that from the lane's feed (:meth:`take`), and waits to be rung
    (:meth:`wait`). :attr:`closed` is set when the server shuts down: the watcher then ends its
    stream, so that its client resumes elsewhere.
    """

    __slots__ = ("_deleted", "_feed", "_hub", "incarnation", "lane", "revision")

    def __init__(self, hub: Hub, lane: LaneRef, feed: LaneFeed, *, closed: bool) -> None:
        super().__init__(hub.idle, closed=closed)
        self.lane = lane
        #: The revision this watcher has delivered through.
        self.revision = 0
        #: The lane's incarnation this watcher follows (None until it read the lane).
        self.incarnation: int | None = None
        self._hub = hub
        self._feed = feed
        self._deleted = False

    @property
    def deleted(self) -> bool:
        """Whether the lane was deleted (the watcher must end its stream, NOT_FOUND)."""
        return self._deleted

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hub._unsubscribe(self, self._feed)

    def lane_deleted(self) -> None:
        """Ask the watcher to end its stream: its lane is gone."""
        self._deleted = True
        self.ring()

    def gone(self) -> None:
        """The watcher's read found the incarnation it follows deleted: end it, and the lane's
        other watchers here that follow it."""
        self._hub._lane_gone(self.lane, self.incarnation)
        self.lane_deleted()

    def attached(self, incarnation: int) -> None:
        """The watcher's first read (its snapshot, or its resume point) found the lane's
        ``incarnation``: the one it follows. Ends it (:attr:`deleted`) when this process knows
        a later incarnation already."""
        self._hub._attached(self, incarnation)

    def delivered(self, revision: int) -> None:
        """The watcher has delivered every event through ``revision``."""
        self.revision = revision

    def caught_up(self, revision: int | None = None) -> None:
        """The watcher's revision, or the ``revision`` it is about to deliver, was the lane's
        head when it read it (a snapshot, a resume at the head, or a short read of the log).
        Positions the lane's feed there if it has no position yet, and brings the feed up to
        date if it lags behind the watcher."""
        self._hub._caught_up(self._feed, self.revision if revision is None else revision)

    def take(self) -> list[SharedGroup] | None:
        """The groups after this watcher's revision from the lane's feed ([] when there is
        none yet: wait), or None when the feed cannot serve it — the watcher is behind the
        feed's start (slow, or just resumed), inside a group, or the feed has no position yet:
        then it reads the log itself, and calls :meth:`caught_up` after a short read
        (``catch_up.next_groups`` decides which, for the watcher)."""
        feed = self._feed.feed
        end = feed.end
        if end is not None and self.revision > end:
            # The watcher has seen more of the log than the feed: bring the feed up to it.
            self._hub._want_read(self._feed)
            return []
        return feed.after(self.revision)


class LaneFeed:
    """A watched lane in this process: its feed, its subscriptions, its shared reader."""

    def __init__(self, lane: LaneRef, memory: FeedMemory) -> None:
        self.lane = lane
        #: The lane's incarnation the feed and its watchers follow (None until a watcher read
        #: the lane, or a commit here named it). Set before the feed has a position.
        self.incarnation: int | None = None
        self.feed = Feed(memory)
        self.subscriptions: set[Subscription] = set()
        #: A shared read is due (another process committed, or a watcher is ahead).
        self.read_wanted = False
        self.reader: asyncio.Task[None] | None = None

    def ring(self) -> None:
        for subscription in self.subscriptions:
            subscription.ring()


class Hub:
    """Feeds and wakes this process's watchers; see the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        notify: bool = True,
        poll_interval: float = 1.0,
        reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS,
    ) -> None:
        self.store = store
        self.notify = notify
        self.poll_interval = poll_interval
        #: The longest wait between attempts to open the LISTEN connection again.
        self.reconnect_seconds = reconnect_seconds
        self._lanes: dict[LaneRef, LaneFeed] = {}
        self._watchers = 0
        #: Reads of the event log the hub made for a lane's feed (of the store's
        #: ``event_log_reads``, those not made by one watcher for itself).
        self.shared_reads = 0
        #: What the feeds of all watched lanes hold together (bounded).
        self.feed_memory = FeedMemory()
        self._readers: set[asyncio.Task[None]] = set()
        self._dirty: set[LaneRef] = set()
        #: Lanes deleted here (with the incarnation deleted), still to tell the others about.
        self._deleted: dict[LaneRef, int] = {}
        self._dirty_event = asyncio.Event()
        self._notifier: Notifier | None = None
        #: The lanes other processes watch; our watched lanes still to announce.
        self._remote = interest.RemoteInterest()
        self._announce: set[LaneRef] = set()
        self._announce_all = True
        self._tasks: list[asyncio.Task[None]] = []
        self.listening = asyncio.Event()
        self._closing = False
        #: Ends the waits of watchers idle for their heartbeat interval.
        self.idle = IdleWakeups()
        #: WatchLanes: the namespaces followed here and their lanes' summaries.
        self.lane_changes = LaneChanges(
            store, self.idle, poll_interval=poll_interval, followed=self._namespace_followed
        )
        store.add_commit_listener(self.committed)
        store.add_delete_listener(self.lane_deleted)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the poller and, with NOTIFY on, the listener and the doorbell sender."""
        self._tasks.append(asyncio.create_task(self._poll_forever(), name="hub-poll"))
        self._tasks.append(
            asyncio.create_task(self.lane_changes.poll_forever(), name="hub-poll-lanes")
        )
        if self.notify:
            self._tasks.append(asyncio.create_task(self._listen_forever(), name="hub-listen"))
            self._tasks.append(asyncio.create_task(self._send_doorbells(), name="hub-notify"))

    def close_watchers(self) -> None:
        """Ask every watcher, and every later one, to end its stream now (server shutdown)."""
        self._closing = True
        for watched in self._lanes.values():
            for subscription in watched.subscriptions:
                subscription.close()
        self.lane_changes.close()

    async def stop(self) -> None:
        """Stop every task."""
        self.store.remove_commit_listener(self.committed)
        self.store.remove_delete_listener(self.lane_deleted)
        tasks = [*self._tasks, *self._readers]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._readers.clear()
        await self.lane_changes.stop()
        await self.idle.stop()

    # -- watchers --------------------------------------------------------------------------

    def subscribe(self, lane: LaneRef) -> Subscription:
        """Register a watcher of ``lane``; use the subscription as a context manager, whose
        exit unregisters it (a class, not a generator: no frame kept per watcher)."""
        watched = self._lanes.get(lane)
        if watched is None:
            watched = self._lanes[lane] = LaneFeed(lane, self.feed_memory)
            if self.notify:
                self._announce.add(lane)  # the lane's first watcher here: tell the others
                self._dirty_event.set()
        subscription = Subscription(self, lane, watched, closed=self._closing)
        watched.subscriptions.add(subscription)
        self._watchers += 1
        return subscription

    def _unsubscribe(self, subscription: Subscription, watched: LaneFeed) -> None:
        self._watchers -= 1
        watched.subscriptions.discard(subscription)
        lane = watched.lane
        if not watched.subscriptions and self._lanes.get(lane) is watched:
            del self._lanes[lane]  # its reader, if any, sees that and stops
            self.feed_memory.forget(watched.feed)

    def watcher_count(self, lane: LaneRef | None = None) -> int:
        """How many watchers this process has (on one lane, or in all)."""
        if lane is not None:
            watched = self._lanes.get(lane)
            return 0 if watched is None else len(watched.subscriptions)
        return self._watchers

    def watched_elsewhere(self, lane: LaneRef) -> bool:
        """Whether another process announced watchers of ``lane`` (its commits ring them)."""
        return self._remote.watched(lane)

    def committed(self, lane: LaneRef, incarnation: int, group: EventGroup) -> None:
        """A commit in this process (the store's commit listener): hand its group to the lane's
        feed and wake its watchers now; ring other processes soon."""
        self.lane_changes.committed(lane, incarnation, group)
        watched = self._lanes.get(lane)
        if watched is not None and watched.incarnation not in (None, incarnation):
            known = watched.incarnation
            assert known is not None
            if incarnation < known:
                watched = None  # a commit of an incarnation its watchers here left already
            else:
                # A later incarnation committed: the feed's was deleted.
                self._lane_gone(lane, known)
                watched = self._lanes.get(lane)
        if watched is not None:
            watched.incarnation = incarnation
            feed = watched.feed
            end = feed.end
            if end is None:
                # The feed's position: the watchers behind it read the log themselves.
                end = group.first_revision - 1
                feed.position(end)
                if watched.read_wanted:  # a doorbell came before the feed had a position
                    self._want_read(watched)
            if group.first_revision > end + 1:
                # Commits made elsewhere came in between: read them, and this one with them.
                self._want_read(watched)
            elif feed.add((group,)):
                watched.ring()
        if self.notify and self._remote.watched(lane):
            self._dirty.add(lane)
            self._dirty_event.set()

    def lane_deleted(self, lane: LaneRef, incarnation: int) -> None:
        """The lane's ``incarnation`` was deleted in this process (the store's delete
        listener): end its watchers here now, and tell the other processes."""
        self._lane_gone(lane, incarnation)
        self.lane_changes.deleted(lane, incarnation)
        if self.notify:
            self._deleted[lane] = incarnation
            self._dirty_event.set()

    def _attached(self, subscription: Subscription, incarnation: int) -> None:
        subscription.incarnation = incarnation
        watched = subscription._feed
        known = watched.incarnation
        if subscription.deleted or self._lanes.get(watched.lane) is not watched:
            return
        if known is None:
            watched.incarnation = incarnation
        elif incarnation < known:
            # A later incarnation exists: the one this watcher read was deleted meanwhile.
            subscription.lane_deleted()
        elif incarnation > known:
            # The feed's incarnation was deleted; this watcher moves to a feed of its own.
            self._lane_gone(watched.lane, known)

    def _lane_gone(self, lane: LaneRef, gone: int | None) -> None:
        """End the watchers of the incarnation ``gone`` of a deleted lane (None: the one its
        watchers here follow). Its feed is dropped at once, so a watcher of a lane created
        again under the id starts on a feed of its own. Watchers that have not read the lane
        yet, or follow a later incarnation, stay, on a new feed: they may follow a lane
        created after the delete."""
        watched = self._lanes.get(lane)
        if watched is None or watched.incarnation is None:
            return  # none of its watchers here has read it: none follows what was deleted
        known = watched.incarnation
        if gone is not None and gone < known:
            return  # an earlier incarnation's deletion, heard late
        del self._lanes[lane]
        self.feed_memory.forget(watched.feed)
        fresh: LaneFeed | None = None
        for subscription in list(watched.subscriptions):
            if subscription.incarnation is not None and subscription.incarnation <= known:
                subscription.lane_deleted()
                continue
            if fresh is None:
                fresh = self._lanes[lane] = LaneFeed(lane, self.feed_memory)
            watched.subscriptions.discard(subscription)
            fresh.subscriptions.add(subscription)
            subscription._feed = fresh
            if subscription.incarnation is not None:
                fresh.incarnation = subscription.incarnation

    def refresh(self, lane: LaneRef) -> None:
        """Bring ``lane``'s feed up to the log (another process committed to it)."""
        if not lane.lane_id:
            # A followed namespace was announced: catch up with what came before.
            self.lane_changes.poll_soon()
            return
        watched = self._lanes.get(lane)
        if watched is not None:
            self._want_read(watched)

    def refresh_all(self) -> None:
        """Bring every feed up to the log (after the listener reconnects: a doorbell may have
        been missed)."""
        for watched in list(self._lanes.values()):
            self._want_read(watched)
        self.lane_changes.poll_soon()

    # -- shared reads ----------------------------------------------------------------------

    def _caught_up(self, watched: LaneFeed, revision: int) -> None:
        feed = watched.feed
        if feed.end is None:
            feed.position(revision)
            if watched.read_wanted:  # a doorbell came before the feed had a position
                self._want_read(watched)
        elif revision > feed.end:
            self._want_read(watched)

    def _want_read(self, watched: LaneFeed) -> None:
        """Read the lane's log after its feed's end, once, for all its watchers."""
        watched.read_wanted = True
        if watched.feed.end is None:
            # No position to read after yet: every watcher of the lane reads the log itself.
            watched.ring()
            return
        if watched.reader is None and self._lanes.get(watched.lane) is watched:
            reader = asyncio.create_task(self._read(watched), name="hub-read")
            watched.reader = reader
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)

    async def _read(self, watched: LaneFeed) -> None:
        lane, feed = watched.lane, watched.feed
        retry = SHARED_READ_RETRY_SECONDS
        try:
            while watched.read_wanted and self._lanes.get(lane) is watched:
                watched.read_wanted = False
                # A position comes with an incarnation (committed, _caught_up after attached).
                assert feed.end is not None and watched.incarnation is not None
                try:
                    self.shared_reads += 1
                    groups = await self.store.read_events(
                        lane,
                        feed.end,
                        SHARED_READ_BATCH,
                        SHARED_READ_BYTES,
                        incarnation=watched.incarnation,
                    )
                except IncarnationGone as gone:
                    self._lane_gone(lane, gone.incarnation)
                    return
                except Exception as exc:  # the database: transient, as for every other read
                    log.warning("could not read the events of lane %s: %s", lane, exc)
                    watched.read_wanted = True
                    await asyncio.sleep(retry)
                    retry = min(retry * 2, SHARED_READ_RETRY_MAX_SECONDS)
                    continue
                retry = SHARED_READ_RETRY_SECONDS
                if feed.add(groups):
                    watched.ring()
                if read_was_full(groups, SHARED_READ_BATCH, SHARED_READ_BYTES):
                    watched.read_wanted = True  # more may be waiting
        finally:
            watched.reader = None

    # -- tasks -----------------------------------------------------------------------------

    async def _send_doorbells(self) -> None:
        # One dedicated session (the store's notifier): a pooled one would cost a checkout per
        # doorbell and compete with commands. Each flush is one small transaction of its own.
        notifier = self._notifier = self.store.notifier()
        refresh_at = time.monotonic() + interest.REFRESH_SECONDS
        try:
            while True:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
                # lands as the event is set, and this task then outlives Hub.stop for ever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, refresh_at - time.monotonic())):
                        await self._dirty_event.wait()
                # No window: a group commit's listeners all ran before this task got its turn,
                # so each group commit rings once, and commits landing while a NOTIFY is out
                # share the next one.
                self._dirty_event.clear()
                if time.monotonic() >= refresh_at:
                    self._announce_all = True
                    refresh_at = time.monotonic() + interest.REFRESH_SECONDS
                announced = self._to_announce()
                doorbells = [interest.doorbell(lane) for lane in sorted(self._dirty)]
                deletions = [
                    interest.deletion(*deleted) for deleted in sorted(self._deleted.items())
                ]
                payloads = doorbells + deletions + interest.announcements(announced)
                self._dirty = set()
                self._deleted = {}
                if not payloads:
                    continue
                metrics.current.doorbells_sent.inc(len(doorbells))
                try:
                    await notifier.send(CHANNEL, payloads)
                except ChannelError as exc:
                    # Lost doorbells are covered by polling; never let them fail a commit.
                    log.warning("could not send %d doorbells: %s", len(payloads), exc)
                    self._announce.update(announced)
                    continue
                loop = asyncio.get_running_loop()
                for lane in announced:
                    loop.call_later(ANNOUNCE_SETTLE_SECONDS, self.refresh, lane)
        finally:
            await notifier.close()

    def _namespace_followed(self, namespace: str) -> None:
        """A namespace's lanes are followed here now (WatchLanes): tell the others, so that
        their commits in it ring this process."""
        if self.notify:
            self._announce.add(interest.whole(namespace))
            self._dirty_event.set()

    def _to_announce(self) -> list[LaneRef]:
        """The watched lanes, and followed namespaces, to announce now (all of them when a
        refresh or hello is due)."""
        followed = [interest.whole(namespace) for namespace in self.lane_changes.namespaces()]
        if self._announce_all:
            self._announce_all = False
            self._announce = set()
            return sorted(self._lanes) + followed
        lanes = sorted(lane for lane in self._announce if lane in self._lanes or lane in followed)
        self._announce = set()
        return lanes

    async def _listen_forever(self) -> None:
        backoff = LISTEN_RETRY_FIRST_SECONDS
        while True:
            try:
                # Hello (an empty payload): the other hubs announce what they watch.
                async with self.store.listen(
                    CHANNEL, hello="", application_name=LISTENER_NAME
                ) as listener:
                    # Ours are announced at the next flush (again: they may have been missed).
                    self._announce_all = True
                    self._dirty_event.set()
                    self.listening.set()
                    backoff = LISTEN_RETRY_FIRST_SECONDS
                    # Anything committed while we were not listening is caught up now.
                    self.refresh_all()
                    async for notification in listener.notifications():
                        # Our own doorbells: their commits reached our feeds at commit already.
                        if self._notifier is not None and notification.pid == self._notifier.pid:
                            continue
                        self._heard(notification.payload)
            except ChannelError as exc:
                self.listening.clear()
                metrics.current.listener_reconnects.inc()
                _outage_log.warning("LISTEN connection lost or refused (%s); reconnecting", exc)
                await asyncio.sleep(backoff)
                # As the pool does: a short wait, whatever the outage's length, so that after a
                # failover doorbells flow again within about a second of the promotion.
                backoff = reconnect_delay(self.reconnect_seconds)

    def _heard(self, payload: str) -> None:
        if not payload:  # another hub said hello: tell it what we watch
            self._announce_all = True
            self._dirty_event.set()
        elif payload.startswith(interest.ANNOUNCE):
            self._remote.heard(payload)
        elif payload.startswith(interest.DELETED):
            lane, incarnation = interest.deleted_lane(payload)
            self._lane_gone(lane, incarnation)
            self.lane_changes.deleted(lane, incarnation)
        else:
            lane = interest.rung_lane(payload)
            self.refresh(lane)
            self.lane_changes.rang(lane)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            if not self._lanes:
                continue
            # Only the lanes asked about, with the incarnation their watchers had read before
            # the poll's read: what is missing from it, or another incarnation, was deleted.
            polled = {lane: (watched, watched.incarnation) for lane, watched in self._lanes.items()}
            try:
                heads = await self.store.lane_heads(list(polled))
            except Exception as exc:  # the database: transient, try again next time
                log.warning("poll failed: %s", exc)
                continue
            for lane, (watched, known) in polled.items():
                head = heads.get(lane)
                end = watched.feed.end
                if self._lanes.get(lane) is not watched:
                    continue  # deleted, or deleted and watched again, during the poll's read
                if known is not None and (head is None or head.incarnation != known):
                    # Deleted (its deletion notice did not reach us), maybe created again.
                    self._lane_gone(lane, known)
                elif head is None or head.incarnation != watched.incarnation:
                    # Not read by any of its watchers before the poll: absent from the poll
                    # only means they started first, and their own reads tell what they follow.
                    continue
                elif end is None:
                    # No feed position yet: the watchers behind read the log themselves.
                    for subscription in watched.subscriptions:
                        if head.revision > subscription.revision:
                            subscription.ring()
                elif head.revision > end:
                    self._want_read(watched)
                else:
                    start = watched.feed.start
                    assert start is not None
                    for subscription in watched.subscriptions:
                        # Behind the feed and waiting after reading the log (see watch.py).
                        if subscription.revision < start:
                            subscription.ring()
