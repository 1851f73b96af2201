"""The wire format of DriveLane messages, read and built without copying commands or answers.

A request message is read at its top level only (:func:`read_request`): its ``sequence``,
whether it names a command, and where each request of its ``batch`` lies. Each of those is then
decoded, and its counts checked, on its own, as a message of its own would be, so a batch of
4 MiB is never decoded in one piece before its parts are counted, and one broken request of a
batch is refused alone. The walk stops one past :data:`MAX_DRIVE_BATCH` requests and after
:data:`MAX_TOP_FIELDS` fields, so no message costs more than a few hundred steps to read.

An answer is kept as its head (the sequence and the answer field's header) and the encoded
answer itself (:class:`Answer`): a single answer message is the two joined, a batch message
(:func:`answer_messages`) the ``batch`` entries of several, each answer's bytes copied once, into
the message gRPC sends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from lane.limits import MAX_DRIVE_BATCH, MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.framing import read_varint, varint

_REQUEST = pb.DriveLaneRequest.DESCRIPTOR
_RESPONSE = pb.DriveLaneResponse.DESCRIPTOR
SEQUENCE_FIELD = _REQUEST.fields_by_name["sequence"].number
#: The field number of ``batch``, in requests and answers alike.
BATCH_FIELD = _REQUEST.fields_by_name["batch"].number
#: The field number of DriveLaneResponse.error.
ERROR_FIELD = _RESPONSE.fields_by_name["error"].number
_COMMAND_FIELDS = frozenset(f.number for f in _REQUEST.oneofs_by_name["command"].fields)
assert _RESPONSE.fields_by_name["batch"].number == BATCH_FIELD
assert _RESPONSE.fields_by_name["sequence"].number == SEQUENCE_FIELD

#: Top-level fields of one request message, at most: a batch's requests, its sequence and a
#: few unknown fields fit many times over; more is padding, refused MALFORMED_REQUEST.
MAX_TOP_FIELDS = 4 * MAX_DRIVE_BATCH

_LENGTH_DELIMITED = 2
_SKIP_FIXED = {1: 8, 5: 4}  # wire type: bytes (fixed64, fixed32)
_UINT64 = (1 << 64) - 1
_SEQUENCE_TAG = varint(SEQUENCE_FIELD << 3)
_BATCH_TAG = varint(BATCH_FIELD << 3 | _LENGTH_DELIMITED)


@dataclass(slots=True)
class Request:
    """One request message read at its top level."""

    #: Its ``sequence`` (the last one, as a decoder takes it; 0 if none).
    sequence: int = 0
    #: Whether it holds a field of the ``command`` oneof.
    command: bool = False
    #: Where each request of its ``batch`` lies in the message: (start, end).
    batch: list[tuple[int, int]] = field(default_factory=list)
    #: More than MAX_DRIVE_BATCH requests in ``batch`` (the walk stopped one past it).
    too_many: bool = False
    #: Not a valid encoding, or over MAX_TOP_FIELDS fields (the walk stopped there;
    #: ``sequence`` is the last one read before).
    malformed: bool = False


def read_request(data: bytes | memoryview) -> Request:
    """Read the top level of the encoded DriveLaneRequest ``data``; never raises."""
    read = Request()
    batch = read.batch
    at, end, fields = 0, len(data), 0
    try:
        while at < end:
            fields += 1
            if fields > MAX_TOP_FIELDS:
                read.malformed = True
                return read
            key, at = read_varint(data, at)
            number, wire = key >> 3, key & 7
            if wire == _LENGTH_DELIMITED:
                length, at = read_varint(data, at)
                stop = at + length
                if stop > end:
                    read.malformed = True
                    return read
                if number == BATCH_FIELD:
                    if len(batch) == MAX_DRIVE_BATCH:
                        read.too_many = True
                        return read
                    batch.append((at, stop))
                elif number in _COMMAND_FIELDS:
                    read.command = True
                at = stop
            elif wire == 0:
                value, at = read_varint(data, at)
                if number == SEQUENCE_FIELD:
                    read.sequence = value & _UINT64
            elif wire in _SKIP_FIXED:
                at += _SKIP_FIXED[wire]
            else:
                read.malformed = True  # groups, or no wire type at all
                return read
        read.malformed = at != end
    except (IndexError, ValueError):
        read.malformed = True
    return read


@dataclass(frozen=True, slots=True)
class Answer:
    """One command's answer: ``head`` (its sequence and the header of the answer field) and
    ``body`` (the encoded answer, or the encoded google.rpc.Status of ``error``)."""

    head: bytes
    body: bytes

    @property
    def size(self) -> int:
        """Its size as a DriveLaneResponse message of its own."""
        return len(self.head) + len(self.body)

    def message(self) -> bytes:
        """The encoded DriveLaneResponse holding this answer alone."""
        return self.head + self.body


def answer(sequence: int, answer_field: int, body: bytes) -> Answer:
    """The answer ``body`` (an encoded message) in field ``answer_field``, under ``sequence``."""
    head = varint(answer_field << 3 | _LENGTH_DELIMITED) + varint(len(body))
    if sequence:
        head = _SEQUENCE_TAG + varint(sequence) + head
    return Answer(head, body)


def answer_messages(answers: Sequence[Answer]) -> Iterator[tuple[bytes, int]]:
    """``answers`` as few encoded DriveLaneResponse messages as the bounds allow, in order, each
    with the number of answers it carries: a batch holds at most MAX_DRIVE_BATCH answers and
    MAX_MESSAGE_BYTES; one answer alone (or one too large to fit a batch) goes as itself."""
    group: list[Answer] = []
    parts: list[bytes] = []
    total = 0
    for item in answers:
        size = item.size
        entry = _BATCH_TAG + varint(size)
        grown = total + len(entry) + size
        if group and (grown > MAX_MESSAGE_BYTES or len(group) == MAX_DRIVE_BATCH):
            yield _flush(group, parts)
            group, parts, total = [], [], 0
            grown = len(entry) + size
        group.append(item)
        parts += (entry, item.head, item.body)
        total = grown
    if group:
        yield _flush(group, parts)


def _flush(group: list[Answer], parts: list[bytes]) -> tuple[bytes, int]:
    if len(group) == 1:
        return group[0].message(), 1
    return b"".join(parts), len(group)
