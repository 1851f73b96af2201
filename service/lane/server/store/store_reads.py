"""The store's reads of a lane: snapshots (whole, or outlined then read a page at a time), the
head and retention floor, where a resumed watch stands, the event log, lane summaries. None
takes the lane's row lock or writes; :class:`~lane.server.store.lane_store.Store` holds them as
one of its parts and offers them as its own methods."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from lane.v1 import entries_pb2, snapshot_pb2
from psycopg_pool import AsyncConnectionPool

from lane.server import metrics
from lane.server.domain.capture import capture
from lane.server.domain.errors import NotFound
from lane.server.domain.state import Operation
from lane.server.store.codec import decode
from lane.server.store.event_log import EventGroup
from lane.server.store.lane_reads import (
    load_bodies,
    load_events,
    load_events_of,
    load_lane,
    load_transcript_index,
)
from lane.server.store.lane_ref import LANE_SCAN, LaneRef
from lane.server.store.lane_summaries import (
    ActivityPosition,
    LaneFilter,
    SummaryRow,
    read_heads,
    read_summaries,
)


class SnapshotOutline(NamedTuple):
    """A lane's snapshot with an empty transcript, and its transcript as (entry id, encoded
    size) pairs, oldest first."""

    snapshot: snapshot_pb2.LaneSnapshot
    transcript: list[tuple[str, int]]


class ResumePoint(NamedTuple):
    """Where a watch resuming after a revision stands (:meth:`Store.resume_point`)."""

    head: int
    floor: int
    #: (first, last) revisions of the event group the revision is inside of; None when it is a
    #: group boundary (the end of a group, the floor, or the head).
    inside_group: tuple[int, int] | None
    #: The lane's incarnation (which lane of the id this is).
    incarnation: int


class LaneHead(NamedTuple):
    """A lane's head revision and incarnation (:meth:`Store.lane_heads`)."""

    revision: int
    incarnation: int


class IncarnationGone(Exception):
    """The lane incarnation a read followed was deleted (the lane is gone, or was created again
    under its id): what the read found belongs to no lane it followed."""

    def __init__(self, lane: LaneRef, incarnation: int) -> None:
        super().__init__(f"lane {lane.lane_id} incarnation {incarnation} was deleted")
        self.lane = lane
        self.incarnation = incarnation


# The lane's head and floor; and, when the event at %(after)s is not its group's last, its
# group's end and the revision before the group (the previous group's last event, found by
# scanning back at most one group's events).
_RESUME_POINT = (
    "SELECT l.revision, l.retention_floor, l.incarnation, e.group_end,"
    " (SELECT coalesce(max(p.revision), l.retention_floor) FROM events p"
    "   WHERE p.namespace = l.namespace AND p.lane_id = l.lane_id"
    "   AND p.revision <= %(after)s AND p.group_end < e.group_end)"
    " FROM lanes l LEFT JOIN events e"
    "   ON e.namespace = l.namespace AND e.lane_id = l.lane_id AND e.revision = %(after)s"
    " WHERE l.namespace = %(ns)s AND l.lane_id = %(lane)s"
)


def lane_not_found(lane: LaneRef) -> NotFound:
    """The refusal for a lane that does not exist (in the caller's namespace: a lane of
    another namespace gets exactly this answer)."""
    return NotFound("LANE_NOT_FOUND", f"lane {lane.lane_id} does not exist", laneId=lane.lane_id)


