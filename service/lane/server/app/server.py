"""Start-up and shutdown of the lane service process.

:func:`start_server` assembles one running service: the database (the configured one, or an
embedded PostgreSQL), the store with its migrations applied, the watch hub (NOTIFY and polling
per ``LANE_NOTIFY`` / ``LANE_POLL_INTERVAL_SECONDS``), and a ``grpc.aio`` server carrying
LaneService, health checking and server reflection, plus the Prometheus endpoint when
``LANE_METRICS_LISTEN`` is set. It installs the process's metrics registry first
(``service/lane/server/metrics.py``: importing the service registers nothing), so every server of
the process counts into the one registry. Tests use it directly; ``service/lane/server/app/main.py``
runs it as a process until SIGTERM or SIGINT, once per process: alone, or as one of the workers of
``lane serve --workers N`` (``service/lane/server/app/supervisor.py``), which share the port.

Shutdown order: health flips every service to NOT_SERVING (load balancers and watchers of the
health stream see it first), in-flight calls get the grace period, then the background tasks
and the metrics endpoint stop (it answers scrapes through the grace period), the hub stops, the
store's pool closes, and the embedded PostgreSQL (if any) stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc
import psycopg
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from lane.limits import MAX_MESSAGE_BYTES, MIN_CLIENT_PING_INTERVAL_MS
from lane.v1 import lane_service_pb2
from prometheus_client import CollectorRegistry

from lane.server.api import LaneServicer, WatchSettings, add_lane_service
from lane.server.api.auth import Authenticator
from lane.server.api.fair_shares import ShareLimits, ShareSettings
from lane.server.app.config import (
    Settings,
    is_loopback,
    mask_password,
    parse_listen,
    require_auth_or_loopback,
)
from lane.server.app.embedded import EmbeddedPostgres, start_embedded
from lane.server.app.http_server import HttpEndpoint, HttpStartupError, start_http
from lane.server.app.maintenance import (
    notification_queue_forever,
    reconcile_forever,
    retention_forever,
)
from lane.server.app.readiness import Readiness
from lane.server.app.reflection import add_reflection
from lane.server.hub import Hub
from lane.server.metrics import MetricsEndpoint, serve_metrics
from lane.server.metrics import install as install_metrics
from lane.server.store import DEFAULT_NAMESPACE, Clock, Store, system_clock
from lane.server.store.pool import MIN_IDLE_CONNECTIONS

_log = logging.getLogger(__name__)

LANE_SERVICE_NAME: str = lane_service_pb2.DESCRIPTOR.services_by_name["LaneService"].full_name

# Published message size limits. Both equal gRPC's default receive limit, so any client with
# default settings (grpcurl, a plain stub) can receive every message the service sends. The api
# layer must therefore refuse payloads whose event would not fit, and snapshot chunks must stay
# below MAX_SEND_MESSAGE_BYTES.
MAX_RECEIVE_MESSAGE_BYTES = MAX_MESSAGE_BYTES
MAX_SEND_MESSAGE_BYTES = MAX_MESSAGE_BYTES

# Keepalive. WatchLane streams are long-lived, so clients ping to notice a dead server or a
# dropped NAT mapping; a server that does not permit their ping rate answers with GOAWAY
# "too_many_pings" and ends every stream on the connection. Clients may ping every 10 s or
# more slowly, with or without active calls (MIN_CLIENT_PING_INTERVAL_MS, the contract's).
# The server pings idle connections too, so a watcher whose host vanished is noticed and its
# stream and resources released instead of being held until TCP gives up (hours).
SERVER_KEEPALIVE_TIME_MS = 60_000
SERVER_KEEPALIVE_TIMEOUT_MS = 20_000

# Calls gRPC core may hold before the service takes them up (see SERVER_OPTIONS).
MAX_PENDING_CALLS = 100_000
MAX_UNREQUESTED_SECONDS = 600

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
    # 0 = no limit on the server's own pings between data frames; idle watch streams need them.
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC sets SO_REUSEPORT by default on Linux, so a second server on the same port would
    # start "successfully" and silently share the traffic. Fail loudly instead.
    ("grpc.so_reuseport", 0),
    # gRPC core queues calls the server has not taken up yet and, past a soft limit of 1,000
    # (3,000 hard), cancels them at random with no status of their own: a reconnect storm of
    # watchers lost 10-30 % of its streams so. Queue them all; the service itself admits or
    # refuses each with a reason and a retry delay (service/lane/server/api/watch.py, admit).
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
    # Likewise a call still not taken up after 30 s (a storm larger than a process takes up
    # in that time) is cancelled bare; let it wait for its client's own deadline instead.
    ("grpc.server_max_unrequested_time_in_server", MAX_UNREQUESTED_SECONDS),
    # No max_connection_age: it ends long watch streams (clients would resume, but needlessly).
    # Deployments behind a load balancer that need rebalancing can add it.
)

# The options of a worker under ``lane serve --workers N`` (service/lane/server/app/supervisor.py):
# the same, but sharing the port with its sibling workers on purpose. The supervisor checked that
# nothing else listens there before it started them.
WORKER_SERVER_OPTIONS: tuple[tuple[str, int], ...] = tuple(
    (name, 1 if name == "grpc.so_reuseport" else value) for name, value in SERVER_OPTIONS
)

# How long start-up waits for the database to accept a connection before giving up.
_CONNECT_TIMEOUT_SECONDS = 10


def transport_description(settings: Settings) -> str:
    """``plaintext``, ``TLS`` or ``TLS, client certificates required``."""
    if settings.tls_cert_file is None:
        return "plaintext"
    return "TLS, client certificates required" if settings.tls_client_ca_file else "TLS"


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the configured files (None: plaintext)."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    client_ca = settings.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())],
        root_certificates=client_ca.read_bytes() if client_ca else None,
        require_client_auth=client_ca is not None,
    )


class StartupError(RuntimeError):
    """The service could not start: database unreachable, address not bindable, ..."""


@dataclass
class RunningServer:
    """One started service. Stop it with :meth:`stop`."""

    server: grpc.aio.Server
    store: Store
    hub: Hub
    health: Any  # grpc_health.v1.health.aio.HealthServicer (the package ships no types)
    port: int
    address: str
    database: str  # human-readable, never with a password
    applied_migrations: list[str]
    #: The process's metrics registry (the endpoint serves it; tests read it).
    registry: CollectorRegistry
    embedded: EmbeddedPostgres | None = None
    maintenance: list[asyncio.Task[None]] = field(default_factory=list)
    #: The Prometheus endpoint (``LANE_METRICS_LISTEN``), None when off.
    metrics: MetricsEndpoint | None = None
    #: The LaneService servicer (its DriveLane sessions end on shutdown).
    lane_servicer: LaneServicer | None = None
    #: The Connect / gRPC-Web port (``LANE_HTTP_LISTEN``), None when off.
    http: HttpEndpoint | None = None
    #: Liveness and readiness, as the health service and the HTTP probe paths report them.
    readiness: Readiness | None = None
    _stop_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics endpoint is bound to (None when off)."""
        return None if self.metrics is None else self.metrics.port

    @property
    def http_port(self) -> int | None:
        """The port Connect and gRPC-Web are served on (None when off)."""
        return None if self.http is None else self.http.port

    async def stop(self, grace: float | None = None) -> None:
        """Shut down gracefully: NOT_SERVING, let calls finish for ``grace`` s, close, stop.

        ``grace=None`` cancels in-flight calls at once. Safe to call more than once; later
        calls wait for the first to finish.
        """
        async with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                if self.readiness is not None:
                    self.readiness.shutting_down()
                await self.health.enter_graceful_shutdown()
                # Watch streams never finish on their own: end them with UNAVAILABLE now so
                # clients resume elsewhere instead of holding shutdown for the grace period.
                self.hub.close_watchers()
                # Likewise DriveLane sessions: they stop reading, answer what they read, and
                # end with UNAVAILABLE, so drivers send the rest on a new stream elsewhere.
                if self.lane_servicer is not None:
                    self.lane_servicer.drive_sessions.close()
                # Both ports drain together, each for the grace period.
                await asyncio.gather(
                    self.server.stop(grace),
                    *([self.http.stop(grace)] if self.http is not None else []),
                )
            finally:
                for task in self.maintenance:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                if self.metrics is not None:
                    await asyncio.to_thread(self.metrics.stop)
                await _release(self.hub, self.store, self.embedded)
            _log.info("lane service on %s stopped", self.address)


