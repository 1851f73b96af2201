"""PostgreSQL persistence: schema, migrations, commands as transactions, snapshot capture."""

from lane.server.store.clock import Clock, system_clock
from lane.server.store.event_log import EventGroup, read_was_full
from lane.server.store.lane_ref import DEFAULT_NAMESPACE, LANE_SCAN, LaneRef
from lane.server.store.lane_store import Store
from lane.server.store.lane_summaries import ActivityPosition, LaneFilter, SummaryRow
from lane.server.store.lane_transfer import IMPORT_COLUMNS, ExportPage, ImportBatch
from lane.server.store.notify import ChannelError, Listener, Notification, Notifier
from lane.server.store.store_reads import (
    IncarnationGone,
    LaneHead,
    ResumePoint,
    SnapshotOutline,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "IMPORT_COLUMNS",
    "LANE_SCAN",
    "ActivityPosition",
    "ChannelError",
    "Clock",
    "EventGroup",
    "ExportPage",
    "ImportBatch",
    "IncarnationGone",
    "LaneFilter",
    "LaneHead",
    "LaneRef",
    "Listener",
    "Notification",
    "Notifier",
    "ResumePoint",
    "SnapshotOutline",
    "Store",
    "SummaryRow",
    "read_was_full",
    "system_clock",
]
