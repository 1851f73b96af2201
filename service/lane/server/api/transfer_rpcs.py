"""ExportLane and ImportLane: a lane's export file out in pieces, and in as a new lane.

The file format is the domain's (export_format.py, docs/export-format.md); both directions
stream in bounded memory (commands/transfer.py).

**ExportLane** writes each piece (at most :data:`EXPORT_PIECE_BYTES`, whole lines unless a
line is longer) only once the client took the previous one, under the watchers' write
deadline (``LANE_WATCH_WRITE_DEADLINE_SECONDS``, write_deadline.py): a client that takes
nothing for that long is ended RESOURCE_EXHAUSTED ``EXPORT_TOO_SLOW``, its snapshot and
connection given back first. A client that leaves ends the export with one INFO line.

**ImportLane** checks the file as it arrives — its structure by the domain, every message's
content here as a request's content is checked — and writes nothing until the whole file
(at most :data:`MAX_IMPORT_BYTES`) is checked; then all of it in one transaction: a bad file
creates nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from google.rpc import code_pb2
from grpc_status import rpc_status
from lane.v1 import entries_pb2, events_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server import logs
from lane.server.api import validation as v
from lane.server.api.auth import caller_namespace
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call, Context
from lane.server.api.errors import error_answer, status_of, unary
from lane.server.api.fair_shares import holding
from lane.server.api.write_deadline import DeadlinePassed, WriteDeadline, end_cut_off
from lane.server.commands import transfer
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.export_format import Record
from lane.server.store import LaneRef

log = logging.getLogger(__name__)

#: The most bytes of the file one ExportLaneResponse carries.
EXPORT_PIECE_BYTES = 1 << 20
#: The largest export file ImportLane takes.
MAX_IMPORT_BYTES = 64 << 20


def check_record(record: Record) -> None:
    """Refuse a record whose messages a request could not carry: ids, enum values, JSON text
    and payload sizes are checked as in requests (INVALID_ARGUMENT with the usual reasons)."""
    kind, message = record
    if isinstance(message, snapshot_pb2.LaneSnapshot):
        v.check_message(message.configuration, "lane.configuration")
        v.check_message(message.stats, "lane.stats")
        if message.tip_id:
            v.require_id(message.tip_id, "lane.tip_id")
        for n, item in enumerate(message.queues):
            v.require_id(item.entry_id, f"lane.queues[{n}].entry_id")
            v.check_message(item, f"lane.queues[{n}]")
            holds = "custom" if item.kind == snapshot_pb2.QUEUE_KIND_WRITE else "message"
            v.require(
                item.WhichOneof("item") == holds,
                "INVALID_MESSAGE",
                f"lane.queues[{n}] holds the wrong kind of item for its queue",
                f"lane.queues[{n}]",
            )
    elif isinstance(message, entries_pb2.Entry):
        v.require_id(message.id, f"entry {message.id}")
        v.check_message(message, f"entry {message.id}")
    elif isinstance(message, events_pb2.UsageRow):
        v.require_id(message.id, f"usage row {message.id}")
        v.check_message(message, f"usage row {message.id}")
    else:
        assert isinstance(message, list), kind
        for event in message:
            v.check_message(event, f"event {event.revision}")


class ClientLeft(Exception):
    """The export's client cancelled or its connection dropped: stop quietly."""


async def _pieces(requests: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, bytes]]:
    """Each ImportLaneRequest's lane id (the first's only) and data, decoded, the file's size
    within :data:`MAX_IMPORT_BYTES`."""
    size = 0
    first = True
    async for data in requests:
        try:
            request = pb.ImportLaneRequest.FromString(data)
        except DecodeError:
            raise InvalidArgument(
                "MALFORMED_REQUEST", "a message is not a valid ImportLaneRequest"
            ) from None
        if not first and request.lane_id:
            raise InvalidArgument(
                "INVALID_ID", "only the first message names the lane", field="lane_id"
            )
        first = False
        size += len(request.data)
        if size > MAX_IMPORT_BYTES:
            raise v.payload_too_large("data", size, MAX_IMPORT_BYTES)
        yield request.lane_id, request.data


#: How long, and how many bytes, a refused import's client may go on sending before its
#: refusal is sent anyway (see :func:`_drain`).
DRAIN_SECONDS = 1.0


async def _drain(requests: AsyncIterator[bytes], seconds: float = DRAIN_SECONDS) -> None:
    """Read, and drop, what the client still sends of an import refused before its end, for at
    most ``seconds`` and :data:`MAX_IMPORT_BYTES`. A call ended while its client is still
    writing makes that client's write fail, and gRPC's Python client then reports INTERNAL
    ("Internal error from Core") instead of the refusal the service sent."""
    taken = 0
    try:
        async with asyncio.timeout(seconds):
            async for data in requests:
                taken += len(data)
                if taken > MAX_IMPORT_BYTES:
                    return
    except Exception:
        return  # the stream's own end: cancelled, timed out or broken


