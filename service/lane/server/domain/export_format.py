"""The lane export file (docs/export-format.md): JSON Lines, a versioned header first.

Writing turns a lane's rows into the file's lines; reading parses a file back and checks that it
describes one consistent idle lane, before anything is written. Both are pure: the store reads
and writes the rows, the api layer checks each message's content as it checks a request's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
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
_RECORD_TYPES: dict[str, type[Message]] = {
    LANE: snapshot_pb2.LaneSnapshot,
    ENTRY: entries_pb2.Entry,
    USAGE_ROW: events_pb2.UsageRow,
    EVENT_GROUP: events_pb2.HarnessEvent,  # a group is a list of events (see _record)
}
_ORDER = {LANE: 0, ENTRY: 1, USAGE_ROW: 2, EVENT_GROUP: 3}


@dataclass
class LaneExport:
    """One lane as the file holds it."""

    #: The id of the lane exported (events name it).
    lane_id: str
    #: Events at or below it were removed by retention before the export.
    retention_floor: int
    #: The lane without transcript and without operation: revision, tip, configuration,
    #: stats, inbox, last result, faulted.
    lane: snapshot_pb2.LaneSnapshot
    #: Every entry of the lane (every branch), in seq order.
    entries: list[entries_pb2.Entry] = field(default_factory=list)
    usage_rows: list[events_pb2.UsageRow] = field(default_factory=list)
    #: The event log after the retention floor, one list per commit.
    event_groups: list[list[events_pb2.HarnessEvent]] = field(default_factory=list)


def _json(message: Message) -> object:
    return json_format.MessageToDict(message, preserving_proto_field_name=False)


def export_lines(export: LaneExport, exported_at: datetime) -> Iterator[bytes]:
    """The file's lines (each ending with a newline), header first."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "laneId": export.lane_id,
        "revision": str(export.lane.revision),
        "retentionFloor": str(export.retention_floor),
        "exportTime": exported_at.isoformat(),
    }
    yield _line(header)
    yield _line({LANE: _json(export.lane)})
    for entry in export.entries:
        yield _line({ENTRY: _json(entry)})
    for row in export.usage_rows:
        yield _line({USAGE_ROW: _json(row)})
    for group in export.event_groups:
        yield _line({EVENT_GROUP: {"events": [_json(event) for event in group]}})


