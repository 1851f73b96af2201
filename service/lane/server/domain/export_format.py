"""The lane export file (docs/export-format.md): JSON Lines, a versioned header first.

Writing turns a lane's rows into the file's lines, one at a time; reading parses one line at a
time, refusing a line too long or too deep to parse within bounds. Both are pure: the store
reads and writes the rows, :mod:`~lane.server.domain.import_check` checks that the lines
describe one consistent idle lane, the api layer checks each message's content as it checks a
request's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from google.protobuf import json_format
from google.protobuf.message import Message
from lane.v1 import entries_pb2, events_pb2, snapshot_pb2

from lane.server.domain.errors import InvalidArgument

#: The header's ``format`` value: what the file is.
FORMAT = "lane.v1.export"
#: The version this service writes and reads.
VERSION = 1
#: Record kinds after the header, in file order; each line is ``{kind: <protobuf JSON>}``.
LANE, ENTRY, USAGE_ROW, EVENT_GROUP = "lane", "entry", "usageRow", "eventGroup"
RECORD_TYPES: dict[str, type[Message]] = {
    LANE: snapshot_pb2.LaneSnapshot,
    ENTRY: entries_pb2.Entry,
    USAGE_ROW: events_pb2.UsageRow,
    EVENT_GROUP: events_pb2.HarnessEvent,  # a group is a list of events (see parse_record)
}
ORDER = {LANE: 0, ENTRY: 1, USAGE_ROW: 2, EVENT_GROUP: 3}

#: The longest line read. The longest line the service writes is one commit's event group,
#: as JSON; a line is parsed whole, so this bounds what one line costs to read (an export
#: whose group is longer is refused on import, INVALID_EXPORT).
MAX_LINE_BYTES = 16 << 20
#: The most JSON values (objects, arrays, numbers, strings, ...) one line may hold, counted
#: before it is parsed: each costs some 50 bytes once parsed, so this bounds a line's parse to
#: some 50 MiB whatever its shape.
MAX_LINE_VALUES = 1_000_000
#: The largest revision, sequence number, retention floor or message count a file may hold.
#: A lane keeps counting from what it imports, so an import must leave it room to take
#: commands (int64 would overflow at 2^63 - 1); 2^53 - 1 also keeps every revision exact in
#: clients that read int64 as a double (JavaScript's Number).
MAX_COUNTER = 2**53 - 1

_DECIMAL = re.compile(r"0|[1-9][0-9]*")
# A JSON string, escapes included: what is skipped when values are counted.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


@dataclass
class ExportHead:
    """What precedes an export's entries: the header's values and the lane record."""

    #: The id of the lane exported (events name it).
    lane_id: str
    #: Events at or below it were removed by retention before the export.
    retention_floor: int
    #: The lane without transcript and without operation: revision, tip, configuration,
    #: stats, inbox, last result, faulted.
    lane: snapshot_pb2.LaneSnapshot


def _json(message: Message) -> object:
    return json_format.MessageToDict(message, preserving_proto_field_name=False)


def _line(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def head_lines(head: ExportHead, exported_at: datetime) -> bytes:
    """The file's first two lines: the header, then the lane record."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "laneId": head.lane_id,
        "revision": str(head.lane.revision),
        "retentionFloor": str(head.retention_floor),
        "exportTime": exported_at.isoformat(),
    }
    return _line(header) + _line({LANE: _json(head.lane)})


def record_line(kind: str, message: Message) -> bytes:
    """The line of one entry or usage row (``kind``: :data:`ENTRY` or :data:`USAGE_ROW`)."""
    return _line({kind: _json(message)})


def event_group_line(group: list[events_pb2.HarnessEvent]) -> bytes:
    """The line of one commit's event group."""
    return _line({EVENT_GROUP: {"events": [_json(event) for event in group]}})


def invalid(line: int, problem: str) -> InvalidArgument:
    """The refusal of a file that is not a valid export (``line``: 1-based, 0: the whole file)."""
    where = f"line {line}: " if line else ""
    return InvalidArgument(
        "INVALID_EXPORT", f"not a valid lane export: {where}{problem}", line=line, problem=problem
    )


