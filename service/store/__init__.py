"""PostgreSQL persistence: schema, migrations, commands as transactions, snapshot capture."""

from service.store.lane_store import Store

__all__ = ["Store"]