def _line(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def invalid(line: int, problem: str) -> InvalidArgument:
    """The refusal of a file that is not a valid export (``line``: 1-based, 0: the whole file)."""
    where = f"line {line}: " if line else ""
    return InvalidArgument(
        "INVALID_EXPORT", f"not a valid lane export: {where}{problem}", line=line, problem=problem
    )


def read_export(data: bytes) -> LaneExport:
    """Parse and check a whole export file; refuse anything but one consistent idle lane."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise invalid(0, "the file is empty")
    header = _object(lines[0], 1)
    _check_header(header)
    lane_id, floor = header["laneId"], _int(header, "retentionFloor", 1)
    if not isinstance(lane_id, str) or not lane_id:
        raise invalid(1, "the header's laneId must be a non-empty string")
    export: LaneExport | None = None
    last_kind = -1
    for number, raw in enumerate(lines[1:], 2):
        kind, message = _record(raw, number)
        if _ORDER[kind] < last_kind or (kind == LANE and export is not None):
            raise invalid(number, "records must be: lane, entries, usage rows, event groups")
        last_kind = _ORDER[kind]
        if kind == LANE:
            assert isinstance(message, snapshot_pb2.LaneSnapshot)
            export = LaneExport(lane_id, floor, message)
            continue
        if export is None:
            raise invalid(number, "the lane record must follow the header")
        if isinstance(message, entries_pb2.Entry):
            export.entries.append(message)
        elif isinstance(message, events_pb2.UsageRow):
            export.usage_rows.append(message)
        else:
            assert isinstance(message, list)
            export.event_groups.append(message)
    if export is None:
        raise invalid(0, "the file has no lane record")
    _check_lane(export, _int(header, "revision", 1))
    return export


def _object(raw: bytes, number: int) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(number, f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise invalid(number, "not a JSON object")
    return value


def _check_header(header: dict[str, object]) -> None:
    if header.get("format") != FORMAT:
        raise invalid(1, f'the first line must be the header, with "format": "{FORMAT}"')
    version = header.get("version")
    if version != VERSION:
        raise InvalidArgument(
            "EXPORT_VERSION_UNSUPPORTED",
            f"export format version {version!r} is not supported; this service reads "
            f"version {VERSION}",
            version=str(version),
            supported=VERSION,
        )


def _int(header: dict[str, object], key: str, number: int) -> int:
    value = header.get(key)
    try:
        # Protobuf JSON writes int64 as strings; accept numbers too.
        parsed = int(value) if isinstance(value, str | int) and not isinstance(value, bool) else -1
    except ValueError:
        parsed = -1
    if parsed < 0:
        raise invalid(number, f"the header's {key} must be a non-negative integer")
    return parsed


def _record(raw: bytes, number: int) -> tuple[str, Message | list[events_pb2.HarnessEvent]]:
    value = _object(raw, number)
    if len(value) != 1:
        raise invalid(number, f"a record is an object with one key of {sorted(_RECORD_TYPES)}")
    ((kind, body),) = value.items()
    if kind not in _RECORD_TYPES:
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
        return kind, json_format.ParseDict(body, _RECORD_TYPES[kind]())
    except json_format.ParseError as exc:
        raise invalid(number, f"{kind}: {exc}") from None


def _check_lane(export: LaneExport, revision: int) -> None:
    lane = export.lane
    if lane.revision != revision:
        raise invalid(0, "the header's revision is not the lane record's")
    if lane.HasField("operation"):
        raise invalid(0, "the lane has an open operation (export only idle lanes)")
    if lane.transcript:
        raise invalid(0, "the lane record holds no transcript (entries are records of their own)")
    if lane.stats.message_count < 0:
        raise invalid(0, "the lane's message count is negative")
    if not export.retention_floor <= revision:
        raise invalid(0, "the retention floor is above the revision")
    _check_entries(export.entries, lane.tip_id, revision)
    _check_usage_rows(export.usage_rows, revision)
    _check_events(export, revision)
    queued = [item.entry_id for item in lane.queues]
    if len(set(queued)) != len(queued) or not all(queued):
        raise invalid(0, "inbox items need distinct entry ids")
    if set(queued) & {entry.id for entry in export.entries}:
        raise invalid(0, "an inbox item has the id of an entry")


def _check_entries(entries: list[entries_pb2.Entry], tip_id: str, revision: int) -> None:
    seen: set[str] = set()
    last_seq = 0
    for entry in entries:
        if not entry.id or entry.id in seen:
            raise invalid(0, f"entry ids must be present and distinct ({entry.id!r})")
        if entry.WhichOneof("payload") is None:
            raise invalid(0, f"entry {entry.id} has no payload")
        if not last_seq < entry.seq <= revision:
            raise invalid(0, f"entry {entry.id}: seqs must increase and stay within the revision")
        if entry.parent_id and entry.parent_id not in seen:
            raise invalid(0, f"entry {entry.id}: its parent {entry.parent_id} is not before it")
        seen.add(entry.id)
        last_seq = entry.seq
    if tip_id and tip_id not in seen:
        raise invalid(0, f"the tip {tip_id} is not an entry of the file")
    if not tip_id and entries:
        raise invalid(0, "a lane with entries has a tip")


def _check_usage_rows(rows: list[events_pb2.UsageRow], revision: int) -> None:
    seen: set[str] = set()
    last_seq = 0
    for row in rows:
        if not row.id or row.id in seen:
            raise invalid(0, f"usage row ids must be present and distinct ({row.id!r})")
        if not last_seq < row.seq <= revision:
            raise invalid(0, f"usage row {row.id}: seqs must increase and stay within the revision")
        seen.add(row.id)
        last_seq = row.seq


def _check_events(export: LaneExport, revision: int) -> None:
    expected = export.retention_floor + 1
    for group in export.event_groups:
        for event in group:
            if event.revision != expected:
                raise invalid(0, f"event revisions must run on from {expected} without gaps")
            if event.lane_id not in ("", export.lane_id):
                raise invalid(0, f"event {event.revision} names another lane ({event.lane_id})")
            if event.WhichOneof("kind") is None:
                raise invalid(0, f"event {event.revision} has no kind")
            expected += 1
    if expected - 1 != revision:
        raise invalid(0, f"the events end at revision {expected - 1}, the lane is at {revision}")


def renamed(groups: Iterable[list[events_pb2.HarnessEvent]], lane_id: str) -> None:
    """Point every lane event of ``groups`` at ``lane_id`` (in place); lane-less ones stay."""
    for group in groups:
        for event in group:
            if event.lane_id:
                event.lane_id = lane_id