async def start_server(
    target: Settings | str,
    *,
    listen: str | None = None,
    watch: WatchSettings | None = None,
    reuse_port: bool = False,
    http_listen: str | None = None,
    clock: Clock = system_clock,
) -> RunningServer:
    """Start the service and return it running.

    ``target`` is either full :class:`Settings` or just a database URL (then the server listens
    on ``127.0.0.1:0``, a free port). ``listen`` overrides the address in either case, and
    ``watch`` the watch settings (default: the published ones, with the watcher limits of
    ``target``). Opens the store, applies pending migrations, and serves LaneService, health
    and reflection. ``reuse_port`` binds with ``SO_REUSEPORT`` (:data:`WORKER_SERVER_OPTIONS`):
    only for the workers of ``lane serve --workers N``, which share one port (the HTTP port
    too). ``http_listen`` overrides ``LANE_HTTP_LISTEN``: serve Connect and gRPC-Web there.
    ``clock`` is the time the store's commands and the reconciler decide with (tests move
    their own to let leases lapse without waiting; service/lane/server/store/clock.py). Raises
    :class:`StartupError` when the database is unreachable or the address cannot be bound;
    whatever was started by then is stopped again.
    """
    settings = target if isinstance(target, Settings) else Settings(database_url=target)
    if listen is not None or not isinstance(target, Settings):
        address = parse_listen("listen", listen or "127.0.0.1:0")
        settings = dataclasses.replace(settings, listen=address)
    if http_listen is not None:
        settings = dataclasses.replace(
            settings, http_listen=parse_listen("http_listen", http_listen)
        )
    require_auth_or_loopback(settings)
    registry = install_metrics()

    embedded: EmbeddedPostgres | None = None
    store: Store | None = None
    hub: Hub | None = None
    server: grpc.aio.Server | None = None
    metrics: MetricsEndpoint | None = None
    http: HttpEndpoint | None = None
    try:
        if settings.database_url is None:
            # pgserver blocks (initdb, pg_ctl): keep the event loop free meanwhile.
            embedded = await asyncio.to_thread(start_embedded, settings.data_dir)
            dsn, database = embedded.uri, f"embedded PostgreSQL at {embedded.cluster_dir}"
        else:
            dsn, database = settings.database_url, mask_password(settings.database_url)
        await check_database(dsn, database)
        store = await Store.open(
            dsn,
            min_size=min(MIN_IDLE_CONNECTIONS, settings.db_pool_size),
            max_size=settings.db_pool_size,
            checkout_timeout=settings.db_checkout_timeout_seconds,
            reconnect_seconds=settings.db_reconnect_seconds,
            clock=clock,
        )
        applied = await store.migrate()
        hub = Hub(
            store,
            notify=settings.notify,
            poll_interval=settings.poll_interval_seconds,
            reconnect_seconds=settings.db_reconnect_seconds,
        )
        await hub.start()

        server = grpc.aio.server(options=WORKER_SERVER_OPTIONS if reuse_port else SERVER_OPTIONS)
        watch = watch or WatchSettings(
            max_watchers_per_lane=settings.max_watchers_per_lane,
            max_watchers_per_process=settings.max_watchers,
            max_watchers_per_namespace=_per_namespace(
                settings, settings.max_watchers_per_namespace, settings.max_watchers
            ),
            write_deadline_seconds=settings.watch_write_deadline_seconds,
            stream_bytes=settings.watch_stream_bytes,
            # Half the pool at most: a reconnect storm never keeps commands from the database.
            max_concurrent_reads=max(1, settings.db_pool_size // 2),
        )
        health_servicer, lane_servicer = await _add_services(
            server, store, hub, watch, Authenticator(settings.auth_tokens), _shares(settings)
        )
        readiness = Readiness(store, health_servicer, (health.OVERALL_HEALTH, LANE_SERVICE_NAME))
        await readiness.start()
        try:
            credentials = server_credentials(settings)
            port = (
                server.add_insecure_port(settings.listen)
                if credentials is None
                else server.add_secure_port(settings.listen, credentials)
            )
        except RuntimeError as err:
            raise StartupError(f"cannot listen on {settings.listen}: {err}") from None
        metrics = await _start_metrics(registry, settings.metrics_listen)
        await server.start()
        if settings.http_listen is not None:
            try:
                http = await start_http(
                    settings,
                    settings.http_listen,
                    lane_servicer,
                    reuse_port=reuse_port,
                    readiness=readiness,
                )
            except HttpStartupError as err:
                raise StartupError(str(err)) from None
    except BaseException:
        # Also on cancellation: a half-started service must not leak a pool or a PostgreSQL.
        if http is not None:
            await http.stop(None)
        if server is not None:
            await server.stop(None)
        if metrics is not None:
            await asyncio.to_thread(metrics.stop)
        await _release(hub, store, embedded)
        raise

    host = settings.listen.rpartition(":")[0]
    running = RunningServer(
        server=server,
        store=store,
        hub=hub,
        health=health_servicer,
        port=port,
        address=f"{host}:{port}",
        database=database,
        applied_migrations=applied,
        registry=registry,
        embedded=embedded,
        maintenance=[
            asyncio.create_task(
                retention_forever(
                    store, keep_answers=timedelta(seconds=settings.request_retention_seconds)
                ),
                name="retention",
            ),
            asyncio.create_task(
                reconcile_forever(
                    store,
                    timedelta(seconds=settings.orphan_seconds),
                    timedelta(seconds=settings.place_quiet_seconds),
                ),
                name="reconcile",
            ),
            asyncio.create_task(readiness.watch_forever(), name="readiness"),
            # The queue-usage gauge is read by scrapes only: refresh it only when they can come.
            *(
                [asyncio.create_task(notification_queue_forever(store), name="notify-queue")]
                if metrics is not None
                else []
            ),
        ],
        metrics=metrics,
        lane_servicer=lane_servicer,
        http=http,
        readiness=readiness,
    )
    _log.info(
        "lane service listening on %s (%s); database: %s; migrations applied now: %s;"
        " event loop: %s",
        running.address,
        transport_description(settings),
        database,
        ", ".join(applied) if applied else "none (schema up to date)",
        type(asyncio.get_running_loop()).__module__.partition(".")[0],
    )
    if http is not None:
        scheme = "http" if settings.tls_cert_file is None else "https"
        _log.info(
            "Connect and gRPC-Web on %s://%s (LaneService at /%s/<method>); web view at %s://%s/",
            scheme,
            http.address,
            LANE_SERVICE_NAME,
            scheme,
            http.address,
        )
    if metrics is not None:
        _log.info("Prometheus metrics on http://%s/metrics", metrics.address)
    _log_auth(settings)
    return running


def _log_auth(settings: Settings) -> None:
    if not settings.auth_tokens:
        _log.warning(
            "auth is OFF: every caller reaches every lane (namespace %r); allowed because %s "
            "is a loopback address. Set LANE_AUTH_TOKENS to require bearer tokens.",
            DEFAULT_NAMESPACE,
            settings.listen,
        )
        return
    namespaces = sorted(set(settings.auth_tokens.values()))
    _log.info("auth: bearer tokens for %d namespace(s): %s", len(namespaces), ", ".join(namespaces))
    if settings.tls_cert_file is None and not is_loopback(settings.listen):
        _log.warning("bearer tokens travel in plaintext on %s: configure TLS", settings.listen)


async def _start_metrics(registry: CollectorRegistry, listen: str | None) -> MetricsEndpoint | None:
    """Serve ``registry`` on ``listen`` (``host:port``), or nothing when None."""
    if listen is None:
        return None
    host, _, port = listen.rpartition(":")
    try:
        return await asyncio.to_thread(serve_metrics, registry, host, int(port))
    except OSError as err:
        raise StartupError(f"cannot serve metrics on {listen}: {err}") from None


async def _release(hub: Hub | None, store: Store | None, embedded: EmbeddedPostgres | None) -> None:
    """Stop the hub, close the store, stop the embedded PostgreSQL: each even if one fails."""
    async with contextlib.AsyncExitStack() as cleanup:
        # Callbacks run last-pushed first: hub (it uses the store), store, then PostgreSQL.
        if embedded is not None:
            cleanup.push_async_callback(asyncio.to_thread, embedded.stop)
        if store is not None:
            cleanup.push_async_callback(store.close)
        if hub is not None:
            cleanup.push_async_callback(hub.stop)


async def check_database(dsn: str, database: str) -> None:
    """Connect once to ``dsn``; raise :class:`StartupError` naming ``database`` (never a
    password) and the server's reason when that fails."""
    # The pool retries silently for 30 s on a bad host or password and then reports only a
    # timeout; one direct connection fails fast with the server's own reason.
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=_CONNECT_TIMEOUT_SECONDS)
    except psycopg.OperationalError as err:
        reason = str(err).strip()
        raise StartupError(f"cannot connect to the database {database}: {reason}") from None
    await conn.close()


