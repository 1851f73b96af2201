"""Messages over the message limit, sent as consecutive ``part`` frames (lane.v1.MessagePart).

A WatchLaneResponse or DriveLaneResponse whose encoding is larger than the limit goes as
several messages of the same type, each holding only its ``part`` field: a MessagePart with the
next bytes of the whole encoding and ``continues`` set on all but the last. The client joins the
parts and reads the whole message. Each frame is at most the limit, byte for byte; the parts
are as large as that allows, so a message of n bytes takes about n / limit frames.

A message within the limit is returned as it is: the common path costs one length check.
"""

from __future__ import annotations

from collections.abc import Iterator

from lane.limits import MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.framing import varint

_LENGTH_DELIMITED = 2
_PART = pb.MessagePart.DESCRIPTOR
_DATA_TAG = varint(_PART.fields_by_name["data"].number << 3 | _LENGTH_DELIMITED)
#: ``continues = true``: its tag (varint wire type) and the value 1.
_CONTINUES = varint(_PART.fields_by_name["continues"].number << 3) + b"\x01"
#: The field number of ``part`` in WatchLaneResponse and in DriveLaneResponse.
WATCH_PART_FIELD = pb.WatchLaneResponse.DESCRIPTOR.fields_by_name["part"].number
DRIVE_PART_FIELD = pb.DriveLaneResponse.DESCRIPTOR.fields_by_name["part"].number
#: The smallest limit parts can be cut to (a frame's headers and at least one byte of data).
MIN_LIMIT = 32


def _frame_bytes(outer_tag: bytes, data: int, continues: bool) -> int:
    """The length of a frame holding ``data`` bytes of a part."""
    inner = len(_DATA_TAG) + len(varint(data)) + data + (len(_CONTINUES) if continues else 0)
    return len(outer_tag) + len(varint(inner)) + inner


def part_capacity(outer_tag: bytes, limit: int) -> int:
    """The most bytes of data a continuing frame holds within ``limit`` bytes."""
    data = limit - len(outer_tag) - len(_DATA_TAG) - len(_CONTINUES) - 2 * len(varint(limit))
    while _frame_bytes(outer_tag, data + 1, True) <= limit:
        data += 1
    while _frame_bytes(outer_tag, data, True) > limit:
        data -= 1
    return data


def _frame(outer_tag: bytes, data: memoryview, continues: bool) -> bytes:
    inner_length = len(_DATA_TAG) + len(varint(len(data))) + len(data)
    if continues:
        inner_length += len(_CONTINUES)
    head = outer_tag + varint(inner_length) + _DATA_TAG + varint(len(data))
    return b"".join((head, data, _CONTINUES if continues else b""))


def split(message: bytes, part_field: int, limit: int = MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """``message`` (an encoded response of a type whose field ``part_field`` is a MessagePart)
    as the frames to send: itself when it is at most ``limit`` bytes, else its parts, each frame
    at most ``limit`` bytes. The frames are built one at a time, as they are sent."""
    if len(message) <= limit:
        yield message
        return
    if limit < MIN_LIMIT:
        raise ValueError(f"a limit of {limit} bytes leaves no room for a part")
    outer_tag = varint(part_field << 3 | _LENGTH_DELIMITED)
    capacity = part_capacity(outer_tag, limit)
    view = memoryview(message)
    at, end = 0, len(message)
    while end - at > capacity:
        yield _frame(outer_tag, view[at : at + capacity], True)
        at += capacity
    # The last part: no ``continues``, so it is never larger than a continuing one.
    yield _frame(outer_tag, view[at:end], False)


def split_watch(message: bytes, limit: int = MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """An encoded WatchLaneResponse as the frames to send (:func:`split`)."""
    return split(message, WATCH_PART_FIELD, limit)


def split_answer(message: bytes, limit: int = MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """An encoded DriveLaneResponse as the frames to send (:func:`split`)."""
    return split(message, DRIVE_PART_FIELD, limit)
