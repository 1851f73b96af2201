"""WatchLane: one snapshot, then every event group committed after it, then heartbeats.

The watcher subscribes to the hub *before* capturing, then reads its lane's event log from the
snapshot's revision on every doorbell. It reads only after its previous write went out, so its
buffer is one read batch, and commits never wait for it. A watcher whose client stops reading
is cut off after the write deadline with RESOURCE_EXHAUSTED naming its last delivered revision.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import code_pb2
from lane.v1 import lane_service_pb2 as pb

from service.api.errors import status_of
from service.api.framing import event_group_frame
from service.domain.errors import OutOfRange
from service.hub import Hub
from service.store import Store


@dataclass(frozen=True)
class WatchSettings:
    """Published watch limits."""

    heartbeat_seconds: float = 10.0
    write_deadline_seconds: float = 30.0
    #: Events read per batch (whole commit groups, so a batch may run over).
    read_batch: int = 500
    #: Transcript bytes per snapshot message.
    chunk_bytes: int = 1 << 20


def snapshot_messages(snapshot: Any, chunk_bytes: int) -> list[pb.WatchLaneResponse]:
    """The snapshot head plus transcript chunks of about ``chunk_bytes`` each."""
    chunks: list[list[Any]] = [[]]
    size = 0
    for entry in snapshot.transcript:
        entry_size = entry.ByteSize()
        if chunks[-1] and size + entry_size > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += entry_size
    head = pb.SnapshotHead(snapshot=snapshot, following_chunks=len(chunks) - 1)
    del head.snapshot.transcript[:]
    head.snapshot.transcript.extend(chunks[0])
    return [pb.WatchLaneResponse(snapshot=head)] + [
        pb.WatchLaneResponse(transcript_chunk=pb.TranscriptChunk(entries=chunk))
        for chunk in chunks[1:]
    ]


class WatcherGone(Exception):
    """The client cancelled or the connection dropped: stop quietly."""


async def _write(
    context: grpc.aio.ServicerContext[Any, Any],
    message: pb.WatchLaneResponse | bytes,
    settings: WatchSettings,
    revision: int,
) -> None:
    try:
        await asyncio.wait_for(context.write(message), settings.write_deadline_seconds)
        return
    except TimeoutError:
        pass  # the client stopped reading: cut it off below, outside this handler
    except Exception as exc:
        # grpcio raises an internal error type when the peer is already gone.
        raise WatcherGone from exc
    await _end(
        context,
        status_of(
            code_pb2.RESOURCE_EXHAUSTED,
            "WATCHER_TOO_SLOW",
            f"the watcher did not read for {settings.write_deadline_seconds}s; resume after the "
            f"last revision received (the stream had delivered at least revision {revision})",
            {"lastRevision": str(revision)},
        ),
    )


async def _end(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> None:
    """End the stream with ``status`` (raises grpc's AbortError, as an abort does)."""
    try:
        await context.abort_with_status(status)
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        # The status cannot be sent: the peer is gone or a write is still stuck.
        raise WatcherGone from exc


async def watch_lane(
    store: Store,
    hub: Hub,
    request: pb.WatchLaneRequest,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
) -> None:
    """Serve one WatchLane stream until the client leaves or the server stops."""
    try:
        await _serve(store, hub, request, context, settings)
    except WatcherGone:
        return


async def _serve(
    store: Store,
    hub: Hub,
    request: pb.WatchLaneRequest,
    context: grpc.aio.ServicerContext[Any, Any],
    settings: WatchSettings,
) -> None:
    lane_id = request.lane_id
    with hub.subscribe(lane_id) as subscription:
        if request.HasField("after_revision"):
            revision = request.after_revision
            head, floor = await store.lane_head(lane_id)
            if not floor <= revision <= head:
                raise _out_of_range(lane_id, revision, floor, head)
        else:
            snapshot = await store.snapshot(lane_id)
            revision = snapshot.revision
            for message in snapshot_messages(snapshot, settings.chunk_bytes):
                await _write(context, message, settings, revision)
        subscription.revision = revision
        while not hub.closing:
            groups = await store.read_events(lane_id, revision, settings.read_batch)
            for first, bodies in groups:
                if first != revision + 1:
                    # Retention removed events this watcher had not read yet.
                    head, floor = await store.lane_head(lane_id)
                    raise _out_of_range(lane_id, revision, floor, head)
                await _write(context, event_group_frame(bodies), settings, revision)
                revision += len(bodies)
                subscription.revision = revision
            if groups:
                continue
            if not await subscription.wait(settings.heartbeat_seconds) and not hub.closing:
                heartbeat = pb.WatchLaneResponse(heartbeat=pb.Heartbeat(head_revision=revision))
                await _write(context, heartbeat, settings, revision)
        await _end(
            context,
            status_of(
                code_pb2.UNAVAILABLE,
                "SERVER_SHUTTING_DOWN",
                f"the server is shutting down; resume after revision {revision}",
                {"lastRevision": str(revision)},
            ),
        )


def _out_of_range(lane_id: str, revision: int, floor: int, head: int) -> OutOfRange:
    return OutOfRange(
        "REVISION_OUT_OF_RANGE",
        f"cannot resume lane {lane_id} after revision {revision}: events are kept after "
        f"revision {floor} up to the head {head}",
        laneId=lane_id,
        afterRevision=revision,
        floor=floor,
        head=head,
    )
