"""The PostgreSQL store: each command all-or-nothing, decided on the lane kept in memory and
committed with the other lanes' commands ready at the same moment (group_commit.py), or under
the lane row lock in a transaction of its own. Its lock-free reads (store_reads.py) and its
upkeep (upkeep.py) are parts it holds."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from lane.server import metrics, traces
from lane.server.domain.errors import AlreadyExists, LaneError
from lane.server.domain.export_format import ExportHead
from lane.server.domain.guards import require_no_operation
from lane.server.domain.ids import new_id
from lane.server.domain.reconcile import reconcile
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import notify
from lane.server.store.clock import Clock, system_clock
from lane.server.store.commit_step import Decide, recorded, worked_out
from lane.server.store.event_log import EventGroup
from lane.server.store.group_commit import GroupCommitter
from lane.server.store.lane_cache import LaneCache
from lane.server.store.lane_reads import (
    VersionedLane,
    load_versioned,
)
from lane.server.store.lane_ref import LANE_SCAN, LaneRef
from lane.server.store.lane_removal import delete_lane_rows, record_answer
from lane.server.store.lane_transfer import (
    ExportPage,
    ImportBatch,
    export_pages,
    read_export_head,
    write_import,
)
from lane.server.store.lane_writes import (
    CommitStatement,
    commit_statement,
    insert_lane,
    run_commit,
)
from lane.server.store.pool import DEFAULT_RECONNECT_SECONDS, LanePool, migrate_pool, open_pool
from lane.server.store.requests import Recording, earlier_answer
from lane.server.store.store_reads import StoreReads, lane_not_found
from lane.server.store.upkeep import Upkeep

A = TypeVar("A")

log = logging.getLogger(__name__)

#: Called after every commit that appended events, with the lane, its incarnation and its events
#: as written (the hub hands them to the lane's watchers from memory). Called in commit order
#: per lane, in the lane's turn (``LaneCache.turn``): must not block, and must not keep the list
#: it is given for anything but reading.
CommitListener = Callable[[LaneRef, int, EventGroup], None]
#: Called after a lane was deleted in this process, with the incarnation deleted (the hub ends
#: its watchers). Must not block.
DeleteListener = Callable[[LaneRef, int], None]


_VERSION = "SELECT version FROM lanes WHERE namespace = %(ns)s AND lane_id = %(lane)s"
# The runs the domain's leases.reconcilable would end at the given time (the store's clock, as the
# domain decides with, not the database's): leased, no live lease, and aborted or orphaned for
# the given interval; a page after (lease_expires, operation_id).
_RECONCILABLE = (
    LANE_SCAN + "SELECT namespace, lane_id, operation_id, coalesce(lease_expires, 'epoch')"
    " FROM operations"
    " WHERE lease_token > 0 AND phase <> 'ended'"
    " AND (lease_holder IS NULL OR lease_expires <= %(now)s)"
    " AND (cancel_requested OR lease_expires IS NULL OR lease_expires <= %(now)s - %(orphan)s)"
    " AND (coalesce(lease_expires, 'epoch'), operation_id) > (%(after)s, %(after_id)s)"
    " ORDER BY coalesce(lease_expires, 'epoch'), operation_id LIMIT %(limit)s"
)


#: Errors of an optimistic statement after which the command is decided under the lane's lock (the
#: statement wrote nothing): a request id or operation id used before, a deadlock with another
#: process's commit on the same rows, or, in a group, a row lock held elsewhere for longer than the
#: group waits (group_commit.LOCK_WAIT_SECONDS).
_DECIDE_UNDER_LOCK = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.LockNotAvailable,
)


def _reused_id(exc: psycopg.errors.UniqueViolation, transition: Transition) -> LaneError:
    """The refusal for a commit that failed on a primary key under the lane lock: only an
    operation id used before (by any lane of the namespace) can do that."""
    if exc.diag.constraint_name != "operations_pkey":
        raise exc
    state = transition.state
    operation_id = (
        state.operation.operation_id
        if state.operation is not None
        else state.last_operation_id or ""
    )
    return AlreadyExists(
        "OPERATION_ID_EXISTS",
        f"operation id {operation_id} was used before",
        operationId=operation_id,
    )


async def _to_its_end(transaction: Coroutine[Any, Any, A]) -> A:
    """Run ``transaction`` to its commit or rollback whatever the caller does. When the caller
    goes away first, its outcome is still read once it ends, so a failure is not reported
    later as an exception nobody retrieved."""
    task = asyncio.ensure_future(transaction)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_read_outcome)
        raise


def _read_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class Store:
    """Durable lanes in PostgreSQL. Create with :meth:`open`.

    The one way into the database for the rest of the service: its commands are this class's,
    its lock-free reads are :class:`StoreReads`'s and its upkeep :class:`Upkeep`'s, both parts
    it holds and offers as its own methods. Nothing outside ``store/`` reaches its pool or the
    lanes it keeps in memory (tests/unit/test_layers.py)."""

    def __init__(self, pool: LanePool, *, clock: Clock = system_clock) -> None:
        #: The connections; for the store's parts, and for tests' hand edits of rows.
        self.pool = pool
        #: The time every command decides with (service/lane/server/store/clock.py).
        self.clock = clock
        self._commit_listeners: list[CommitListener] = []
        self._delete_listeners: list[DeleteListener] = []
        #: The lanes this process commanded lately (see lane_cache.py).
        self._cache = LaneCache()
        #: Commits the optimistic path's statements together (group_commit.py).
        self.committer = GroupCommitter(pool)
        reads = self._reads = StoreReads(pool)
        self.snapshot_outline = reads.snapshot_outline
        self.entry_bodies = reads.entry_bodies
        self.snapshot = reads.snapshot
        self.complete_snapshot = reads.complete_snapshot
        self.lane_summaries = reads.lane_summaries
        self.namespace_heads = reads.namespace_heads
        self.lane_head = reads.lane_head
        self.resume_point = reads.resume_point
        self.lane_heads = reads.lane_heads
        self.read_events = reads.read_events
        self.open_operation = reads.open_operation
        self.entry_exists = reads.entry_exists
        upkeep = Upkeep(pool, clock)
        self.enforce_retention = upkeep.enforce_retention
        self.prune_answers = upkeep.prune_answers
        self.lanes_awaiting_placement = upkeep.lanes_awaiting_placement
        self.notification_queue_usage = upkeep.notification_queue_usage
        self.connections_allowed = upkeep.connections_allowed
        self.unready_reason = upkeep.unready_reason
        self.reachable = upkeep.reachable
        self.wait_unreachable = upkeep.wait_unreachable

    @property
    def event_log_reads(self) -> int:
        """Reads of the event log by this store (:meth:`StoreReads.read_events`)."""
        return self._reads.event_log_reads

    def known_state(self, lane: LaneRef) -> LaneState | None:
        """The lane as this process last committed or loaded it, None when it has not lately:
        no query, so it may be behind a commit made elsewhere since."""
        cached = self._cache.get(lane)
        return None if cached is None else cached.state

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        checkout_timeout: float | None = None,
        reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS,
        clock: Clock = system_clock,
    ) -> Store:
        """Connect a pool to ``dsn``. Does not migrate; call :meth:`migrate`.
        ``checkout_timeout``, ``reconnect_seconds``: see
        :func:`~lane.server.store.pool.open_pool` (None: its default);
        ``clock``: the time commands decide with (the real one unless a test moves its own)."""
        pool = await open_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            checkout_timeout=checkout_timeout,
            reconnect_seconds=reconnect_seconds,
        )
        return cls(pool, clock=clock)

    async def migrate(self) -> list[str]:
        """Apply pending schema migrations; return their names."""
        return await migrate_pool(self.pool)

    async def close(self) -> None:
        """Close every connection."""
        await self.pool.close()

    # -- commit listeners and doorbells ------------------------------------------------------

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call ``listener`` after every commit that appends events (see :data:`CommitListener`)."""
        self._commit_listeners.append(listener)

    def remove_commit_listener(self, listener: CommitListener) -> None:
        """Stop calling ``listener`` (added with :meth:`add_commit_listener`)."""
        with contextlib.suppress(ValueError):
            self._commit_listeners.remove(listener)

    def add_delete_listener(self, listener: DeleteListener) -> None:
        """Call ``listener`` after every lane deletion in this process."""
        self._delete_listeners.append(listener)

    def remove_delete_listener(self, listener: DeleteListener) -> None:
        """Stop calling ``listener`` (added with :meth:`add_delete_listener`)."""
        with contextlib.suppress(ValueError):
            self._delete_listeners.remove(listener)

    def listen(
        self, channel: str, *, hello: str | None = None, application_name: str = ""
    ) -> contextlib.AbstractAsyncContextManager[notify.Listener]:
        """A session of its own LISTENing on ``channel`` for the block, after sending
        ``hello`` there (see :func:`lane.server.store.notify.listen`)."""
        return notify.listen(
            str(self.pool.conninfo), channel, hello=hello, application_name=application_name
        )

    def notifier(self) -> notify.Notifier:
        """A session of its own for sending NOTIFYs; close it when done."""
        return notify.Notifier(str(self.pool.conninfo))

    def _committed(
        self, lane: LaneRef, state: LaneState, version: int, statement: CommitStatement | None
    ) -> None:
        """Cache the lane as a commit left it (``state`` at ``version``) and hand the commit's
        events, as written, to the commit listeners."""
        self._cache.put(lane, VersionedLane(state, version))
        if statement is None or statement.events is None:
            return
        metrics.current.events_appended.inc(len(statement.events.bodies))
        for listener in self._commit_listeners:
            listener(lane, state.incarnation, statement.events)

    async def command(
        self, lane: LaneRef, decide: Decide[A], request: Recording[A] | None = None
    ) -> A:
        """Run one command on the lane, all or nothing.

        ``decide`` computes the transition from the lane's state (a refusal raises: nothing is
        written); the transition is written with its events at the next revisions, and the
        answer is recorded under the request's key in its recorded form. A retried request
        returns the stored answer (read back through ``request.decode``).

        A lane this process commanded before is not loaded again: the command decides on the
        state it left and commits with one statement that checks the lane's version, in the
        transaction of the group commit it joins (group_commit.py); when the lane moved on
        meanwhile (another process, a hand edit), the statement writes nothing and the command
        runs again on the lane loaded under its row lock, in a transaction of its own.
        Refusals, replayed request ids and reused operation ids are always decided under the
        lock.

        A caller that goes away (deadline, cancellation) does not cut the command short: it
        runs to its commit or rollback, so a retry finds its outcome under the request id.
        """
        return await _to_its_end(self._command(lane, decide, request))

    async def _command(self, lane: LaneRef, decide: Decide[A], request: Recording[A] | None) -> A:
        with traces.transaction("command", lane.namespace, lane.lane_id):
            async with self._cache.turn(lane):
                cached = self._cache.get(lane)
                if cached is not None:
                    done = await self._optimistic(lane, cached, decide, request)
                    if done is not None:
                        return done[0]
                    self._cache.forget(lane)
                # Under the row lock: a retry, a refusal, or the lane moved on elsewhere.
                traces.annotate("lane.transaction.locked", True)
                return await self._locked(lane, decide, request)

    async def _optimistic(
        self,
        lane: LaneRef,
        cached: VersionedLane,
        decide: Decide[A],
        request: Recording[A] | None,
    ) -> tuple[A] | None:
        """The command on the cached state, committed only if the lane is still at its
        version: its answer (in a 1-tuple: an answer may be anything), or None when it must run
        under the lock instead."""
        try:
            transition, answer, statement = await worked_out(
                lane, cached.state, cached.version, decide, self.clock(), request
            )
        except LaneError:
            return None  # the state may be stale: refuse only what the lock confirms
        if statement is None:
            # Nothing to write: the answer holds if the state it came from is current.
            async with self.pool.connection() as conn:
                cur = await conn.execute(_VERSION, lane.params)
                row = await cur.fetchone()
            return (answer,) if row is not None and row[0] == cached.version else None
        try:
            written = await self.committer.commit(lane, statement)
        except _DECIDE_UNDER_LOCK:
            # A request id or operation id used before, or a deadlock with another process's
            # commit (nothing was written): decide under the lock.
            return None
        if not written:
            return None
        metrics.current.optimistic_commits.inc()
        self._committed(lane, transition.state, cached.version + 1, statement)
        return (answer,)

    async def _locked(self, lane: LaneRef, decide: Decide[A], request: Recording[A] | None) -> A:
        """The command on the lane loaded under its row lock, in one transaction."""
        try:
            # One pipeline: BEGIN and the load go out together, then the write and COMMIT.
            async with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
                loaded = await load_versioned(conn, lane, lock=True)
                if loaded is None:
                    raise lane_not_found(lane)
                metrics.current.locked_commits.inc()
                self._cache.put(lane, loaded)
                earlier = await earlier_answer(conn, lane, request)
                if earlier is not None:
                    return earlier[0]
                transition, answer, statement = await worked_out(
                    lane, loaded.state, loaded.version, decide, self.clock(), request
                )
                if statement is not None and not await run_commit(conn, statement):
                    raise RuntimeError(f"lane {lane} changed under its row lock")
        except psycopg.errors.UniqueViolation as exc:
            raise _reused_id(exc, transition) from exc
        if statement is not None:
            self._committed(lane, transition.state, loaded.version + 1, statement)
        return answer

    async def create_lane(
        self,
        lane: LaneRef,
        created: Transition,
        answer: Callable[[bool, LaneState], A],
        request: Recording[A] | None = None,
    ) -> A:
        """Get-or-create: ``created`` (the new lane's first commit, lane_created) is committed
        when the lane does not exist yet; an existing lane is left as is. The answer is
        ``answer(whether this created the lane, the lane's state now)``."""
        transition = created
        with traces.transaction("create", lane.namespace, lane.lane_id):
            return await self._create_lane(lane, transition, answer, request)

    async def _create_lane(
        self,
        lane: LaneRef,
        transition: Transition,
        answer: Callable[[bool, LaneState], A],
        request: Recording[A] | None,
    ) -> A:
        async with self._cache.turn(lane):
            async with self.pool.connection() as conn, conn.transaction():
                inserted = await insert_lane(conn, lane, transition.state)
                loaded = await load_versioned(conn, lane, lock=True)
                assert loaded is not None
                earlier = await earlier_answer(conn, lane, request)
                if earlier is not None:
                    return earlier[0]
                if inserted:
                    # The row gave the new lane its incarnation.
                    created = replace(transition.state, incarnation=loaded.state.incarnation)
                    transition = replace(transition, state=created)
                else:
                    transition = Transition(loaded.state)
                result = answer(inserted, transition.state)
                statement = commit_statement(
                    lane,
                    loaded.state,
                    transition,
                    loaded.version,
                    recorded(request, result),
                )
                if statement is not None:
                    await run_commit(conn, statement)
            version = loaded.version + (statement is not None)
            self._committed(lane, transition.state, version, statement)
        return result

    async def delete_lane(
        self,
        lane: LaneRef,
        force: bool,
        answer: Callable[[LaneState], A],
        request: Recording[A] | None = None,
    ) -> A:
        """Delete the lane and all its rows in one transaction under its row lock; the answer is
        ``answer(the lane's state when deleted)``. Refused (LANE_BUSY) while an operation is
        open, unless ``force``. The answer is recorded under the request's key and outlives the
        lane: a retry returns it, even once the lane id is in use again. Like :meth:`command`,
        it runs to its commit or rollback whatever the caller does."""
        return await _to_its_end(self._delete_lane(lane, force, answer, request))

    async def _delete_lane(
        self,
        lane: LaneRef,
        force: bool,
        answer: Callable[[LaneState], A],
        request: Recording[A] | None,
    ) -> A:
        with traces.transaction("delete", lane.namespace, lane.lane_id):
            return await self._delete_rows(lane, force, answer, request)

    async def _delete_rows(
        self,
        lane: LaneRef,
        force: bool,
        answer: Callable[[LaneState], A],
        request: Recording[A] | None,
    ) -> A:
        async with self._cache.turn(lane):
            async with self.pool.connection() as conn, conn.transaction():
                earlier = await earlier_answer(conn, lane, request)
                if earlier is not None:
                    return earlier[0]
                loaded = await load_versioned(conn, lane, lock=True)
                if loaded is None:
                    raise lane_not_found(lane)
                if not force:
                    require_no_operation(loaded.state)
                result = answer(loaded.state)
                await delete_lane_rows(conn, lane)
                for kept in recorded(request, result):
                    await record_answer(conn, lane, kept)
            self._cache.forget(lane)
        for listener in self._delete_listeners:
            listener(lane, loaded.state.incarnation)
        return result

    @contextlib.asynccontextmanager
    async def exporting(
        self, lane: LaneRef, idle_seconds: float
    ) -> AsyncIterator[tuple[ExportHead, Callable[[int], AsyncGenerator[ExportPage, None]]]]:
        """The idle lane's head (LANE_BUSY while an operation is open) and its rows page by
        page (a function of a page's byte budget: lane_transfer.export_pages), all read in one
        REPEATABLE READ, read-only transaction held until the block ends (its connection too:
        see lane_transfer). ``idle_seconds``: how long the transaction may sit idle between
        pages (while a page waits for the client)."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            # The pool's connections end a transaction idle for a minute; an export waits for
            # its client at most the write deadline between reads.
            timeout = f"{math.ceil(idle_seconds * 1000)}ms"
            await conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, true)", (timeout,)
            )
            head = await read_export_head(conn, lane)
            if head is None:
                raise lane_not_found(lane)
            yield head, functools.partial(export_pages, conn, lane)

    async def import_lane(
        self, lane: LaneRef, head: ExportHead, batches: AsyncIterator[ImportBatch]
    ) -> None:
        """Create ``lane`` from a checked export's head and rows, in one transaction
        (ALREADY_EXISTS ``LANE_EXISTS`` when the id is in use)."""
        with traces.transaction("import", lane.namespace, lane.lane_id):
            async with self._cache.turn(lane):
                async with self.pool.connection() as conn, conn.transaction():
                    await write_import(conn, lane, head, batches)
                self._cache.forget(lane)

    async def reconcile_orphans(self, orphan_after: timedelta, limit: int = 100) -> list[str]:
        """End the leased runs no driver holds any more (aborted, or orphaned for
        ``orphan_after``); return their operation ids. Safe to run from every process: each
        candidate is decided again by the domain (``reconcile``) in its own command.

        Candidates are exactly the runs the domain would end now, read ``limit`` at a time in
        lease-expiry order until none is left: runs that cannot be ended (corrupt state) stay
        candidates, but never keep the others from their turn."""
        ended: list[str] = []
        after: tuple[datetime, str] = (datetime.min.replace(tzinfo=UTC), "")
        while True:
            params = {
                "now": self.clock(),
                "orphan": orphan_after,
                "after": after[0],
                "after_id": after[1],
                "limit": limit,
            }
            async with self.pool.connection() as conn:
                cur = await conn.execute(_RECONCILABLE, params)
                candidates = await cur.fetchall()
            for namespace, lane_id, operation_id, _ in candidates:
                if await self._reconcile(LaneRef(namespace, lane_id), operation_id, orphan_after):
                    ended.append(operation_id)
            if len(candidates) < limit:
                return ended
            after = (candidates[-1][3], candidates[-1][2])

    async def _reconcile(self, lane: LaneRef, operation_id: str, orphan_after: timedelta) -> bool:
        """End the run if it is still reconcilable; whether it was ended."""

        def decide(state: LaneState, now: datetime) -> tuple[Transition, bool]:
            t = reconcile(state, operation_id, now, orphan_after, new_id)
            return (Transition(state), False) if t is None else (t, True)

        try:
            return await self.command(lane, decide)
        except LaneError as exc:
            # One lane that cannot be ended (corrupt state) must not hold up the others;
            # it stays a candidate, and its reason is logged on every pass.
            log.warning(
                "cannot reconcile operation %s of lane %s/%s: %s %s",
                operation_id,
                lane.namespace,
                lane.lane_id,
                exc.reason,
                exc.message,
            )
            return False
