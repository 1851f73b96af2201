"""The database reads of WatchLane and WatchLanes streams, a few at a time per process.

A watcher reads the database when it attaches (a snapshot, or the resume point), and when it
catches up from the event log; afterwards the hub feeds it from memory. Thousands of watchers
attaching at once (clients reconnecting after a restart) would otherwise take every pooled
connection and starve commands, or wait past the pool's checkout timeout and be refused
DATABASE_BUSY. Here they queue instead, each stream admitted in its turn: its read runs when
one of ``limit`` places is free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from lane.server.store import (
    EventGroup,
    LaneFilter,
    LaneRef,
    ResumePoint,
    SnapshotOutline,
    Store,
    SummaryRow,
)


class WatcherReads:
    """The store reads a watcher makes, at most ``limit`` of them at once in this process."""

    def __init__(self, store: Store, limit: int) -> None:
        self._store = store
        self._places = asyncio.Semaphore(limit)

    async def resume_point(self, lane: LaneRef, after_revision: int) -> ResumePoint:
        """See :meth:`Store.resume_point`."""
        async with self._places:
            return await self._store.resume_point(lane, after_revision)

    async def lane_head(self, lane: LaneRef) -> tuple[int, int]:
        """See :meth:`Store.lane_head`."""
        async with self._places:
            return await self._store.lane_head(lane)

    async def read_events(
        self, lane: LaneRef, after_revision: int, limit: int, max_bytes: int, incarnation: int
    ) -> list[EventGroup]:
        """See :meth:`Store.read_events` (the events of ``incarnation``)."""
        async with self._places:
            return await self._store.read_events(
                lane, after_revision, limit, max_bytes, incarnation
            )

    async def snapshot_outline(self, lane: LaneRef) -> SnapshotOutline:
        """See :meth:`Store.snapshot_outline`."""
        async with self._places:
            return await self._store.snapshot_outline(lane)

    async def entry_bodies(self, lane: LaneRef, entry_ids: Sequence[str]) -> list[bytes]:
        """See :meth:`Store.entry_bodies`."""
        async with self._places:
            return await self._store.entry_bodies(lane, entry_ids)

    async def lane_summaries(
        self, namespace: str, lanes: LaneFilter, limit: int, after_id: str
    ) -> list[SummaryRow]:
        """See :meth:`Store.lane_summaries` (in id order)."""
        async with self._places:
            return await self._store.lane_summaries(namespace, lanes, limit, after_id=after_id)
