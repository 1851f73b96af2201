"""Wire framing of pre-encoded events.

Events are encoded once, at commit, and stored as bytes. A WatchLane event group is sent by
wrapping those bytes in the WatchLaneResponse.event_group / EventGroup.events field headers, so
the stream never decodes and re-encodes an event.
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
