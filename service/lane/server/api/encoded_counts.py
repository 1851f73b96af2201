"""Counts checked on a large request's bytes, before protobuf decodes it.

Decoding costs per element of a repeated message field: four megabytes of empty content
blocks are a million messages and take protobuf a quarter of a second, all of it on the event
loop, every other caller waiting. (Repeated occurrences of a singular message merge into one
and cost little; unknown fields are kept as bytes.) Every repeated field a request can hold is
counted under a limit (:func:`~lane.server.api.validation.check_counts`), so a request is
refused here, from its encoding, as soon as one count passes its limit — in time bounded by
the limits, not by the request — and decoded only if none does.

The walk follows the same plan as ``check_counts`` (it visits the messages that can hold a
counted field, never a content block) and reads every other field as one tag and a skip.
Those other fields are capped too (:data:`MAX_OTHER_FIELDS`), so a request padded with
millions of unknown or repeated scalar fields cannot keep the walk itself going. Requests up
to :data:`CHECKED_FROM_BYTES` are decoded without the walk: at most a few milliseconds of
decoding however they are made.

Counted from the bytes, a value the decoder would drop still counts: an encoding that sets two
members of a oneof (the last one wins when decoded) is counted with both. The decoder pays for
both as well. No request type that can hold a counted field holds itself, so the walk's
depth is that of the message types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from lane.server.api.framing import read_varint
from lane.server.api.validation import COUNT_LIMITS, count_plan, too_many
from lane.server.domain.errors import InvalidArgument

#: Requests this size or smaller are decoded at once (the worst, all empty blocks, decodes in
#: a few milliseconds); larger ones are counted first.
CHECKED_FROM_BYTES = 64 * 1024
#: Fields the walk reads besides the counted elements: a request's own fields and those of
#: each message it visits. Real requests have tens.
MAX_OTHER_FIELDS = 8192

_LENGTH_DELIMITED = 2
_SKIP_FIXED = {1: 8, 5: 4}  # wire type: bytes (fixed64, fixed32)


#: A field of a count plan: its name, what each of its values counts as (or None), and the
#: node to walk its value with (or None: skipped).
CountField = tuple[str, "str | None", "CountNode | None"]


@dataclass(frozen=True)
class CountNode:
    """A message type's fields that :func:`~lane.server.api.validation.check_counts` visits or
    counts, by number (for the encoding) and by both JSON names (for JSON,
    ``service/lane/server/api/json_counts.py``)."""

    fields: dict[int, CountField]
    names: dict[str, CountField]


_NODES: dict[str, CountNode] = {}


def count_node(descriptor: Descriptor) -> CountNode:
    """The count plan of a message type as a node to walk its values with."""
    node = _NODES.get(descriptor.full_name)
    if node is not None:
        return node
    fields: dict[int, CountField] = {}
    names: dict[str, CountField] = {}
    # Kept before its fields are filled in, so a type that holds itself refers to this node.
    node = _NODES[descriptor.full_name] = CountNode(fields, names)
    plan = count_plan(descriptor)
    counted = {field.number: what for field, what in plan.repeated}
    for field in plan.descend:
        assert field.message_type is not None
        child = count_node(field.message_type)
        fields[field.number] = (field.name, counted.get(field.number), child)
    for field, what in plan.repeated:
        fields.setdefault(field.number, (field.name, what, None))
    for field in descriptor.fields:
        if field.number in fields:
            # protobuf's JSON reader takes a field by its lowerCamelCase name or its own.
            names[field.json_name] = names[field.name] = fields[field.number]
    return node


def check_encoded_counts(data: bytes | memoryview, request_type: type[Message]) -> None:
    """Refuse a request (the encoded ``data`` of a ``request_type`` message) over a count limit
    (INVALID_ARGUMENT ``TOO_MANY_*``, as ``check_counts`` would) or padded with more than
    :data:`MAX_OTHER_FIELDS` other fields (``MALFORMED_REQUEST``) before it is decoded.
    Requests up to :data:`CHECKED_FROM_BYTES` pass unread. Bytes that are not a valid
    encoding are left for the decoder to refuse."""
    if len(data) <= CHECKED_FROM_BYTES:
        return
    walk = _Walk(data)
    try:
        walk.message(0, len(data), count_node(cast(Descriptor, request_type.DESCRIPTOR)), "")
    except (IndexError, ValueError, _Corrupt):
        return  # not a valid encoding: the decoder refuses it


class _Corrupt(Exception):
    pass


class Tally:
    """A request's counted values so far (content blocks, messages, tool names)."""

    __slots__ = ("totals",)

    def __init__(self) -> None:
        self.totals = dict.fromkeys(COUNT_LIMITS, 0)

    def count(self, what: str, path: str) -> None:
        """Count one ``what`` at ``path``; refuse the request once one is past its limit."""
        self.totals[what] += 1
        if self.totals[what] > COUNT_LIMITS[what][1]:
            raise too_many(what, path, self.totals[what], at_least=True)


class _Walk(Tally):
    __slots__ = ("data", "other")

    def __init__(self, data: bytes | memoryview) -> None:
        super().__init__()
        self.data = data
        self.other = 0

    def message(self, pos: int, end: int, node: CountNode, path: str) -> None:
        fields = node.fields
        while pos < end:
            key, pos = read_varint(self.data, pos)
            wire = key & 7
            if wire == _LENGTH_DELIMITED:
                length, pos = read_varint(self.data, pos)
                value_end = pos + length
                if value_end > end:
                    raise _Corrupt
                spec = fields.get(key >> 3)
                if spec is None:
                    self._other(path)
                else:
                    name, what, child = spec
                    at = f"{path}.{name}" if path else name
                    if what is not None:
                        self.count(what, at)
                    else:
                        self._other(at)
                    if child is not None:
                        self.message(pos, value_end, child, at)
                pos = value_end
            elif wire == 0:
                self._other(path)
                _, pos = read_varint(self.data, pos)
            elif wire in _SKIP_FIXED:
                self._other(path)
                pos += _SKIP_FIXED[wire]
            else:
                raise _Corrupt  # groups: proto3 has none
        if pos != end:
            raise _Corrupt

    def _other(self, path: str) -> None:
        self.other += 1
        if self.other > MAX_OTHER_FIELDS:
            raise InvalidArgument(
                "MALFORMED_REQUEST",
                f"the request has more than {MAX_OTHER_FIELDS} fields outside its counted "
                f"lists (content blocks, messages, tool names)",
                field=path,
                limit=MAX_OTHER_FIELDS,
            )
