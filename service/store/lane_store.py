"""The PostgreSQL store: one transaction per command under the lane row lock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, TypeVar

import psycopg
from google.protobuf.message import Message
from lane.v1 import entries_pb2, lane_service_pb2, snapshot_pb2
from psycopg_pool import AsyncConnectionPool

from service import metrics
from service.domain import lanes
from service.domain.capture import capture
from service.domain.errors import AlreadyExists, LaneError, NotFound
from service.domain.ids import new_id
from service.domain.limits import check_commit
from service.domain.reconcile import reconcile
from service.domain.state import LaneState, Operation
from service.domain.transition import Transition
from service.store.codec import decode
from service.store.lane_cache import LaneCache
from service.store.lane_reads import (
    VersionedLane,
    load_entry_bodies,
    load_events,
    load_lane,
    load_transcript_index,
    load_versioned,
)
from service.store.lane_ref import LANE_SCAN, LaneRef
from service.store.lane_writes import RecordedAnswer, commit_statement, insert_lane, run_commit
from service.store.pool import migrate_pool, open_pool
from service.store.requests import RequestKey, replayed_answer

R = TypeVar("R", bound=Message)

log = logging.getLogger(__name__)

#: ``decide(state, now) -> (transition, answer)``: a pure domain step plus the RPC's answer.
Decide = Callable[[LaneState, datetime], tuple[Transition, R]]
#: Called after every commit with the lane and its new revision (the hub's doorbell).
CommitListener = Callable[[LaneRef, int], None]


class SnapshotOutline(NamedTuple):
    """A lane's snapshot with an empty transcript, and its transcript as (entry id, encoded
    size) pairs, oldest first."""

    snapshot: snapshot_pb2.LaneSnapshot
    transcript: list[tuple[str, int]]


class EventGroup(NamedTuple):
    """One commit's events as stored."""

    first_revision: int
    #: Encoded HarnessEvent bodies, in revision order.
    bodies: list[bytes]
    #: When the group was committed (its events' ``commit_time``).
    commit_time: datetime


_VERSION = "SELECT version FROM lanes WHERE namespace = %(ns)s AND lane_id = %(lane)s"


def _recorded(
    request: RequestKey | None, amends: RequestKey | None, answer: Message
) -> list[RecordedAnswer]:
    """The answers a command records: its own, and the one of the request it completes."""
    recorded = []
    for key, replace in ((request, False), (amends, True)):
        if key is not None:
            recorded.append(
                RecordedAnswer(key.request_id, key.method, key.digest, answer, replace=replace)
            )
    return recorded


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


def lane_not_found(lane: LaneRef) -> NotFound:
    """The refusal for a lane that does not exist (in the caller's namespace: a lane of
    another namespace gets exactly this answer)."""
    return NotFound("LANE_NOT_FOUND", f"lane {lane.lane_id} does not exist", laneId=lane.lane_id)


