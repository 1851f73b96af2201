"""ExportLane and ImportLane: a lane's export file out in pieces, and in as a new lane.

The file format is the domain's (export_format.py, docs/export-format.md). An import is read
whole (at most :data:`MAX_IMPORT_BYTES`), parsed and checked — the file's structure by the
domain, every message's content here as a request's content is checked — before anything is
written, then written in one transaction: a bad file creates nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from google.protobuf.message import DecodeError
from grpc_status import rpc_status
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server import logs
from lane.server.api import validation as v
from lane.server.api.auth import caller_namespace
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call, Context
from lane.server.api.errors import error_answer, unary
from lane.server.api.fair_shares import holding
from lane.server.commands import transfer
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.export_format import LaneExport, read_export
from lane.server.store import LaneRef

#: Bytes of one ExportLaneResponse's piece of the file.
EXPORT_PIECE_BYTES = 1 << 20
#: The largest export file ImportLane takes (it is held in memory while it is checked).
MAX_IMPORT_BYTES = 64 << 20


def check_import(export: LaneExport) -> None:
    """Refuse an export whose messages a request could not carry: ids, enum values, JSON text
    and payload sizes are checked as in requests (INVALID_ARGUMENT with the usual reasons)."""
    lane = export.lane
    v.check_message(lane.configuration, "lane.configuration")
    v.check_message(lane.stats, "lane.stats")
    if lane.tip_id:
        v.require_id(lane.tip_id, "lane.tip_id")
    for n, item in enumerate(lane.queues):
        v.require_id(item.entry_id, f"lane.queues[{n}].entry_id")
        v.check_message(item, f"lane.queues[{n}]")
        holds = "custom" if item.kind == snapshot_pb2.QUEUE_KIND_WRITE else "message"
        v.require(
            item.WhichOneof("item") == holds,
            "INVALID_MESSAGE",
            f"lane.queues[{n}] holds the wrong kind of item for its queue",
            f"lane.queues[{n}]",
        )
    for entry in export.entries:
        v.require_id(entry.id, f"entry {entry.id}")
        v.check_message(entry, f"entry {entry.id}")
    for row in export.usage_rows:
        v.require_id(row.id, f"usage row {row.id}")
        v.check_message(row, f"usage row {row.id}")
    for group in export.event_groups:
        for event in group:
            v.check_message(event, f"event {event.revision}")


async def _file(requests: AsyncIterator[bytes]) -> tuple[str, bytes]:
    """The new lane's id (from the first message) and the whole file."""
    lane_id = ""
    pieces: list[bytes] = []
    size = 0
    first = True
    async for data in requests:
        try:
            request = pb.ImportLaneRequest.FromString(data)
        except DecodeError:
            raise InvalidArgument(
                "MALFORMED_REQUEST", "a message is not a valid ImportLaneRequest"
            ) from None
        if first:
            lane_id, first = request.lane_id, False
        elif request.lane_id:
            raise InvalidArgument(
                "INVALID_ID", "only the first message names the lane", field="lane_id"
            )
        size += len(request.data)
        if size > MAX_IMPORT_BYTES:
            raise v.payload_too_large("data", size, MAX_IMPORT_BYTES)
        pieces.append(request.data)
    v.require_id(lane_id, "lane_id")
    return lane_id, b"".join(pieces)


def _next_piece(lines: Iterator[bytes]) -> bytes:
    """The next piece of the export file: whole lines, at least EXPORT_PIECE_BYTES of them
    unless the file ends first (empty: it has ended)."""
    piece = bytearray()
    for line in lines:
        piece += line
        if len(piece) >= EXPORT_PIECE_BYTES:
            break
    return bytes(piece)


def _read_checked(data: bytes) -> LaneExport:
    """The export file ``data`` parsed and checked (a refusal raises)."""
    export = read_export(data)
    check_import(export)
    return export


class TransferRpcs(ServicerBase):
    """ExportLane and ImportLane (module docstring)."""

    @unary
    @holding("transfer_shares")  # TOO_MANY_TRANSFERS past a cap
    async def ExportLane(self, request: pb.ExportLaneRequest, call: Call) -> None:
        lane = self.lane(request.lane_id)
        lines = await transfer.export_lane(self.store, lane)
        # Encoding the file is Python at some 50 MB/s: each piece is made in a worker thread,
        # so a large lane's export does not hold the event loop.
        while piece := await asyncio.to_thread(_next_piece, lines):
            await call.context.write(pb.ExportLaneResponse(data=piece))

    @holding("transfer_shares")  # TOO_MANY_TRANSFERS past a cap
    async def ImportLane(self, requests: AsyncIterator[bytes], context: Context) -> Any:
        refusal = self.authenticator.admit(context.invocation_metadata())
        if refusal is not None:
            await context.abort_with_status(refusal)
        logs.bind(namespace=caller_namespace())
        try:
            lane_id, data = await _file(requests)
            lane = LaneRef(caller_namespace(), lane_id)
            logs.bind(lane_id=lane_id)
            # Up to 64 MiB of JSON to parse and check: in a worker thread, off the event loop.
            export = await asyncio.to_thread(_read_checked, data)
            del data
            return (await transfer.import_lane(self.store, lane, export)).to_proto()
        except Exception as exc:
            status, _ = error_answer(exc)
            await context.abort_with_status(rpc_status.to_status(status))
