"""Background upkeep of a service process: event-log retention."""

from __future__ import annotations

import asyncio
import logging

import psycopg

from service.store import Store
from service.store.retention import enforce_retention

log = logging.getLogger(__name__)

RETENTION_INTERVAL_SECONDS = 600.0


async def retention_forever(store: Store, interval: float = RETENTION_INTERVAL_SECONDS) -> None:
    """Enforce retention every ``interval`` seconds (every process may: it is idempotent)."""
    while True:
        try:
            floors = await enforce_retention(store.pool)
            if floors:
                log.info("retention advanced the floor of %d lanes", len(floors))
        except (psycopg.Error, OSError) as exc:
            log.warning("retention failed: %s", exc)
        await asyncio.sleep(interval)