class StoreReads:
    """The lane reads of :class:`~lane.server.store.lane_store.Store` (module docstring)."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        #: Reads of the event log by this store (:meth:`read_events`); also counted, for all
        #: stores of the process, by ``lane_event_log_reads_total``.
        self.event_log_reads = 0

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
        snapshot = capture(state, [])
        snapshot.incarnation = str(state.incarnation)
        return SnapshotOutline(snapshot, transcript)

    async def entry_bodies(self, lane: LaneRef, entry_ids: Sequence[str]) -> list[bytes]:
        """The encoded entries ``entry_ids`` of the lane, in that order."""
        async with self.pool.connection() as conn:
            return await load_bodies(conn, lane, entry_ids)

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

    async def lane_summaries(
        self,
        namespace: str,
        lanes: LaneFilter,
        limit: int,
        *,
        after_id: str = "",
        after_activity: ActivityPosition | None = None,
        by_activity: bool = False,
    ) -> list[SummaryRow]:
        """Up to ``limit`` summaries of the namespace's lanes that ``lanes`` admits, in id order
        after ``after_id`` or, ``by_activity``, the most recently active first after
        ``after_activity`` (``lane_summaries.read_summaries``)."""
        async with self.pool.connection() as conn:
            return await read_summaries(
                conn,
                namespace,
                lanes,
                limit,
                after_id=after_id,
                after_activity=after_activity,
                by_activity=by_activity,
            )

    async def namespace_heads(
        self, namespace: str, prefixes: Collection[str] | None, lane_ids: Collection[str]
    ) -> dict[str, tuple[int, int]]:
        """The (incarnation, revision) of the namespace's lanes, all or those named by prefix
        or id, in one statement (``lane_summaries.read_heads``)."""
        async with self.pool.connection() as conn:
            return await read_heads(conn, namespace, prefixes, lane_ids)

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

    async def resume_point(self, lane: LaneRef, after_revision: int) -> ResumePoint:
        """Where a watch resuming after ``after_revision`` stands: the lane's head and
        retention floor, and the group ``after_revision`` is inside of, if it is inside one."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_RESUME_POINT, {**lane.params, "after": after_revision})
            row = await cur.fetchone()
        if row is None:
            raise lane_not_found(lane)
        head, floor, incarnation, group_end, before_group = row
        inside = group_end is not None and group_end != after_revision
        group = (before_group + 1, group_end) if inside else None
        return ResumePoint(head, floor, group, incarnation)

    async def lane_heads(self, lanes: Iterable[LaneRef]) -> dict[LaneRef, LaneHead]:
        """The head revisions and incarnations of ``lanes``, in one statement (lanes that do
        not exist are left out)."""
        lanes = list(lanes)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                LANE_SCAN + "SELECT l.namespace, l.lane_id, l.revision, l.incarnation"
                " FROM unnest(%s::text[], %s::text[]) AS w(namespace, lane_id)"
                " JOIN lanes l USING (namespace, lane_id)",
                ([lane.namespace for lane in lanes], [lane.lane_id for lane in lanes]),
            )
            rows = await cur.fetchall()
        return {
            LaneRef(namespace, lane_id): LaneHead(revision, incarnation)
            for namespace, lane_id, revision, incarnation in rows
        }

    async def read_events(
        self,
        lane: LaneRef,
        after_revision: int,
        limit: int,
        max_bytes: int,
        incarnation: int | None = None,
    ) -> list[EventGroup]:
        """Whole event groups after ``after_revision``: at least one group when any exists,
        then more while they start within ``limit`` events and ``max_bytes`` bytes (so the read
        holds at most ``max_bytes`` plus one group). Counted in :attr:`event_log_reads`.

        With ``incarnation``, the events are those of that incarnation of the lane, or
        :class:`IncarnationGone` is raised: the lane's row is read after its events (in the same
        round trip), and an incarnation that still exists then existed when the events were
        read, since a deleted one never comes back."""
        self.event_log_reads += 1
        metrics.current.event_log_reads.inc()
        async with self.pool.connection() as conn:
            if incarnation is None:
                rows = await load_events(conn, lane, after_revision, limit, max_bytes)
            else:
                rows, now = await load_events_of(conn, lane, after_revision, limit, max_bytes)
                if now != incarnation:
                    raise IncarnationGone(lane, incarnation)
        groups: list[EventGroup] = []
        group_end = None
        for revision, end, body, commit_time in rows:
            if end != group_end:
                groups.append(EventGroup(revision, [], commit_time))
                group_end = end
            groups[-1].bodies.append(body)
        return groups

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
