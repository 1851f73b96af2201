"""Liveness and readiness: what load balancers and Kubernetes probes are told.

* **Live** while the process answers: the gRPC health service ``liveness`` is SERVING from
  start-up until shutdown begins, whatever the database does (and ``GET /livez`` on the HTTP
  port answers 200). A liveness probe that failed during a database outage would restart
  processes that have nothing wrong with them and follow the database back on their own.
* **Ready** while the database is reachable and takes writes: ``lane.v1.LaneService`` and the
  server's overall status (service ``""``) are SERVING then, and NOT_SERVING while no
  connection to a writable server can be made (PostgreSQL down, a failover under way, only a
  standby reachable), and from the start of shutdown on (``GET /readyz``: 200 or 503). A process
  that is not ready still answers, UNAVAILABLE at once; a balancer should send its traffic
  elsewhere meanwhile.

The database is checked every second (:func:`lane.server.store.pool.unready_reason`: a command
that used a connection well in that second is proof enough, else a probe through the pool), at
once when an attempt to connect fails, and every quarter second while not ready: the probe,
like a waiting command, makes the pool try to connect, so an idle process follows a promoted
standby as promptly as a busy one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from grpc_health.v1 import health_pb2

from lane.server.store import Store

_log = logging.getLogger(__name__)

#: The gRPC health service name of liveness (readiness: ``lane.v1.LaneService`` and ``""``).
LIVENESS_SERVICE = "liveness"
#: How often the database is checked while ready, and while not.
READY_CHECK_SECONDS = 1.0
UNREADY_CHECK_SECONDS = 0.25

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Readiness:
    """This process's readiness, kept in the gRPC health service (see the module docstring)."""

    def __init__(self, store: Store, health_servicer: Any, services: tuple[str, ...]) -> None:
        self._store = store
        self._health = health_servicer
        #: The health services that report readiness.
        self._services = services
        self.ready = True
        #: Why not ready ('' when ready).
        self.reason = ""
        self._stopping = False

    async def start(self) -> None:
        """Report liveness and readiness SERVING (start-up has just reached the database)."""
        for name in (LIVENESS_SERVICE, *self._services):
            await self._health.set(name, _SERVING)

    async def watch_forever(self) -> None:
        """Check the database and report what it finds, until cancelled."""
        while True:
            await self._report(await self._store.unready_reason(READY_CHECK_SECONDS))
            if not (self.ready and self._store.reachable()):
                await asyncio.sleep(UNREADY_CHECK_SECONDS)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(READY_CHECK_SECONDS):
                    await self._store.wait_unreachable()

    def shutting_down(self) -> None:
        """Shutdown has begun: not ready from now on (the health service says so itself)."""
        self._stopping = True
        self.ready = False
        self.reason = "the server is shutting down"

    async def _report(self, reason: str | None) -> None:
        if self._stopping:
            return
        ready = reason is None
        if ready == self.ready:
            self.reason = reason or ""
            return
        self.ready, self.reason = ready, reason or ""
        if ready:
            _log.info("ready again: the database takes writes")
        else:
            _log.warning("not ready: %s", reason)
        for name in self._services:
            await self._health.set(name, _SERVING if ready else _NOT_SERVING)