def _per_namespace(settings: Settings, limit: int, process_limit: int) -> int:
    """A namespace's limit: its own when the tokens name two or more namespaces; else the
    process's, since the one namespace is all the process serves."""
    return limit if len(set(settings.auth_tokens.values())) > 1 else process_limit


def _shares(settings: Settings) -> ShareSettings:
    """The caps of DriveLane sessions and of exports and imports (fair_shares.py)."""
    return ShareSettings(
        sessions=ShareLimits(
            settings.max_sessions,
            _per_namespace(settings, settings.max_sessions_per_namespace, settings.max_sessions),
        ),
        transfers=ShareLimits(
            settings.max_transfers,
            _per_namespace(settings, settings.max_transfers_per_namespace, settings.max_transfers),
        ),
    )


async def _add_services(
    server: grpc.aio.Server,
    store: Store,
    hub: Hub,
    watch: WatchSettings | None,
    authenticator: Authenticator,
    shares: ShareSettings,
) -> tuple[Any, LaneServicer]:
    """Register LaneService, health (all SERVING; readiness.py keeps it true) and reflection;
    return the health servicer and the LaneService servicer.

    Health and reflection stay open without a token: probes and tools need them, and they
    reveal no lane."""
    lane_servicer = add_lane_service(server, store, hub, watch, authenticator, shares)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in (health.OVERALL_HEALTH, LANE_SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    add_reflection(server, (LANE_SERVICE_NAME, health.SERVICE_NAME))
    return health_servicer, lane_servicer
