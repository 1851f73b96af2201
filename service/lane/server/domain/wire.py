"""Protobuf wire arithmetic: encoded sizes computed from lengths, with every field number taken
from the generated descriptors (never written down here).

The commit rule (``service/lane/server/domain/limits.py``,
``service/lane/server/domain/future_commits.py``) bounds messages the service has not built yet, and
the WatchLane framing (``service/lane/server/api/framing.py``) wraps pre-encoded bodies in field
headers; both take their field numbers and tag sizes from this module, the frames' fields (at the
end) from one list. It lives in the domain because the commit rule, which the store runs, needs it
(layers import only earlier ones).

Sizes here are of the proto3 binary encoding: a length-delimited field is its tag, the
payload's length as a varint, and the payload.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

from google.protobuf import timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from lane.v1 import lane_service_pb2, snapshot_pb2

#: The largest varint a length prefix of anything the service handles needs: every payload is
#: below 2**28 bytes (256 MiB; requests and responses are at most 4 MiB).
MAX_LENGTH_VARINT_BYTES = 4
#: A positive int64 (revisions, sequence numbers) as a varint, at most.
MAX_INT64_VARINT_BYTES = 9
#: The largest commit time the service encodes: 5-byte seconds and 5-byte nanos (any time
#: before the year 3058 has 5-byte seconds).
MAX_TIMESTAMP = datetime(2999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


def varint_bytes(value: int) -> int:
    """The length of ``value`` as a protobuf varint (a negative int64 takes 10 bytes)."""
    if value < 0x80:
        return 1 if value >= 0 else 10
    if value < 0x4000:
        return 2
    if value < 0x200000:
        return 3
    if value < 0x10000000:
        return 4
    return (value.bit_length() + 6) // 7


def _descriptor(message: type[Message] | Descriptor) -> Descriptor:
    if isinstance(message, Descriptor):
        return message
    return cast(Descriptor, message.DESCRIPTOR)


def field(message: type[Message] | Descriptor, name: str) -> FieldDescriptor:
    """The generated descriptor of ``message``'s field ``name``."""
    return _descriptor(message).fields_by_name[name]


def field_number(message: type[Message] | Descriptor, name: str) -> int:
    """The field number of ``message``'s field ``name``."""
    return field(message, name).number


def number_tag_bytes(number: int) -> int:
    """The length of the tag (number and wire type) of field number ``number``."""
    return varint_bytes(number << 3)


def tag_bytes(message: type[Message] | Descriptor, name: str) -> int:
    """The length of the tag (number and wire type) of ``message``'s field ``name``."""
    return number_tag_bytes(field_number(message, name))


def delimited(tag: int, payload: int) -> int:
    """The length of a length-delimited field with a ``tag``-byte tag and ``payload`` bytes."""
    return tag + varint_bytes(payload) + payload


def tag_growth(
    source: type[Message] | Descriptor, target: type[Message] | Descriptor, names: tuple[str, ...]
) -> int:
    """The most bytes one value of the fields ``names`` grows by when copied from ``source``
    into the same-named fields of ``target`` (their tags may differ in length; payloads not)."""
    return max(0, *(tag_bytes(target, name) - tag_bytes(source, name) for name in names))


_FIXED_SCALAR_BYTES = {
    FieldDescriptor.TYPE_DOUBLE: 8,
    FieldDescriptor.TYPE_FLOAT: 4,
    FieldDescriptor.TYPE_FIXED64: 8,
    FieldDescriptor.TYPE_SFIXED64: 8,
    FieldDescriptor.TYPE_FIXED32: 4,
    FieldDescriptor.TYPE_SFIXED32: 4,
    FieldDescriptor.TYPE_BOOL: 1,
}
_VARINT_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_ENUM,
}


def max_fixed_message_bytes(message: type[Message] | Descriptor) -> int:
    """The largest encoding of a message made only of single scalars and such messages (a
    Usage, a Timestamp): every field set to its longest value. Raises ValueError for strings,
    bytes and repeated fields, which have no largest size."""
    descriptor = _descriptor(message)
    size = 0
    for item in descriptor.fields:
        if item.is_repeated:
            raise ValueError(f"{item.full_name} is repeated")
        tag = number_tag_bytes(item.number)
        if item.type == FieldDescriptor.TYPE_MESSAGE:
            assert item.message_type is not None
            size += delimited(tag, max_fixed_message_bytes(item.message_type))
        elif item.type in _VARINT_TYPES:
            size += tag + 10
        elif item.type in _FIXED_SCALAR_BYTES:
            size += tag + _FIXED_SCALAR_BYTES[item.type]
        else:
            raise ValueError(f"{item.full_name} has no largest size")
    return size


def _max_timestamp_bytes() -> int:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(MAX_TIMESTAMP)
    return stamp.ByteSize()


#: A Timestamp of any time the service commits at (at most :data:`MAX_TIMESTAMP`), encoded.
MAX_TIMESTAMP_BYTES = _max_timestamp_bytes()


# -- the WatchLane frames ---------------------------------------------------------------------
#
# The fields WatchLane wraps around pre-encoded events and entries:
# service/lane/server/api/framing.py writes their headers, and the commit rule computes the frames'
# sizes from the same numbers.

_Response = lane_service_pb2.WatchLaneResponse
EVENT_GROUP_FIELD = field_number(_Response, "event_group")
EVENTS_FIELD = field_number(lane_service_pb2.EventGroup, "events")
SNAPSHOT_HEAD_FIELD = field_number(_Response, "snapshot")
TRANSCRIPT_CHUNK_FIELD = field_number(_Response, "transcript_chunk")
HEAD_SNAPSHOT_FIELD = field_number(lane_service_pb2.SnapshotHead, "snapshot")
HEAD_FOLLOWING_CHUNKS_FIELD = field_number(lane_service_pb2.SnapshotHead, "following_chunks")
TRANSCRIPT_FIELD = field_number(snapshot_pb2.LaneSnapshot, "transcript")
CHUNK_ENTRIES_FIELD = field_number(lane_service_pb2.TranscriptChunk, "entries")

_EVENT_GROUP_TAG = number_tag_bytes(EVENT_GROUP_FIELD)
_EVENTS_TAG = number_tag_bytes(EVENTS_FIELD)


def event_field_bytes(event_bytes: int) -> int:
    """The length of one ``event_bytes``-byte HarnessEvent as its field in an EventGroup."""
    return delimited(_EVENTS_TAG, event_bytes)


def event_group_bytes(fields_bytes: int) -> int:
    """The length of the WatchLaneResponse whose event_group holds ``fields_bytes`` of event
    fields (:func:`event_field_bytes`)."""
    return delimited(_EVENT_GROUP_TAG, fields_bytes)