async def _send(
    context: Any,
    blobs: AsyncIterator[bytes],
    deadline: WriteDeadline,
    held: transfer.TransferUsage,
) -> None:
    """Write the file's ``blobs`` (whole lines) in pieces of at most EXPORT_PIECE_BYTES, cut at
    a line's end when one is in the piece, each once the client took the one before."""
    pending = bytearray()
    try:
        async for blob in blobs:
            held.hold(len(blob))
            pending += blob
            del blob
            while len(pending) >= EXPORT_PIECE_BYTES:
                await _write_piece(context, pending, deadline, held)
        while pending:
            await _write_piece(context, pending, deadline, held)
    finally:
        held.release(len(pending))


async def _write_piece(
    context: Any, pending: bytearray, deadline: WriteDeadline, held: transfer.TransferUsage
) -> None:
    """Write the next piece of ``pending`` (taken off it)."""
    end = pending.rfind(b"\n", 0, EXPORT_PIECE_BYTES) + 1 or min(len(pending), EXPORT_PIECE_BYTES)
    piece = bytes(pending[:end])
    del pending[:end]
    try:
        await deadline.write(context, pb.ExportLaneResponse(data=piece))
    except DeadlinePassed:
        raise
    except Exception as exc:
        # grpcio raises an internal error type when the peer is already gone.
        raise ClientLeft from exc
    finally:
        held.release(end)


class TransferRpcs(ServicerBase):
    """ExportLane and ImportLane (module docstring)."""

    @unary
    @holding("transfer_shares")  # TOO_MANY_TRANSFERS past a cap
    async def ExportLane(self, request: pb.ExportLaneRequest, call: Call) -> None:
        lane = self.lane(request.lane_id)
        deadline = self.write_deadline
        seconds = self.watch_settings.write_deadline_seconds
        try:
            # The transaction waits for the client at most a write deadline between reads.
            async with transfer.exporting(self.store, lane, seconds + 30, self.transfers) as blobs:
                await _send(call.context, blobs, deadline, self.transfers)
        except ClientLeft:
            log.info("ExportLane of lane %s ended early: the client left", lane.lane_id)
            return
        except asyncio.CancelledError:
            # No fault here either: one line, no traceback.
            why = "the client cancelled, or the server is stopping"
            log.info("ExportLane of lane %s ended early: %s", lane.lane_id, why)
            raise
        except DeadlinePassed:
            # Out of the export: its snapshot, connection and pieces are given back already.
            status = status_of(
                code_pb2.RESOURCE_EXHAUSTED,
                "EXPORT_TOO_SLOW",
                f"the client did not read the export of lane {lane.lane_id} for {seconds:g}s",
                {"laneId": lane.lane_id},
            )
            try:
                await end_cut_off(call.context, status)
            except grpc.aio.AbortError:
                raise
            except Exception:
                return  # the status cannot be sent: the client is gone

    @holding("transfer_shares")  # TOO_MANY_TRANSFERS past a cap
    async def ImportLane(self, requests: AsyncIterator[bytes], context: Context) -> Any:
        refusal = self.authenticator.admit(context.invocation_metadata())
        if refusal is not None:
            await context.abort_with_status(refusal)
        logs.bind(namespace=caller_namespace())
        try:
            return await self._import(_pieces(requests))
        except Exception as exc:
            status, _ = error_answer(exc)
            await _drain(requests)
            await context.abort_with_status(rpc_status.to_status(status))

    async def _import(self, pieces: AsyncIterator[tuple[str, bytes]]) -> pb.ImportLaneResponse:
        lane_id, data = await anext(pieces, ("", b""))
        v.require_id(lane_id, "lane_id")
        logs.bind(lane_id=lane_id)
        lane = LaneRef(caller_namespace(), lane_id)
        lane_import = transfer.LaneImport(lane, check_record, self.transfers)
        try:
            while True:
                lines = lane_import.received(data)
                if lines:
                    # Parsing is Python at tens of MB/s: in a worker thread, off the event loop.
                    await asyncio.to_thread(lane_import.check, lines)
                piece = await anext(pieces, None)
                if piece is None:
                    break
                _, data = piece
            await asyncio.to_thread(lane_import.check, lane_import.rest())
            return await transfer.import_lane(self.store, lane_import)
        finally:
            lane_import.close()
