"""Background upkeep of a service process: event-log retention and reconciling runs that no
driver holds any more. Every process runs both; each step is an idempotent transaction. With
the metrics endpoint on, also the NOTIFY queue gauge."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import psycopg

from service import metrics
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


RECONCILE_INTERVAL_SECONDS = 1.0


async def reconcile_forever(
    store: Store, orphan_after: timedelta, interval: float = RECONCILE_INTERVAL_SECONDS
) -> None:
    """End leased runs whose lease lapsed (aborted ones at once, orphans after
    ``orphan_after``), every ``interval`` seconds."""
    while True:
        try:
            ended = await store.reconcile_orphans(orphan_after)
            if ended:
                log.info("reconciled %d runs no driver holds: %s", len(ended), ", ".join(ended))
        except (psycopg.Error, OSError) as exc:
            log.warning("reconciliation failed: %s", exc)
        except Exception:
            # A bug must not end reconciliation for the life of the process: log, go on.
            log.exception("reconciliation failed")
        await asyncio.sleep(interval)


NOTIFICATION_QUEUE_INTERVAL_SECONDS = 5.0


async def notification_queue_forever(
    store: Store, interval: float = NOTIFICATION_QUEUE_INTERVAL_SECONDS
) -> None:
    """Refresh ``lane_notification_queue_usage_ratio`` every ``interval`` seconds (the queue
    is the cluster's: every process reads the same figure)."""
    while True:
        try:
            async with store.pool.connection() as conn:
                cur = await conn.execute("SELECT pg_notification_queue_usage()")
                row = await cur.fetchone()
            if row is not None:
                metrics.NOTIFICATION_QUEUE_USAGE.set(row[0])
        except (psycopg.Error, OSError) as exc:
            log.warning("reading the NOTIFY queue usage failed: %s", exc)
        await asyncio.sleep(interval)
