"""Building one commit's event group: envelopes, consecutive revisions, entries and usage rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message
from lane.v1 import entries_pb2, events_pb2, messages_pb2

from lane.server.domain.usage import add_usage


@lru_cache(maxsize=64)
def _stamp(now: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(now)
    return stamp


def stamp(now: datetime) -> timestamp_pb2.Timestamp:
    """``now`` as a Timestamp, converted once per commit time (a commit stamps every event,
    entry and result with it): copy it into a field, never change it."""
    return _stamp(now)


@dataclass
class EventLog:
    """Collects the events of one commit, numbering them from the lane's current revision.

    Entries placed and usage rows written by the commit are collected beside their events, so
    an entry's ``seq`` and a usage row's ``seq`` are the revisions of the events announcing them.
    """

    lane_id: str
    revision: int
    now: datetime
    events: list[events_pb2.HarnessEvent] = field(default_factory=list)
    entries: list[entries_pb2.Entry] = field(default_factory=list)
    usage_rows: list[events_pb2.UsageRow] = field(default_factory=list)

    def emit(self, kind: str, body: Message, *, recovery: bool = False) -> events_pb2.HarnessEvent:
        """Append one event of ``kind`` (the HarnessEvent oneof field name)."""
        self.revision += 1
        event = events_pb2.HarnessEvent(
            lane_id=self.lane_id, revision=self.revision, recovery=recovery
        )
        event.commit_time.CopyFrom(stamp(self.now))
        getattr(event, kind).CopyFrom(body)
        self.events.append(event)
        return event

    def place_entry(self, entry: entries_pb2.Entry, *, recovery: bool = False) -> entries_pb2.Entry:
        """Emit entry_added for ``entry`` (seq and timestamp stamped); return the placed entry."""
        placed = entries_pb2.Entry()
        placed.CopyFrom(entry)
        placed.seq = self.revision + 1
        placed.timestamp.CopyFrom(stamp(self.now))
        self.emit("entry_added", events_pb2.EntryAddedEvent(entry=placed), recovery=recovery)
        self.entries.append(placed)
        return placed

    def record_usage(
        self,
        usage_id: str,
        usage: messages_pb2.Usage,
        totals: messages_pb2.Usage,
        *,
        entry_id: str | None,
        adjustment: bool = False,
        recovery: bool = False,
    ) -> messages_pb2.Usage:
        """Emit a usage event for a new ledger row; return the new totals."""
        row = events_pb2.UsageRow(id=usage_id, seq=self.revision + 1, adjustment=adjustment)
        row.usage.CopyFrom(usage)
        if entry_id is not None:
            row.entry_id = entry_id
        new_totals = add_usage(totals, usage)
        self.emit("usage", events_pb2.UsageEvent(row=row, totals=new_totals), recovery=recovery)
        self.usage_rows.append(row)
        return new_totals
