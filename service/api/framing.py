"""Wire framing of pre-encoded events and transcript entries.

Events and entries are encoded once, at commit, and stored as bytes. WatchLane sends an event
group by wrapping those bytes in the WatchLaneResponse.event_group / EventGroup.events field
headers, and a snapshot's transcript by wrapping stored entries in the SnapshotHead /
TranscriptChunk headers, so the stream never decodes and re-encodes an event or an entry.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

_LENGTH_DELIMITED = 2
_EVENT_GROUP_FIELD = 3  # WatchLaneResponse.event_group
_EVENTS_FIELD = 1  # EventGroup.events


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def event_group_frame(bodies: Sequence[bytes]) -> bytes:
    """An encoded WatchLaneResponse whose event_group holds the encoded events ``bodies``."""
    return _field(_EVENT_GROUP_FIELD, b"".join(_field(_EVENTS_FIELD, body) for body in bodies))


def serialize(response: Message | bytes) -> bytes:
    """Response serializer that passes pre-encoded frames through."""
    return response if isinstance(response, bytes) else response.SerializeToString()


_SNAPSHOT_HEAD_FIELD = 1  # WatchLaneResponse.snapshot
_TRANSCRIPT_CHUNK_FIELD = 2  # WatchLaneResponse.transcript_chunk
_HEAD_SNAPSHOT_FIELD = 1  # SnapshotHead.snapshot
_HEAD_FOLLOWING_CHUNKS_FIELD = 2  # SnapshotHead.following_chunks (varint)
_TRANSCRIPT_FIELD = 3  # LaneSnapshot.transcript
_CHUNK_ENTRIES_FIELD = 1  # TranscriptChunk.entries


def snapshot_head_frame(snapshot: Message, bodies: Sequence[bytes], following_chunks: int) -> bytes:
    """An encoded WatchLaneResponse whose SnapshotHead holds ``snapshot`` (its transcript
    empty) with the encoded entries ``bodies`` as its first transcript entries."""
    transcript = b"".join(_field(_TRANSCRIPT_FIELD, body) for body in bodies)
    head = _field(_HEAD_SNAPSHOT_FIELD, snapshot.SerializeToString() + transcript)
    if following_chunks:
        head += _varint(_HEAD_FOLLOWING_CHUNKS_FIELD << 3) + _varint(following_chunks)
    return _field(_SNAPSHOT_HEAD_FIELD, head)


def transcript_chunk_frame(bodies: Sequence[bytes]) -> bytes:
    """An encoded WatchLaneResponse whose TranscriptChunk holds the encoded entries ``bodies``."""
    return _field(
        _TRANSCRIPT_CHUNK_FIELD, b"".join(_field(_CHUNK_ENTRIES_FIELD, body) for body in bodies)
    )
