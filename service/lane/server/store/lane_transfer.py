"""A lane's rows out (ExportLane), a page at a time, and a new lane's rows in (ImportLane), in
one transaction each. The file format is the domain's
(``service/lane/server/domain/export_format.py``).

An export reads in one REPEATABLE READ, read-only transaction, so its pages are one consistent
state of the lane, whenever they are read: it holds that transaction, and its connection, for
as long as its client takes to read the file (the write deadline ends a client that stops).
Each page holds rows up to a byte budget (one row beyond it at most), so an export holds a
page of its lane at a time, whatever the lane's size.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, NamedTuple

from psycopg import AsyncConnection

from lane.server.domain.capture import capture
from lane.server.domain.errors import AlreadyExists
from lane.server.domain.export_format import ENTRY, EVENT_GROUP, USAGE_ROW, ExportHead
from lane.server.domain.guards import require_no_operation
from lane.server.store.codec import encode
from lane.server.store.lane_reads import (
    ENTRY_ROWS,
    USAGE_ROWS,
    load_bodies,
    load_events,
    load_lane,
)
from lane.server.store.lane_ref import LaneRef

Conn = AsyncConnection[Any]

_FLOOR = "SELECT retention_floor FROM lanes WHERE namespace = %(ns)s AND lane_id = %(lane)s"
#: Row ids fetched per round trip of an export's index cursors (a few dozen bytes each).
_INDEX_BATCH = 1000
#: Events per page of the event log at most (whole groups; the byte budget is the page's).
_EVENTS_PER_PAGE = 10_000


class ExportPage(NamedTuple):
    """Rows of one record kind (the format's ``ENTRY``, ``USAGE_ROW``, ``EVENT_GROUP``), as
    stored: one list of bodies per record (an entry or usage row: one; an event group: its
    events')."""

    kind: str
    records: list[list[bytes]]

    @property
    def size(self) -> int:
        """The bytes of its bodies."""
        return sum(len(body) for record in self.records for body in record)


async def read_export_head(conn: Conn, lane: LaneRef) -> ExportHead | None:
    """The idle lane's header values and lane record (None when it does not exist); refuses a
    lane with an open operation (LANE_BUSY). Run it in the export's transaction."""
    state = await load_lane(conn, lane, lock=False, with_last_result=True)
    if state is None:
        return None
    require_no_operation(state)
    floor_row = await (await conn.execute(_FLOOR, lane.params)).fetchone()
    assert floor_row is not None
    return ExportHead(lane.lane_id, floor_row[0], capture(state, []))


async def export_pages(
    conn: Conn, lane: LaneRef, page_bytes: int
) -> AsyncGenerator[ExportPage, None]:
    """The lane's entries, usage rows and event groups, in file order, in pages of about
    ``page_bytes`` (run it in the transaction :func:`read_export_head` ran in, and close it
    before that ends: ``contextlib.aclosing``)."""
    for kind, rows in ((ENTRY, ENTRY_ROWS), (USAGE_ROW, USAGE_ROWS)):
        # Closed here, not whenever it is collected: its cursor is the transaction's.
        async with contextlib.aclosing(_row_pages(conn, lane, rows, page_bytes)) as pages:
            async for bodies in pages:
                yield ExportPage(kind, [[body] for body in bodies])
    after = 0
    while True:
        events = await load_events(conn, lane, after, _EVENTS_PER_PAGE, page_bytes)
        if not events:
            return
        groups: list[list[bytes]] = []
        group_end = None
        for _, end, body, _ in events:
            if end != group_end:
                groups.append([])
                group_end = end
            groups[-1].append(body)
        after = events[-1][0]
        del events  # the page holds the bodies now
        yield ExportPage(EVENT_GROUP, groups)


async def _row_pages(
    conn: Conn, lane: LaneRef, rows: tuple[str, str, str], page_bytes: int
) -> AsyncGenerator[list[bytes], None]:
    """The bodies of ``rows`` (lane_reads' ENTRY_ROWS, USAGE_ROWS) in seq order, a page at a
    time: a server-side cursor walks their ids and sizes (one sort, a few dozen bytes a row),
    and each page's bodies are read by id."""
    table, id_column, _ = rows
    index = conn.cursor(name=f"export_{table}")
    try:
        await index.execute(
            f"SELECT {id_column}, octet_length(body) FROM {table}"
            " WHERE namespace = %(ns)s AND lane_id = %(lane)s ORDER BY seq",
            lane.params,
        )
        page: list[str] = []
        size = 0
        while batch := await index.fetchmany(_INDEX_BATCH):
            for row_id, length in batch:
                page.append(row_id)
                size += length
                if size >= page_bytes:
                    yield await load_bodies(conn, lane, page, rows)
                    page, size = [], 0
        if page:
            yield await load_bodies(conn, lane, page, rows)
    finally:
        await index.close()


class ImportBatch(NamedTuple):
    """Rows of one table of an imported lane: each row's columns after the lane's (namespace,
    lane id), as :data:`IMPORT_COLUMNS` lists them."""

    table: str
    rows: list[tuple[Any, ...]]


#: The columns of each table an import fills, after (namespace, lane_id).
IMPORT_COLUMNS = {
    "entries": ("entry_id", "parent_id", "seq", "kind", "body"),
    "usage_rows": ("usage_id", "seq", "body"),
    "events": ("revision", "group_end", "kind", "body", "commit_time"),
}


async def write_import(
    conn: Conn, lane: LaneRef, head: ExportHead, batches: AsyncIterator[ImportBatch]
) -> None:
    """Insert the lane ``head`` describes as ``lane`` (its record already names it), then its
    rows, a batch at a time (each by COPY); refuses a lane id in use (ALREADY_EXISTS
    ``LANE_EXISTS``). Run it in a transaction."""
    snapshot = head.lane
    params = lane.params
    cur = await conn.execute(
        "INSERT INTO lanes (namespace, lane_id, revision, retention_floor, tip_id,"
        " configuration, message_count, usage_totals, faulted, next_inbox_position)"
        " VALUES (%(ns)s, %(lane)s, %(revision)s, %(floor)s, %(tip)s, %(configuration)s,"
        " %(messages)s, %(usage)s, %(faulted)s, %(queued)s)"
        " ON CONFLICT (namespace, lane_id) DO NOTHING",
        {
            **params,
            "revision": snapshot.revision,
            "floor": head.retention_floor,
            "tip": snapshot.tip_id or None,
            "configuration": encode(snapshot.configuration),
            "messages": snapshot.stats.message_count,
            "usage": encode(snapshot.stats.usage),
            "faulted": snapshot.faulted,
            "queued": len(snapshot.queues),
        },
    )
    if cur.rowcount != 1:
        raise AlreadyExists(
            "LANE_EXISTS", f"lane {lane.lane_id} exists already", laneId=lane.lane_id
        )
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO inbox (namespace, lane_id, entry_id, position, body)"
            " VALUES (%(ns)s, %(lane)s, %(entry)s, %(position)s, %(body)s)",
            [
                {**params, "entry": item.entry_id, "position": position, "body": encode(item)}
                for position, item in enumerate(snapshot.queues, 1)
            ],
        )
        async for batch in batches:
            columns = ", ".join(("namespace", "lane_id", *IMPORT_COLUMNS[batch.table]))
            async with cur.copy(f"COPY {batch.table} ({columns}) FROM STDIN") as copy:
                for row in batch.rows:
                    await copy.write_row((*lane, *row))
