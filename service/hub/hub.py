"""The per-process hub: one LISTEN connection, coalesced doorbells, a polling fallback.

Correctness never depends on NOTIFY: a watcher always reads its lane's event log from its own
last revision, and the hub only tells it *when* to look. Three things ring:

- a commit in this process rings its lane at once (``Store.commit_listeners``);
- a NOTIFY from another process (payload: ``namespace/lane_id``) rings that lane;
- a poll every ``poll_interval`` seconds rings every watched lane whose head moved past what
  its watchers have seen — the fallback when NOTIFY is off, lost, or the listener is down.

Doorbells are sent after commit, outside the writer's transaction (NOTIFY takes a cluster-wide
lock through commit), coalesced per lane, from one task — and only for lanes another process
watches (``interest.py``): a lone process, or lanes nobody elsewhere follows, cost no NOTIFY, so
a commit is one PostgreSQL transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from service import metrics
from service.hub import interest
from service.store import LANE_SCAN, LaneRef, Store

log = logging.getLogger(__name__)

CHANNEL = "lane_events"
#: How long the doorbell sender gathers commits before one NOTIFY transaction.
DOORBELL_COALESCE_SECONDS = 0.002
#: The application name of every hub's LISTEN connection (to find them in pg_stat_activity).
LISTENER_NAME = "lane-hub"
#: After announcing a lane, its local watchers are rung again this much later: a commit made
#: elsewhere before the announcement arrived got no doorbell.
ANNOUNCE_SETTLE_SECONDS = 0.2


class Subscription:
    """One watcher's interest in one lane."""

    def __init__(self, lane: LaneRef) -> None:
        self.lane = lane
        #: The revision this watcher has delivered through; the poller wakes it past that.
        self.revision = 0
        self._wake = asyncio.Event()

    def ring(self) -> None:
        """Wake the watcher."""
        self._wake.set()

    async def wait(self, within: float) -> bool:
        """Wait until rung, at most ``within`` seconds; True when rung."""
        try:
            await asyncio.wait_for(self._wake.wait(), within)
        except TimeoutError:
            return False
        self._wake.clear()
        return True


