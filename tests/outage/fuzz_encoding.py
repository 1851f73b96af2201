"""Raw wire encodings a protobuf library would never produce: invalid UTF-8 inside string
fields, fields with the wrong wire type, unknown fields, mutated bytes, padding to a size."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from lane.server.api.framing import varint
from tests.outage.fuzz_values import Draw, any_index


def _varint(value: int) -> bytes:
    """``value`` as a varint, a negative one as its 64-bit two's complement (as int64s are)."""
    return varint(value & ((1 << 64) - 1))


def _record(number: int, wire_type: int, payload: bytes) -> bytes:
    tag = _varint(number << 3 | wire_type)
    if wire_type == 0:
        return tag + payload
    if wire_type == 2:
        return tag + _varint(len(payload)) + payload
    return tag + payload  # fixed64 (1) / fixed32 (5): the payload has the right width


_NATURAL_WIRE_TYPE = {
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_MESSAGE: 2,
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_SFIXED64: 1,
    FieldDescriptor.TYPE_FLOAT: 5,
    FieldDescriptor.TYPE_FIXED32: 5,
    FieldDescriptor.TYPE_SFIXED32: 5,
}

BAD_UTF8 = (
    b"\xff",
    b"\xfe\xff",
    b"\xc3\x28",
    b"\xa0\xa1",
    b"\xe2\x28\xa1",
    b"\xed\xa0\x80",  # an encoded surrogate
    b"\xf8\x88\x80\x80\x80",
    b"\xc0\xaf",  # overlong "/"
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
    b"\xe2\x82",  # truncated sequence
)
PLACEHOLDER_LENGTH = 24


def _string_slots(message: Message, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths (message, field name, index or None) of every set string value, recursively."""
    slots: list[tuple[Any, ...]] = []
    for fd, value in message.ListFields():
        if fd.type == FieldDescriptor.TYPE_STRING:
            if fd.is_repeated:
                slots.extend((message, fd.name, index) for index in range(len(value)))
            else:
                slots.append((message, fd.name, None))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value if fd.is_repeated else [value]:
                slots.extend(_string_slots(item))
    return slots


def with_bad_utf8(draw: Draw, message: Message) -> bytes:
    """``message`` encoded with raw invalid UTF-8 in one of its string fields."""
    slots = _string_slots(message)
    if not slots:  # every request type has a string field (lane_id, or ListLanes' page_token)
        first = next(f for f in message.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_STRING)
        setattr(message, first.name, "x")
        slots = _string_slots(message)
    owner, name, index = slots[any_index(draw, len(slots))]
    marker = uuid.uuid4().hex[:PLACEHOLDER_LENGTH].ljust(PLACEHOLDER_LENGTH, "z")
    if index is None:
        setattr(owner, name, marker)
    else:
        getattr(owner, name)[index] = marker
    bad = draw(st.sampled_from(BAD_UTF8))
    # Inside a *_json field the bad bytes sit in a JSON string: "bad UTF-8 inside JSON".
    replacement = b'{"k":"' + bad + b'"}' if name.endswith("_json") else b"ab" + bad
    replacement = replacement.ljust(PLACEHOLDER_LENGTH, b" ")
    encoded = message.SerializeToString()
    assert encoded.count(marker.encode()) == 1
    return encoded.replace(marker.encode(), replacement)


def with_wrong_wire_type(draw: Draw, message: Message) -> bytes:
    fields = message.DESCRIPTOR.fields
    fd = fields[draw(st.integers(0, len(fields) - 1))]
    natural = _NATURAL_WIRE_TYPE.get(fd.type, 0)
    wire = draw(st.sampled_from([w for w in (0, 1, 2, 5) if w != natural]))
    payload = {
        0: _varint(draw(st.sampled_from((0, 1, 2**63, 2**64 - 1)))),
        1: struct.pack("<q", draw(st.integers(-(2**63), 2**63 - 1))),
        2: draw(st.binary(max_size=8)),
        5: struct.pack("<i", draw(st.integers(-(2**31), 2**31 - 1))),
    }[wire]
    record = _record(fd.number, wire, payload)
    encoded = message.SerializeToString()
    return record + encoded if draw(st.booleans()) else encoded + record


def with_unknown_field(draw: Draw, message: Message) -> bytes:
    number = draw(st.sampled_from((99, 1000, 2**29 - 1, 19_000)))
    wire = draw(st.sampled_from((0, 1, 2, 5)))
    payload = {0: _varint(7), 1: b"\x00" * 8, 2: b"unknown", 5: b"\x00" * 4}[wire]
    return message.SerializeToString() + _record(number, wire, payload)


#: One edit of encoded bytes: (kind, position, amount, patch). At ``position`` (modulo the
#: length): flip bit ``amount % 8``, truncate, insert ``patch``, delete ``1 + amount % 4``
#: bytes, or overwrite with ``patch``.
Mutation = tuple[str, int, int, bytes]
MUTATION_KINDS = ("flip", "truncate", "insert", "delete", "overwrite")


def mutate(data: bytes, mutations: Iterable[Mutation]) -> bytes:
    """``data`` with each of ``mutations`` applied in turn (test_refusals' mutated-bytes cases
    use it too)."""
    buffer = bytearray(data)
    for kind, position, amount, patch in mutations:
        at = position % max(len(buffer), 1)
        if kind == "flip" and buffer:
            buffer[at] ^= 1 << (amount % 8)
        elif kind == "truncate":
            del buffer[at:]
        elif kind == "insert":
            buffer[at:at] = patch
        elif kind == "delete" and buffer:
            del buffer[at : at + 1 + amount % 4]
        elif kind == "overwrite" and buffer:
            buffer[at : at + len(patch)] = patch
    return bytes(buffer)


def mutated(draw: Draw, data: bytes) -> bytes:
    """``data`` with one to four drawn mutations."""
    mutations: list[Mutation] = []
    for _ in range(draw(st.integers(1, 4))):
        # Every parameter is drawn whatever the buffer holds (see any_index).
        kind = draw(st.sampled_from(MUTATION_KINDS))
        position = draw(st.integers(0, 1 << 16))
        amount = draw(st.integers(0, 7))
        patch = draw(st.binary(min_size=1, max_size=4))
        mutations.append((kind, position, amount, patch))
    return mutate(data, mutations)


def padded_to(data: bytes, size: int) -> bytes:
    """``data`` plus one unknown length-delimited field, ``size`` bytes in all."""
    number = 15_999
    tag = _varint(number << 3 | 2)
    for length in range(max(size - len(data) - len(tag) - 10, 0), size):
        total = len(data) + len(tag) + len(_varint(length)) + length
        if total == size:
            return data + tag + _varint(length) + b"\x00" * length
    raise AssertionError(f"cannot pad {len(data)} bytes to {size}")