def parse_object(raw: bytes, number: int) -> dict[str, object]:
    """Line ``number`` parsed as a JSON object, within :data:`MAX_LINE_BYTES` and
    :data:`MAX_LINE_VALUES` (strict JSON: no NaN or Infinity)."""
    if len(raw) > MAX_LINE_BYTES:
        raise invalid(number, f"the line is longer than {MAX_LINE_BYTES} bytes")
    # Every value but the first follows a comma or opens a container: the count of those is a
    # bound on the values, and an exact one once strings (which may hold them) are left out.
    if _structure_count(raw) > MAX_LINE_VALUES and (
        _structure_count(_STRING.sub(b"", raw)) > MAX_LINE_VALUES
    ):
        raise invalid(number, f"the line holds more than {MAX_LINE_VALUES} JSON values")
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise invalid(number, "the line's JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(number, f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise invalid(number, "not a JSON object")
    return value


def _structure_count(raw: bytes) -> int:
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class Header:
    """The header's values."""

    lane_id: str
    revision: int
    retention_floor: int


def parse_header(raw: bytes) -> Header:
    """The first line: format and version first, then the exported lane's id, revision and
    retention floor (counters within :data:`MAX_COUNTER`, the floor at most the revision)."""
    header = parse_object(raw, 1)
    if header.get("format") != FORMAT:
        raise invalid(1, f'the first line must be the header, with "format": "{FORMAT}"')
    version = header.get("version")
    # A JSON integer: 1.0 and true equal 1 in Python, and are not a version.
    if type(version) is not int:
        raise invalid(1, "the header's version must be a JSON integer")
    if version != VERSION:
        raise InvalidArgument(
            "EXPORT_VERSION_UNSUPPORTED",
            f"export format version {version} is not supported; this service reads "
            f"version {VERSION}",
            version=str(version),
            supported=VERSION,
        )
    lane_id = header.get("laneId")
    if not isinstance(lane_id, str) or not lane_id:
        raise invalid(1, "the header's laneId must be a non-empty string")
    revision = _counter(header, "revision")
    floor = _counter(header, "retentionFloor")
    if floor > revision:
        raise invalid(1, "the retention floor is above the revision")
    return Header(lane_id, revision, floor)


def _counter(header: dict[str, object], key: str) -> int:
    """An int64 of the header: a decimal string (as protobuf JSON writes it) or a JSON integer."""
    value = header.get(key)
    if type(value) is str and _DECIMAL.fullmatch(value) and len(value) <= 20:
        value = int(value)
    if type(value) is not int or not 0 <= value <= MAX_COUNTER:
        raise invalid(1, f"the header's {key} must be an integer from 0 to {MAX_COUNTER}")
    return value


Record = tuple[str, Message | list[events_pb2.HarnessEvent]]


def parse_record(raw: bytes, number: int) -> Record:
    """Line ``number`` (after the header) as its record: its kind and its message (an event
    group: its events)."""
    value = parse_object(raw, number)
    if len(value) != 1:
        raise invalid(number, f"a record is an object with one key of {sorted(RECORD_TYPES)}")
    ((kind, body),) = value.items()
    if kind not in RECORD_TYPES:
        raise invalid(number, f"unknown record kind {kind!r}")
    try:
        if kind == EVENT_GROUP:
            if not isinstance(body, dict) or set(body) != {"events"}:
                raise invalid(number, 'an event group is {"events": [...]}')
            events = body["events"]
            if not isinstance(events, list) or not events:
                raise invalid(number, "an event group holds at least one event")
            if not all(isinstance(e, dict) for e in events):
                raise invalid(number, "an event is a JSON object")
            return kind, [json_format.ParseDict(e, events_pb2.HarnessEvent()) for e in events]
        if not isinstance(body, dict):
            raise invalid(number, f"{kind}: not a JSON object")
        return kind, json_format.ParseDict(body, RECORD_TYPES[kind]())
    except json_format.ParseError as exc:
        raise invalid(number, f"{kind}: {exc}") from None
    except RecursionError:
        raise invalid(number, f"{kind}: nested too deeply") from None
