"""Background upkeep of a service process: retention (of the event log and of stored answers)
and reconciling runs that no driver holds any more (with the tool results a StageToolOutcome
staged but could not place). Every process runs both; each step is an idempotent transaction.
With the metrics endpoint on, also the NOTIFY queue gauge."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import psycopg

from lane.server import metrics
from lane.server.commands.pending_placement import QUIET_BEFORE_PLACING, place_quiet_pending
from lane.server.store import Store
from lane.server.store.retention import KEEP_ANSWERS

log = logging.getLogger(__name__)

RETENTION_INTERVAL_SECONDS = 600.0


async def retention_forever(
    store: Store,
    interval: float = RETENTION_INTERVAL_SECONDS,
    keep_answers: timedelta = KEEP_ANSWERS,
) -> None:
    """Enforce retention every ``interval`` seconds (every process may: it is idempotent)."""
    while True:
        await retention_pass(store, keep_answers)
        await asyncio.sleep(interval)


async def retention_pass(store: Store, keep_answers: timedelta = KEEP_ANSWERS) -> None:
    """One pass: event-log retention, then answers older than ``keep_answers`` (each step
    logged and survived when it fails)."""
    try:
        floors = await store.enforce_retention()
        if floors:
            log.info("retention advanced the floor of %d lanes", len(floors))
    except (psycopg.Error, OSError) as exc:
        log.warning("retention failed: %s", exc)
    try:
        pruned = await store.prune_answers(keep_answers)
        if pruned:
            log.info("retention deleted %d stored answers", pruned)
    except (psycopg.Error, OSError) as exc:
        log.warning("pruning stored answers failed: %s", exc)


RECONCILE_INTERVAL_SECONDS = 1.0


async def reconcile_forever(
    store: Store,
    orphan_after: timedelta,
    quiet_for: timedelta = QUIET_BEFORE_PLACING,
    interval: float = RECONCILE_INTERVAL_SECONDS,
) -> None:
    """End leased runs whose lease lapsed (aborted ones at once, orphans after
    ``orphan_after``), and place what is left unplaced on lanes quiet for ``quiet_for``, every
    ``interval`` seconds."""
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
        await place_pending_pass(store, quiet_for)
        await asyncio.sleep(interval)


async def place_pending_pass(store: Store, quiet_for: timedelta = QUIET_BEFORE_PLACING) -> None:
    """Place the ready calls a StageToolOutcome staged but could not place, on lanes quiet for
    ``quiet_for`` (service/lane/server/commands/pending_placement.py); logged and survived when
    it fails."""
    try:
        for lane, ids in await place_quiet_pending(store, quiet_for):
            log.info("placed %s on lane %s/%s", ", ".join(ids), lane.namespace, lane.lane_id)
    except (psycopg.Error, OSError) as exc:
        log.warning("placing pending tool results failed: %s", exc)
    except Exception:
        log.exception("placing pending tool results failed")


NOTIFICATION_QUEUE_INTERVAL_SECONDS = 5.0


async def notification_queue_forever(
    store: Store, interval: float = NOTIFICATION_QUEUE_INTERVAL_SECONDS
) -> None:
    """Refresh ``lane_notification_queue_usage_ratio`` every ``interval`` seconds (the queue
    is the cluster's: every process reads the same figure)."""
    while True:
        try:
            usage = await store.notification_queue_usage()
            if usage is not None:
                metrics.current.notification_queue_usage.set(usage)
        except (psycopg.Error, OSError) as exc:
            log.warning("reading the NOTIFY queue usage failed: %s", exc)
        await asyncio.sleep(interval)
