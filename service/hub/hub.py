"""The per-process hub: one LISTEN connection, coalesced doorbells, a polling fallback.

Correctness never depends on NOTIFY: a watcher always reads its lane's event log from its own
last revision, and the hub only tells it *when* to look. Three things ring:

- a commit in this process rings its lane at once (``Store.commit_listeners``);
- a NOTIFY from another process (payload: ``namespace/lane_id``) rings that lane;
- a poll every ``poll_interval`` seconds rings every watched lane whose head moved past what
  its watchers have seen — the fallback when NOTIFY is off, lost, or the listener is down.

Doorbells are sent after commit, outside the writer's transaction (NOTIFY takes a cluster-wide
lock through commit), coalesced per lane, from one task — and only while another process
listens: the sender looks for other hubs' LISTEN connections (by their application name) at
most once every :data:`PEER_CHECK_SECONDS`. A lone process sends none, so a commit costs one
PostgreSQL transaction; a process that starts listening is rung within that time, and polling
covers the gap. A hub that starts listening says hello (an empty doorbell), and every hub that
hears it rings again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from service import metrics
from service.store import LaneRef, Store

log = logging.getLogger(__name__)

CHANNEL = "lane_events"
#: How long the doorbell sender gathers commits before one NOTIFY transaction.
DOORBELL_COALESCE_SECONDS = 0.002
#: How often the doorbell sender checks whether any other process listens.
PEER_CHECK_SECONDS = 1.0
#: The application name of every hub's LISTEN connection: how hubs find each other.
LISTENER_NAME = "lane-hub"
_PEERS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name = %s AND pid <> %s"
)


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
        #: The backend pid of our LISTEN connection, which is not a peer.
        self._listener_pid = 0
        #: Whether another process's hub listens, and when that was last checked.
        self._peers = True
        self._peers_checked = -math.inf
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
        self._subscriptions.setdefault(lane, set()).add(subscription)
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
        if self.notify:
            self._dirty.add(lane)
            self._dirty_event.set()

    # -- tasks -----------------------------------------------------------------------------

    async def _send_doorbells(self) -> None:
        # One dedicated connection: a pooled one would cost a checkout per doorbell and compete
        # with commands. Each flush is one small transaction of its own, after the commits.
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            while True:
                await self._dirty_event.wait()
                # Coalesce: commits landing within this window share one NOTIFY transaction.
                await asyncio.sleep(DOORBELL_COALESCE_SECONDS)
                self._dirty_event.clear()
                lanes, self._dirty = sorted(self._dirty), set()
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(
                            str(self.store.pool.conninfo), autocommit=True
                        )
                        self._doorbell_pid = conn.info.backend_pid
                    if not await self._peers_listen(conn):
                        continue
                    await conn.execute(
                        "SELECT pg_notify(%s, lane) FROM unnest(%s::text[]) AS lane",
                        (CHANNEL, [_doorbell(lane) for lane in lanes]),
                    )
                except (psycopg.Error, OSError) as exc:
                    # Lost doorbells are covered by polling; never let them fail a commit.
                    log.warning("could not send %d doorbells: %s", len(lanes), exc)
                    conn = None
        finally:
            if conn is not None:
                await conn.close()

    async def _peers_listen(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether another process's hub listens (checked at most every PEER_CHECK_SECONDS)."""
        now = time.monotonic()
        if now - self._peers_checked >= PEER_CHECK_SECONDS:
            self._peers_checked = now
            try:
                cur = await conn.execute(_PEERS, (LISTENER_NAME, self._listener_pid))
                row = await cur.fetchone()
                self._peers = row is None or row[0] > 0
            except psycopg.errors.InsufficientPrivilege:
                self._peers = True  # cannot tell: ring as if someone listened
        return self._peers

    async def _listen_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    str(self.store.pool.conninfo), autocommit=True, application_name=LISTENER_NAME
                ) as conn:
                    self._listener_pid = conn.info.backend_pid
                    # Hello (an empty doorbell): hubs that rang no one start ringing now. What
                    # they commit before LISTEN takes effect is caught up by ring_all below.
                    await conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    backoff = 0.1
                    # Anything committed while we were not listening is caught up now.
                    self.ring_all()
                    async for notification in conn.notifies():
                        # Our own doorbells rang our watchers at commit already.
                        if not notification.payload:
                            self._peers, self._peers_checked = True, time.monotonic()
                        elif notification.pid != self._doorbell_pid:
                            self.ring(_rung_lane(notification.payload))
            except (psycopg.Error, OSError) as exc:
                self.listening.clear()
                metrics.LISTENER_RECONNECTS.inc()
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            if not self._subscriptions:
                continue
            try:
                async with self.store.pool.connection() as conn:
                    watched = list(self._subscriptions)
                    cur = await conn.execute(
                        "SELECT l.namespace, l.lane_id, l.revision"
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


def _doorbell(lane: LaneRef) -> str:
    # Namespace names never contain "/", so the first one separates the two.
    return f"{lane.namespace}/{lane.lane_id}"


def _rung_lane(payload: str) -> LaneRef:
    namespace, _, lane_id = payload.partition("/")
    return LaneRef(namespace, lane_id)