class Store:
    """Durable lanes in PostgreSQL. Create with :meth:`open`."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self.commit_listeners: list[CommitListener] = []
        #: The lanes this process commanded lately (see lane_cache.py).
        self.cache = LaneCache()

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        checkout_timeout: float | None = None,
    ) -> Store:
        """Connect a pool to ``dsn``. Does not migrate; call :meth:`migrate`.
        ``checkout_timeout``: see :func:`~service.store.pool.open_pool` (None: its default)."""
        return cls(
            await open_pool(
                dsn, min_size=min_size, max_size=max_size, checkout_timeout=checkout_timeout
            )
        )

    async def migrate(self) -> list[str]:
        """Apply pending schema migrations; return their names."""
        return await migrate_pool(self.pool)

    async def close(self) -> None:
        """Close every connection."""
        await self.pool.close()

    def _committed(self, lane: LaneRef, transition: Transition) -> None:
        if not transition.events:
            return
        metrics.EVENTS_APPENDED.inc(len(transition.events))
        for listener in self.commit_listeners:
            listener(lane, transition.state.revision)

    async def command(
        self,
        lane: LaneRef,
        decide: Decide[R],
        answer_type: type[R],
        request: RequestKey | None = None,
        *,
        amends: RequestKey | None = None,
    ) -> R:
        """Run one command as one transaction on the lane.

        ``decide`` computes the transition from the lane's state (a refusal raises: nothing is
        written); the transition is written with its events at the next revisions, and the
        answer is recorded under the request id. A retried request id returns the stored answer.

        ``amends`` names a request whose work this command completes (a second commit of one
        RPC): a command that commits replaces that request's stored answer with its own; one
        that commits nothing returns the stored answer, so every retry answers alike.

        A lane this process commanded before is not loaded again: the command decides on the
        state it left and commits with one statement that checks the lane's version; when the
        lane moved on meanwhile (another process, a hand edit), the statement writes nothing and
        the command runs again on the lane loaded under its row lock. Refusals, replayed request
        ids and reused operation ids are always decided under the lock.

        A caller that goes away (deadline, cancellation) does not cut the command short: it
        runs to its commit or rollback, so a retry finds its outcome under the request id.
        """
        return await asyncio.shield(
            self._command(lane, decide, answer_type, request, amends=amends)
        )

    async def _command(
        self,
        lane: LaneRef,
        decide: Decide[R],
        answer_type: type[R],
        request: RequestKey | None,
        *,
        amends: RequestKey | None,
    ) -> R:
        async with self.cache.turn(lane):
            cached = self.cache.get(lane)
            if cached is not None:
                answer = await self._optimistic(lane, cached, decide, request, amends)
                if answer is not None:
                    return answer
                self.cache.forget(lane)
            return await self._locked(lane, decide, answer_type, request, amends)

    async def _optimistic(
        self,
        lane: LaneRef,
        cached: VersionedLane,
        decide: Decide[R],
        request: RequestKey | None,
        amends: RequestKey | None,
    ) -> R | None:
        """The command on the cached state, committed only if the lane is still at its
        version; None when it must run under the lock instead."""
        try:
            transition, answer = decide(cached.state, datetime.now(UTC))
            check_commit(cached.state, transition)
        except LaneError:
            return None  # the state may be stale: refuse only what the lock confirms
        if amends is not None and not transition.events:
            return None  # the answer to repeat is the stored one
        statement = commit_statement(
            lane, cached.state, transition, cached.version, _recorded(request, amends, answer)
        )
        async with self.pool.connection() as conn:
            if statement is None:
                # Nothing to write: the answer holds if the state it came from is current.
                cur = await conn.execute(_VERSION, lane.params)
                row = await cur.fetchone()
                return answer if row is not None and row[0] == cached.version else None
            try:
                written = await run_commit(conn, statement)
            except psycopg.errors.UniqueViolation:
                return None  # a request id or operation id used before: see under the lock
        if not written:
            return None
        metrics.OPTIMISTIC_COMMITS.inc()
        self.cache.put(lane, VersionedLane(transition.state, cached.version + 1))
        self._committed(lane, transition)
        return answer

    async def _locked(
        self,
        lane: LaneRef,
        decide: Decide[R],
        answer_type: type[R],
        request: RequestKey | None,
        amends: RequestKey | None,
    ) -> R:
        """The command on the lane loaded under its row lock, in one transaction."""
        try:
            # One pipeline: BEGIN and the load go out together, then the write and COMMIT.
            async with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
                loaded = await load_versioned(conn, lane, lock=True)
                if loaded is None:
                    raise lane_not_found(lane)
                metrics.LOCKED_COMMITS.inc()
                self.cache.put(lane, loaded)
                if request is not None:
                    replay = await replayed_answer(conn, lane, request, answer_type)
                    if replay is not None:
                        return replay
                transition, answer = decide(loaded.state, datetime.now(UTC))
                check_commit(loaded.state, transition)  # refuses what could never be delivered
                if amends is not None and not transition.events:
                    # Nothing to add to the request's answer: repeat what it stored.
                    answer = await replayed_answer(conn, lane, amends, answer_type) or answer
                    amends = None
                statement = commit_statement(
                    lane,
                    loaded.state,
                    transition,
                    loaded.version,
                    _recorded(request, amends, answer),
                )
                if statement is not None and not await run_commit(conn, statement):
                    raise RuntimeError(f"lane {lane} changed under its row lock")
        except psycopg.errors.UniqueViolation as exc:
            raise _reused_id(exc, transition) from exc
        if statement is not None:
            self.cache.put(lane, VersionedLane(transition.state, loaded.version + 1))
            self._committed(lane, transition)
        return answer

    async def create_lane(
        self,
        lane: LaneRef,
        configuration: snapshot_pb2.LaneConfiguration,
        request: RequestKey | None = None,
    ) -> lane_service_pb2.CreateLaneResponse:
        """Get-or-create: a new lane emits lane_created; an existing one is returned as is."""
        answer_type = lane_service_pb2.CreateLaneResponse
        transition = lanes.create_lane(lane.lane_id, configuration, datetime.now(UTC))
        check_commit(None, transition)
        async with self.cache.turn(lane):
            async with self.pool.connection() as conn, conn.transaction():
                created = await insert_lane(conn, lane, transition.state)
                loaded = await load_versioned(conn, lane, lock=True)
                assert loaded is not None
                if request is not None:
                    replay = await replayed_answer(conn, lane, request, answer_type)
                    if replay is not None:
                        return replay
                if not created:
                    transition = Transition(loaded.state)
                answer = answer_type(created=created, revision=transition.state.revision)
                statement = commit_statement(
                    lane,
                    loaded.state,
                    transition,
                    loaded.version,
                    _recorded(request, None, answer),
                )
                if statement is not None:
                    await run_commit(conn, statement)
            version = loaded.version + (statement is not None)
            self.cache.put(lane, VersionedLane(transition.state, version))
        self._committed(lane, transition)
        return answer

    async def snapshot_outline(self, lane: LaneRef) -> SnapshotOutline:
        """Capture the lane without its transcript's bodies, in one REPEATABLE READ
        transaction: the snapshot, and the transcript's entry ids with their encoded sizes.
        Entries never change once written, so :meth:`entry_bodies` may read them later, a page
        at a time, and still complete exactly this snapshot."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            state = await load_lane(conn, lane, lock=False, with_last_result=True)
            if state is None:
                raise lane_not_found(lane)
            transcript = await load_transcript_index(conn, lane, state.tip_id)
        return SnapshotOutline(capture(state, []), transcript)

    async def entry_bodies(self, lane: LaneRef, entry_ids: Sequence[str]) -> list[bytes]:
        """The encoded entries ``entry_ids`` of the lane, in that order."""
        async with self.pool.connection() as conn:
            return await load_entry_bodies(conn, lane, entry_ids)

    async def snapshot(self, lane: LaneRef) -> snapshot_pb2.LaneSnapshot:
        """Capture the lane, transcript included."""
        return await self.complete_snapshot(lane, await self.snapshot_outline(lane))

    async def complete_snapshot(
        self, lane: LaneRef, outline: SnapshotOutline
    ) -> snapshot_pb2.LaneSnapshot:
        """``outline``'s snapshot with its transcript read in (the outline is used up)."""
        bodies = await self.entry_bodies(lane, [entry_id for entry_id, _ in outline.transcript])
        snapshot = outline.snapshot
        snapshot.transcript.extend(decode(entries_pb2.Entry, body) for body in bodies)
        return snapshot

    async def list_lanes(
        self, namespace: str, page_size: int, after_lane_id: str
    ) -> tuple[list[lane_service_pb2.LaneSummary], str]:
        """The namespace's lanes in id order after ``after_lane_id``; the next page token
        ('' at the end)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                LANE_SCAN + "SELECT l.lane_id, l.revision, l.tip_id, l.current_operation_id,"
                " o.cancel_requested FROM lanes l"
                " LEFT JOIN operations o ON o.namespace = l.namespace AND o.lane_id = l.lane_id"
                "  AND o.operation_id = l.current_operation_id"
                # Code-point order whatever the database's collation, so pages are stable.
                ' WHERE l.namespace = %s AND l.lane_id > %s COLLATE "C"'
                ' ORDER BY l.lane_id COLLATE "C" LIMIT %s',
                (namespace, after_lane_id, page_size + 1),
            )
            rows = await cur.fetchall()
        lanes_found = [
            lane_service_pb2.LaneSummary(
                lane_id=lane_id,
                revision=revision,
                tip_id=tip_id or "",
                operation_id=operation_id or "",
                operation_status=(
                    snapshot_pb2.OPERATION_STATUS_UNSPECIFIED
                    if operation_id is None
                    else snapshot_pb2.OPERATION_STATUS_ABORTING
                    if cancelled
                    else snapshot_pb2.OPERATION_STATUS_OPEN
                ),
            )
            for lane_id, revision, tip_id, operation_id, cancelled in rows[:page_size]
        ]
        next_token = lanes_found[-1].lane_id if len(rows) > page_size else ""
        return lanes_found, next_token

    async def lane_head(self, lane: LaneRef) -> tuple[int, int]:
        """The lane's (head revision, retention floor)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT revision, retention_floor FROM lanes"
                " WHERE namespace = %(ns)s AND lane_id = %(lane)s",
                lane.params,
            )
            row = await cur.fetchone()
        if row is None:
            raise lane_not_found(lane)
        return row[0], row[1]

    async def read_events(self, lane: LaneRef, after_revision: int, limit: int) -> list[EventGroup]:
        """Whole event groups after ``after_revision`` (at least one group when any exists,
        about ``limit`` events at most)."""
        async with self.pool.connection() as conn:
            rows = await load_events(conn, lane, after_revision, limit)
        groups: list[EventGroup] = []
        group_end = None
        for revision, end, body, commit_time in rows:
            if end != group_end:
                groups.append(EventGroup(revision, [], commit_time))
                group_end = end
            groups[-1].bodies.append(body)
        return groups

    async def reconcile_orphans(self, orphan_after: timedelta, limit: int = 100) -> list[str]:
        """End the leased runs no driver holds any more (aborted, or orphaned for
        ``orphan_after``); return their operation ids. Safe to run from every process."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                LANE_SCAN + "SELECT namespace, lane_id, operation_id FROM operations"
                " WHERE lease_token > 0 AND phase <> 'ended'"
                " AND (lease_holder IS NULL OR lease_expires <= now())"
                " ORDER BY lease_expires LIMIT %s",
                (limit,),
            )
            candidates = await cur.fetchall()
        ended: list[str] = []
        for namespace, lane_id, operation_id in candidates:

            def decide(
                state: LaneState, now: datetime, operation_id: str = operation_id
            ) -> tuple[Transition, lane_service_pb2.EndRunResponse]:
                t = reconcile(state, operation_id, now, orphan_after, new_id)
                answer = lane_service_pb2.EndRunResponse(revision=t.state.revision)
                if t.events and t.state.last_result is not None:
                    answer.result.CopyFrom(t.state.last_result)
                return t, answer

            try:
                answer = await self.command(
                    LaneRef(namespace, lane_id), decide, lane_service_pb2.EndRunResponse
                )
            except LaneError as exc:
                # One lane that cannot be ended (corrupt state) must not hold up the others;
                # it stays a candidate, and its reason is logged on every pass.
                log.warning(
                    "cannot reconcile operation %s of lane %s/%s: %s %s",
                    operation_id,
                    namespace,
                    lane_id,
                    exc.reason,
                    exc.message,
                )
                continue
            if answer.HasField("result"):
                ended.append(operation_id)
        return ended

    async def open_operation(self, lane: LaneRef) -> Operation | None:
        """The lane's open operation as stored (no lock)."""
        async with self.pool.connection() as conn:
            state = await load_lane(conn, lane, lock=False)
        if state is None:
            raise lane_not_found(lane)
        return state.operation

    async def entry_exists(self, lane: LaneRef, entry_id: str) -> bool:
        """Whether the lane has the entry (entries are immutable and never deleted)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM entries"
                " WHERE namespace = %(ns)s AND lane_id = %(lane)s AND entry_id = %(entry)s",
                {**lane.params, "entry": entry_id},
            )
            return await cur.fetchone() is not None
