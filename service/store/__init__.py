"""PostgreSQL persistence: schema, migrations, commands as transactions, snapshot capture."""

from service.store.clock import Clock, system_clock
from service.store.event_log import EventGroup, read_was_full
from service.store.lane_ref import DEFAULT_NAMESPACE, LANE_SCAN, LaneRef
from service.store.lane_store import ResumePoint, SnapshotOutline, Store
from service.store.notify import ChannelError, Listener, Notification, Notifier

__all__ = [
    "DEFAULT_NAMESPACE",
    "LANE_SCAN",
    "ChannelError",
    "Clock",
    "EventGroup",
    "LaneRef",
    "Listener",
    "Notification",
    "Notifier",
    "ResumePoint",
    "SnapshotOutline",
    "Store",
    "read_was_full",
    "system_clock",
]
