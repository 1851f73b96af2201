"""Wire framing of pre-encoded events and transcript entries.

Events and entries are encoded once, at commit, and stored as bytes. WatchLane sends an event
group by wrapping those bytes in the WatchLaneResponse.event_group / EventGroup.events field
headers, and a snapshot's transcript by wrapping stored entries in the SnapshotHead /
TranscriptChunk headers, so the stream never decodes and re-encodes an event or an entry.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

# The frames' field numbers, from the generated descriptors.
_Response = pb.WatchLaneResponse.DESCRIPTOR
EVENT_GROUP_FIELD = _Response.fields_by_name["event_group"].number
EVENTS_FIELD = pb.EventGroup.DESCRIPTOR.fields_by_name["events"].number
SNAPSHOT_HEAD_FIELD = _Response.fields_by_name["snapshot"].number
TRANSCRIPT_CHUNK_FIELD = _Response.fields_by_name["transcript_chunk"].number
HEAD_SNAPSHOT_FIELD = pb.SnapshotHead.DESCRIPTOR.fields_by_name["snapshot"].number
HEAD_FOLLOWING_CHUNKS_FIELD = pb.SnapshotHead.DESCRIPTOR.fields_by_name["following_chunks"].number
TRANSCRIPT_FIELD = snapshot_pb2.LaneSnapshot.DESCRIPTOR.fields_by_name["transcript"].number
CHUNK_ENTRIES_FIELD = pb.TranscriptChunk.DESCRIPTOR.fields_by_name["entries"].number
_ANSWER_SNAPSHOT_FIELD = pb.GetLaneSnapshotResponse.DESCRIPTOR.fields_by_name["snapshot"].number

_LENGTH_DELIMITED = 2


#: The varints of 0-16,383 (one and two bytes): every tag and most lengths a frame writes.
_SMALL_VARINTS = [
    bytes((value,)) if value < 0x80 else bytes((value & 0x7F | 0x80, value >> 7))
    for value in range(1 << 14)
]


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint."""
    if 0 <= value < 1 << 14:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def delimited_bytes(number: int, payload: int) -> int:
    """The length of field ``number`` holding ``payload`` bytes (length-delimited)."""
    return len(varint(number << 3 | _LENGTH_DELIMITED)) + len(varint(payload)) + payload


def snapshot_answer_bytes(snapshot_bytes: int, entry_sizes: Sequence[int]) -> int:
    """The length of the GetLaneSnapshotResponse holding a snapshot of ``snapshot_bytes``
    bytes without its transcript, and a transcript of entries of ``entry_sizes`` bytes."""
    transcript = sum(delimited_bytes(TRANSCRIPT_FIELD, size) for size in entry_sizes)
    return delimited_bytes(_ANSWER_SNAPSHOT_FIELD, snapshot_bytes + transcript)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` of ``data`` and the position after it. Raises IndexError when
    ``data`` ends inside it, ValueError when it runs past ten bytes."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than ten bytes")


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` (an encoded message, bytes or text)."""
    return varint(number << 3 | _LENGTH_DELIMITED) + varint(len(payload)) + payload


def event_group_frame(bodies: Sequence[bytes]) -> bytes:
    """An encoded WatchLaneResponse whose event_group holds the encoded events ``bodies``."""
    return length_delimited(
        EVENT_GROUP_FIELD, b"".join(length_delimited(EVENTS_FIELD, body) for body in bodies)
    )


def serialize(response: Message | bytes) -> bytes:
    """Response serializer that passes pre-encoded frames through."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def snapshot_head_frame(snapshot: Message, bodies: Sequence[bytes], following_chunks: int) -> bytes:
    """An encoded WatchLaneResponse whose SnapshotHead holds ``snapshot`` (its transcript
    empty) with the encoded entries ``bodies`` as its first transcript entries."""
    transcript = b"".join(length_delimited(TRANSCRIPT_FIELD, body) for body in bodies)
    head = length_delimited(HEAD_SNAPSHOT_FIELD, snapshot.SerializeToString() + transcript)
    if following_chunks:
        head += varint(HEAD_FOLLOWING_CHUNKS_FIELD << 3) + varint(following_chunks)
    return length_delimited(SNAPSHOT_HEAD_FIELD, head)


def transcript_chunk_frame(bodies: Sequence[bytes]) -> bytes:
    """An encoded WatchLaneResponse whose TranscriptChunk holds the encoded entries ``bodies``."""
    return length_delimited(
        TRANSCRIPT_CHUNK_FIELD,
        b"".join(length_delimited(CHUNK_ENTRIES_FIELD, body) for body in bodies),
    )
