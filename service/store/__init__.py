"""PostgreSQL persistence: schema, migrations, commands as transactions, snapshot capture."""

from service.store.lane_ref import DEFAULT_NAMESPACE, LANE_SCAN, LaneRef
from service.store.lane_store import SnapshotOutline, Store

__all__ = ["DEFAULT_NAMESPACE", "LANE_SCAN", "LaneRef", "SnapshotOutline", "Store"]