class Hub:
    """Wakes this process's watchers; see the module docstring."""

    def __init__(self, store: Store, *, notify: bool = True, poll_interval: float = 1.0) -> None:
        self.store = store
        self.notify = notify
        self.poll_interval = poll_interval
        self._subscriptions: dict[LaneRef, set[Subscription]] = {}
        self._dirty: set[LaneRef] = set()
        self._dirty_event = asyncio.Event()
        #: The backend pid of the doorbell connection: its NOTIFYs are this process's own.
        self._doorbell_pid = 0
        #: The lanes other processes watch; our watched lanes still to announce.
        self._remote = interest.RemoteInterest()
        self._announce: set[LaneRef] = set()
        self._announce_all = True
        self._tasks: list[asyncio.Task[None]] = []
        self.listening = asyncio.Event()
        #: Set on shutdown: watchers end their streams (UNAVAILABLE) so clients resume elsewhere.
        self.closing = False
        store.commit_listeners.append(self.committed)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the poller and, with NOTIFY on, the listener and the doorbell sender."""
        self._tasks.append(asyncio.create_task(self._poll_forever(), name="hub-poll"))
        if self.notify:
            self._tasks.append(asyncio.create_task(self._listen_forever(), name="hub-listen"))
            self._tasks.append(asyncio.create_task(self._send_doorbells(), name="hub-notify"))

    def close_watchers(self) -> None:
        """Ask every watcher to end its stream now (server shutdown)."""
        self.closing = True
        self.ring_all()

    async def stop(self) -> None:
        """Stop every task."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    # -- watchers --------------------------------------------------------------------------

    @contextlib.contextmanager
    def subscribe(self, lane: LaneRef) -> Iterator[Subscription]:
        """Register a watcher of ``lane`` for the duration of the block."""
        subscription = Subscription(lane)
        watching = self._subscriptions.setdefault(lane, set())
        if not watching and self.notify:
            self._announce.add(lane)  # the lane's first watcher here: tell the others
            self._dirty_event.set()
        watching.add(subscription)
        try:
            yield subscription
        finally:
            watchers = self._subscriptions.get(lane)
            if watchers is not None:
                watchers.discard(subscription)
                if not watchers:
                    del self._subscriptions[lane]

    def watcher_count(self, lane: LaneRef | None = None) -> int:
        """How many watchers this process has (on one lane, or in all)."""
        if lane is not None:
            return len(self._subscriptions.get(lane, ()))
        return sum(len(s) for s in self._subscriptions.values())

    def watched_elsewhere(self, lane: LaneRef) -> bool:
        """Whether another process announced watchers of ``lane`` (its commits ring them)."""
        return self._remote.watched(lane)

    def ring(self, lane: LaneRef) -> None:
        """Wake every local watcher of ``lane``."""
        for subscription in self._subscriptions.get(lane, ()):
            subscription.ring()

    def ring_all(self) -> None:
        """Wake every local watcher (after the listener reconnects: something may be missed)."""
        for watchers in self._subscriptions.values():
            for subscription in watchers:
                subscription.ring()

    def committed(self, lane: LaneRef, revision: int) -> None:
        """A commit in this process: wake local watchers now, ring other processes soon."""
        self.ring(lane)
        if self.notify and self._remote.watched(lane):
            self._dirty.add(lane)
            self._dirty_event.set()

    # -- tasks -----------------------------------------------------------------------------

    async def _send_doorbells(self) -> None:
        # One dedicated connection: a pooled one would cost a checkout per doorbell and compete
        # with commands. Each flush is one small transaction of its own, after the commits.
        conn: psycopg.AsyncConnection[Any] | None = None
        refresh_at = time.monotonic() + interest.REFRESH_SECONDS
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._dirty_event.wait(), max(0.0, refresh_at - time.monotonic())
                    )
                # Coalesce: commits landing within this window share one NOTIFY transaction.
                await asyncio.sleep(DOORBELL_COALESCE_SECONDS)
                self._dirty_event.clear()
                if time.monotonic() >= refresh_at:
                    self._announce_all = True
                    refresh_at = time.monotonic() + interest.REFRESH_SECONDS
                announced = self._to_announce()
                doorbells = [interest.doorbell(lane) for lane in sorted(self._dirty)]
                payloads = doorbells + interest.announcements(announced)
                self._dirty = set()
                if not payloads:
                    continue
                metrics.DOORBELLS_SENT.inc(len(doorbells))
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(
                            str(self.store.pool.conninfo), autocommit=True
                        )
                        self._doorbell_pid = conn.info.backend_pid
                    await conn.execute(
                        "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload",
                        (CHANNEL, payloads),
                    )
                except (psycopg.Error, OSError) as exc:
                    # Lost doorbells are covered by polling; never let them fail a commit.
                    log.warning("could not send %d doorbells: %s", len(payloads), exc)
                    self._announce.update(announced)
                    conn = None
                    continue
                loop = asyncio.get_running_loop()
                for lane in announced:
                    loop.call_later(ANNOUNCE_SETTLE_SECONDS, self.ring, lane)
        finally:
            if conn is not None:
                await conn.close()

    def _to_announce(self) -> list[LaneRef]:
        """The watched lanes to announce now (all of them when a refresh or hello is due)."""
        if self._announce_all:
            self._announce_all = False
            self._announce = set()
            return sorted(self._subscriptions)
        lanes = sorted(lane for lane in self._announce if lane in self._subscriptions)
        self._announce = set()
        return lanes

    async def _listen_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    str(self.store.pool.conninfo), autocommit=True, application_name=LISTENER_NAME
                ) as conn:
                    # Hello (an empty payload): the other hubs announce what they watch.
                    await conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
                    await conn.execute(f"LISTEN {CHANNEL}")
                    # Ours are announced at the next flush (again: they may have been missed).
                    self._announce_all = True
                    self._dirty_event.set()
                    self.listening.set()
                    backoff = 0.1
                    # Anything committed while we were not listening is caught up now.
                    self.ring_all()
                    async for notification in conn.notifies():
                        # Our own doorbells rang our watchers at commit already.
                        if notification.pid == self._doorbell_pid:
                            continue
                        self._heard(notification.payload)
            except (psycopg.Error, OSError) as exc:
                self.listening.clear()
                metrics.LISTENER_RECONNECTS.inc()
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _heard(self, payload: str) -> None:
        if not payload:  # another hub said hello: tell it what we watch
            self._announce_all = True
            self._dirty_event.set()
        elif payload.startswith(interest.ANNOUNCE):
            self._remote.heard(payload)
        else:
            self.ring(interest.rung_lane(payload))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            if not self._subscriptions:
                continue
            try:
                async with self.store.pool.connection() as conn:
                    watched = list(self._subscriptions)
                    cur = await conn.execute(
                        LANE_SCAN + "SELECT l.namespace, l.lane_id, l.revision"
                        " FROM unnest(%s::text[], %s::text[]) AS w(namespace, lane_id)"
                        " JOIN lanes l USING (namespace, lane_id)",
                        ([lane.namespace for lane in watched], [lane.lane_id for lane in watched]),
                    )
                    heads = {LaneRef(ns, lane_id): rev for ns, lane_id, rev in await cur.fetchall()}
            except (psycopg.Error, OSError) as exc:
                log.warning("poll failed: %s", exc)
                continue
            for lane, watchers in list(self._subscriptions.items()):
                head = heads.get(lane)
                for subscription in watchers:
                    if head is None or head > subscription.revision:
                        subscription.ring()
