"""A lane's rows out (ExportLane) and a new lane's rows in (ImportLane), each in one
transaction. The file format is the domain's (``service/lane/server/domain/export_format.py``)."""

from __future__ import annotations

import asyncio
from datetime import UTC
from typing import Any

from lane.v1 import entries_pb2, events_pb2
from psycopg import AsyncConnection

from lane.server.domain.capture import capture
from lane.server.domain.errors import AlreadyExists
from lane.server.domain.export_format import LaneExport
from lane.server.domain.guards import require_no_operation
from lane.server.store.codec import decode, encode
from lane.server.store.lane_reads import load_lane
from lane.server.store.lane_ref import LaneRef

Conn = AsyncConnection[Any]

_ENTRIES = "SELECT body FROM entries WHERE namespace = %(ns)s AND lane_id = %(lane)s ORDER BY seq"
_USAGE_ROWS = (
    "SELECT body FROM usage_rows WHERE namespace = %(ns)s AND lane_id = %(lane)s ORDER BY seq"
)
_EVENTS = (
    "SELECT group_end, body FROM events WHERE namespace = %(ns)s AND lane_id = %(lane)s"
    " ORDER BY revision"
)
_FLOOR = "SELECT retention_floor FROM lanes WHERE namespace = %(ns)s AND lane_id = %(lane)s"


async def read_export(conn: Conn, lane: LaneRef) -> LaneExport | None:
    """The idle lane's rows as an export (None when it does not exist); refuses a lane with an
    open operation (LANE_BUSY). Run it in a REPEATABLE READ transaction."""
    state = await load_lane(conn, lane, lock=False, with_last_result=True)
    if state is None:
        return None
    require_no_operation(state)
    params = lane.params
    floor_row = await (await conn.execute(_FLOOR, params)).fetchone()
    assert floor_row is not None
    export = LaneExport(lane.lane_id, floor_row[0], capture(state, []))
    # Binary rows (bytea as text is hex, twice the bytes to parse), decoded in a worker
    # thread: a long lane is many thousands of messages, which would hold the event loop.
    entries = await (await conn.execute(_ENTRIES, params, binary=True)).fetchall()
    usage_rows = await (await conn.execute(_USAGE_ROWS, params, binary=True)).fetchall()
    events = await (await conn.execute(_EVENTS, params, binary=True)).fetchall()
    await asyncio.to_thread(_fill, export, entries, usage_rows, events)
    return export


def _fill(
    export: LaneExport,
    entries: list[tuple[bytes]],
    usage_rows: list[tuple[bytes]],
    events: list[tuple[int, bytes]],
) -> None:
    """Decode the rows into ``export``: its entries, usage rows and event groups."""
    export.entries = [decode(entries_pb2.Entry, body) for (body,) in entries]
    export.usage_rows = [decode(events_pb2.UsageRow, body) for (body,) in usage_rows]
    group_end = None
    for end, body in events:
        if end != group_end:
            export.event_groups.append([])
            group_end = end
        export.event_groups[-1].append(decode(events_pb2.HarnessEvent, body))


async def write_import(conn: Conn, lane: LaneRef, export: LaneExport) -> None:
    """Insert the lane ``export`` describes as ``lane`` (its events already name it); refuses a
    lane id in use (ALREADY_EXISTS ``LANE_EXISTS``). Run it in a transaction."""
    snapshot = export.lane
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
            "floor": export.retention_floor,
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
            " VALUES (%s, %s, %s, %s, %s)",
            [
                (*lane, item.entry_id, position, encode(item))
                for position, item in enumerate(snapshot.queues, 1)
            ],
        )
        await cur.executemany(
            "INSERT INTO entries (namespace, lane_id, entry_id, parent_id, seq, kind, body)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (*lane, e.id, e.parent_id or None, e.seq, e.WhichOneof("payload"), encode(e))
                for e in export.entries
            ],
        )
        await cur.executemany(
            "INSERT INTO usage_rows (namespace, lane_id, usage_id, seq, body)"
            " VALUES (%s, %s, %s, %s, %s)",
            [(*lane, row.id, row.seq, encode(row)) for row in export.usage_rows],
        )
        await cur.executemany(
            "INSERT INTO events (namespace, lane_id, revision, group_end, kind, body, commit_time)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    *lane,
                    event.revision,
                    group[-1].revision,
                    event.WhichOneof("kind"),
                    encode(event),
                    event.commit_time.ToDatetime(tzinfo=UTC),
                )
                for group in export.event_groups
                for event in group
            ],
        )
