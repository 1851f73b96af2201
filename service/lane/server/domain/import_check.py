"""An export file checked line by line as it arrives, holding an index instead of its rows.

:class:`ImportCheck` takes the file's lines in order, for a new lane, and refuses
(``INVALID_EXPORT``, or ``EXPORT_VERSION_UNSUPPORTED``) anything but one consistent idle lane
a service could have written, and that can go on taking commands: the header, the records'
order and structure, ids, sequence numbers and revisions within range, entries after their
parents, a lane record within the inbox budget, and the event log folded
against the lane record and the rows (:mod:`~lane.server.domain.log_fold`). It returns each
line's record to the caller (its events naming the new lane), which checks the messages'
content as a request's and keeps the rows to write; it keeps of them only a
:class:`~lane.server.domain.row_index.RowIndex`, so checking costs memory for one line, the
lane's live state and some 60 bytes per row plus its id, whatever the rows' sizes. Checks
that need the whole file run in :meth:`ImportCheck.finish`.
"""

from __future__ import annotations

from google.protobuf.message import Message
from lane.v1 import entries_pb2, events_pb2, snapshot_pb2

from lane.server.domain.export_format import (
    EVENT_GROUP,
    LANE,
    MAX_COUNTER,
    ORDER,
    ExportHead,
    Header,
    Record,
    invalid,
    parse_header,
    parse_record,
)
from lane.server.domain.lanes import MAX_QUEUE_BYTES
from lane.server.domain.log_fold import LogFold
from lane.server.domain.row_index import RowIndex


def _require_room(lane: snapshot_pb2.LaneSnapshot, line: int) -> None:
    """Refuse a lane record commands could not have left, whose lane could not go on taking
    them: an inbox over the enqueue limit (limits.py)."""
    inbox = sum(item.ByteSize() for item in lane.queues)
    if inbox > MAX_QUEUE_BYTES:
        raise invalid(line, f"the inbox holds {inbox} bytes; a lane holds {MAX_QUEUE_BYTES}")


class ImportCheck:
    """One export file's lines, checked in order (module docstring)."""

    def __init__(self, lane_id: str) -> None:
        #: The new lane's id: the events that named the exported lane name it once checked.
        self.lane_id = lane_id
        #: Lines taken so far.
        self.lines = 0
        self._header: Header | None = None
        self.head: ExportHead | None = None
        self._last_kind = -1
        self.entries = RowIndex()
        self.usage_rows = RowIndex()
        self._fold: LogFold | None = None
        self._next_revision = 0
        #: Events read so far.
        self.event_count = 0

    def take(self, raw: bytes) -> Record | None:
        """Check the file's next line (without its newline); return its record (None for the
        header)."""
        self.lines += 1
        line = self.lines
        if self._header is None:
            self._header = parse_header(raw)
            self._next_revision = self._header.retention_floor + 1
            return None
        kind, message = parse_record(raw, line)
        if ORDER[kind] < self._last_kind or (kind == LANE and self.head is not None):
            raise invalid(line, "records must be: lane, entries, usage rows, event groups")
        self._last_kind = ORDER[kind]
        if isinstance(message, snapshot_pb2.LaneSnapshot):
            self.head = self._lane(message, self._header, line)
            return kind, message
        if self.head is None:
            raise invalid(line, "the lane record must follow the header")
        if isinstance(message, entries_pb2.Entry):
            self._entry(message, line)
        elif isinstance(message, events_pb2.UsageRow):
            self._usage_row(message, line)
        else:
            assert kind == EVENT_GROUP and isinstance(message, list)
            self._event_group(message, self.head, line)
        return kind, message

    @staticmethod
    def _lane(lane: snapshot_pb2.LaneSnapshot, header: Header, line: int) -> ExportHead:
        if lane.revision != header.revision:
            raise invalid(line, "the header's revision is not the lane record's")
        if lane.lane_id not in ("", header.lane_id):
            raise invalid(line, "the lane record names another lane than the header")
        if lane.HasField("operation"):
            raise invalid(line, "the lane has an open operation (export only idle lanes)")
        if lane.transcript:
            raise invalid(line, "the lane record holds no transcript (entries are records)")
        if not 0 <= lane.stats.message_count <= MAX_COUNTER:
            raise invalid(line, f"the lane's message count must be from 0 to {MAX_COUNTER}")
        queued = [item.entry_id for item in lane.queues]
        if len(set(queued)) != len(queued) or not all(queued):
            raise invalid(line, "inbox items need distinct entry ids")
        _require_room(lane, line)
        return ExportHead(header.lane_id, header.retention_floor, lane)

    def _entry(self, entry: entries_pb2.Entry, line: int) -> None:
        if entry.WhichOneof("payload") is None:
            raise invalid(line, f"entry {entry.id!r} has no payload")
        if entry.parent_id and entry.parent_id not in self.entries:
            raise invalid(line, f"entry {entry.id!r}: its parent {entry.parent_id} is not earlier")
        self._index(self.entries, "entry", entry.id, entry.seq, entry, line)

    def _usage_row(self, row: events_pb2.UsageRow, line: int) -> None:
        self._index(self.usage_rows, "usage row", row.id, row.seq, row, line)

    def _index(
        self, rows: RowIndex, what: str, row_id: str, seq: int, row: Message, line: int
    ) -> None:
        """Index a row whose id is new and whose seq follows the previous row's."""
        if not row_id or row_id in rows:
            raise invalid(line, f"{what} ids must be present and distinct ({row_id!r})")
        last_seq = rows.seq(len(rows) - 1) if len(rows) else 0
        if not last_seq < seq <= self._revision:
            raise invalid(line, f"{what} {row_id}: seqs must increase and stay within the revision")
        rows.add(row_id, seq, row)

    def _event_group(
        self, group: list[events_pb2.HarnessEvent], head: ExportHead, line: int
    ) -> None:
        if self._fold is None:
            self._fold = LogFold(head, self.entries, self.usage_rows)
        for event in group:
            if event.revision != self._next_revision:
                raise invalid(
                    line, f"event revisions must run on from {self._next_revision} without gaps"
                )
            if event.revision > self._revision:
                raise invalid(line, f"event {event.revision} is after the lane's revision")
            if event.lane_id not in ("", head.lane_id):
                raise invalid(line, f"event {event.revision} names another lane ({event.lane_id})")
            if event.WhichOneof("kind") is None:
                raise invalid(line, f"event {event.revision} has no kind")
            self._fold.event(event, line)
            self._next_revision += 1
            self.event_count += 1
        for event in group:
            if event.lane_id:
                event.lane_id = self.lane_id  # the new lane's, once checked

    @property
    def _revision(self) -> int:
        assert self._header is not None
        return self._header.revision

    def finish(self) -> ExportHead:
        """The checks that need the whole file; the lane's head."""
        if self._header is None:
            raise invalid(0, "the file is empty")
        head = self.head
        if head is None:
            raise invalid(0, "the file has no lane record")
        if self._next_revision - 1 != self._revision:
            raise invalid(
                0,
                f"the events end at revision {self._next_revision - 1}, the lane is at "
                f"{self._revision}",
            )
        lane = head.lane
        if lane.tip_id and lane.tip_id not in self.entries:
            raise invalid(0, f"the tip {lane.tip_id} is not an entry of the file")
        if not lane.tip_id and len(self.entries):
            raise invalid(0, "a lane with entries has a tip")
        if any(item.entry_id in self.entries for item in lane.queues):
            raise invalid(0, "an inbox item has the id of an entry")
        fold = self._fold or LogFold(head, self.entries, self.usage_rows)
        fold.finish(lane)
        return head
