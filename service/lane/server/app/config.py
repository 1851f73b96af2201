"""The service's settings, read once from environment variables.

Every variable is optional; an empty value counts as unset.

``LANE_DATABASE_URL``
    PostgreSQL connection string (``postgresql://user:pass@host:5432/db`` or libpq
    ``key=value`` form). Unset: the service starts an embedded PostgreSQL (the ``pgserver``
    wheel) in ``LANE_DATA_DIR`` and stops it again on shutdown, keeping the data.
``LANE_DATA_DIR``
    Directory of the embedded PostgreSQL; ignored when ``LANE_DATABASE_URL`` is set.
    Default ``.lane-data`` in the current directory.
``LANE_LISTEN``
    ``host:port`` the gRPC server binds (``[::1]:50051`` for IPv6; port 0 picks a free port).
    Default ``127.0.0.1:50051``.
``LANE_WORKERS``
    How many server processes serve ``LANE_LISTEN`` (``lane serve --workers N`` overrides it); a
    whole number >= 1. Default: the number of CPUs (``os.cpu_count()``). 1 is a single process;
    more starts a supervisor that runs that many worker processes on the one port (Linux
    ``SO_REUSEPORT``), each with its own pool and hub, all on one database. See
    ``service/lane/server/app/supervisor.py`` and docs/deploying.md.
``LANE_GRACE_SECONDS``
    On SIGTERM/SIGINT, how long in-flight calls may run before they are cancelled; a number
    of seconds >= 0. Default ``5``.
``LANE_NOTIFY``
    ``on`` or ``off`` (also ``true``/``false``, ``1``/``0``, ``yes``/``no``): whether the hub
    rings and listens for PostgreSQL NOTIFY doorbells. Off, watchers are fed by polling alone.
    Default ``on``.
``LANE_POLL_INTERVAL_SECONDS``
    How often the hub polls the event log as a fallback to NOTIFY; ``0 < seconds <= 60``.
    Default ``1.0``: without NOTIFY, watchers get each commit within this interval
    (docs/contract.md, WatchLane).
``LANE_ORPHAN_SECONDS``
    How long a leased run may sit with no live lease and no abort before the service ends it
    itself (aborted, every unfinished call settled; see docs/recovery.md); seconds >= 0.
    A run whose abort was requested is ended as soon as its lease lapses. Default ``600``.
``LANE_PLACE_QUIET_SECONDS``
    How long a lane must go without a commit before the service places, by itself, tool results
    that were staged but whose placement commit failed (docs/recovery.md); seconds >= 0. Far
    longer than a placement takes, so a placement about to commit is never taken from its
    command. Default ``5``.
``LANE_MAX_WATCHERS_PER_LANE``, ``LANE_MAX_WATCHERS``, ``LANE_MAX_WATCHERS_PER_NAMESPACE``
    How many WatchLane streams this process serves at once of one lane, of all lanes, and of
    one namespace's lanes; a stream over any is refused with RESOURCE_EXHAUSTED
    ``TOO_MANY_WATCHERS``. Whole numbers >= 1. Defaults ``1000``, ``10000`` and ``5000``.
``LANE_MAX_SESSIONS``, ``LANE_MAX_SESSIONS_PER_NAMESPACE``
    How many DriveLane streams this process serves at once, in all and of one namespace; past
    either a new stream is refused RESOURCE_EXHAUSTED ``TOO_MANY_SESSIONS``. Whole numbers >= 1.
    Defaults ``2000`` and ``1000``.
``LANE_MAX_TRANSFERS``, ``LANE_MAX_TRANSFERS_PER_NAMESPACE``
    How many ExportLane and ImportLane calls this process serves at once, in all and of one
    namespace; past either a call is refused RESOURCE_EXHAUSTED ``TOO_MANY_TRANSFERS``. Whole
    numbers >= 1. Defaults ``16`` and ``8``.

The per-namespace limits apply when the tokens name two or more namespaces (with one
namespace, or auth off, the process limits are the only ones): one namespace at its limit
then leaves the rest of the process's to the others (``service/lane/server/api/fair_shares.py``).
``LANE_WATCH_WRITE_DEADLINE_SECONDS``
    How long a WatchLane stream may wait for its client to take what it was sent (HTTP/2 flow
    control: the client stopped reading and the buffers between are full) before the service
    ends it with RESOURCE_EXHAUSTED ``WATCHER_TOO_SLOW`` and its ``lastRevision``, freeing its
    slot at that moment; likewise a DriveLane stream whose client takes no answer, ended
    ``SESSION_TOO_SLOW``; ``0 < seconds <= 3600``. Default ``30``.
``LANE_WATCH_STREAM_BYTES``
    The byte budget of one WatchLane stream: reads of the event log for a watcher catching up
    take whole event groups up to half of it (at least one group), the other half covers the
    message in flight; a whole number >= 65536. Default ``8388608`` (8 MiB). A stream that
    does not read holds about this much of the server's memory at most, whatever its lane
    holds (docs/deploying.md).
``LANE_DB_POOL_SIZE``
    How many PostgreSQL connections this process opens at most for commands, reads and upkeep
    (the hub's LISTEN and doorbell connections come on top); a whole number >= 1. Default
    ``10``: a command holds its connection for one short transaction (a millisecond or two),
    so 10 carry more commands a second than one Python process can answer, and each of the
    ``LANE_WORKERS`` processes has a pool of its own: the service may open up to
    workers x (size + 2) connections, which must stay below the server's ``max_connections``
    (100 by default). Raise it when commands answer ``DATABASE_BUSY`` while the database
    itself is not the bottleneck (many commands waiting on one lane's lock hold connections).
``LANE_DB_CHECKOUT_TIMEOUT_SECONDS``
    How long a command waits for a free connection while every one is busy with other
    commands; ``0 < seconds <= 300``. Past it the command is refused with RESOURCE_EXHAUSTED
    ``DATABASE_BUSY`` (nothing written; retry after a backoff). Default ``10``: a burst queues
    instead of failing, and the refusal still comes before a client's usual 30 s deadline (a
    command never waits past its caller's deadline anyway). A database that cannot be reached
    is answered UNAVAILABLE within a second, whatever this says
    (``service/lane/server/store/pool.py``).
``LANE_DB_RECONNECT_SECONDS``
    After an attempt to connect to the database failed (PostgreSQL down, or a failover under
    way), the longest wait before the next; each wait is drawn between half of this and all of
    it, and a command that arrives meanwhile makes the attempt happen sooner;
    ``0.05 <= seconds <= 60``. Default ``1``: a promoted standby is followed within about a
    second (docs/deploying.md, "A replicated PostgreSQL").
``LANE_REQUEST_RETENTION_SECONDS``
    How long the answer to a request id is kept, so a retry with that id returns it; seconds
    >= 60. Default ``86400`` (24 h). Older answers are deleted (checked every 10 minutes),
    except those of a lane's open operation, kept until it ends. A retry whose answer was
    deleted is a new request: retry within the retention.
``LANE_TLS_CERT_FILE``, ``LANE_TLS_KEY_FILE``
    PEM certificate chain and private key: serve gRPC over TLS. Both or neither.
``LANE_TLS_CLIENT_CA_FILE``
    PEM CA bundle: with TLS on, clients must present a certificate it signed (mutual TLS).
``LANE_HTTP_LISTEN``
    ``host:port`` to also serve LaneService on over HTTP: the Connect protocol (JSON or binary,
    HTTP/1.1 or HTTP/2) and gRPC-Web, for browsers and curl; port 0 picks a free port. Unset:
    no HTTP port. Same tokens, TLS files and limits as the gRPC port; with N workers each
    serves it too (``SO_REUSEPORT``). See ``service/lane/server/app/http_server.py``.
``LANE_HTTP_ALLOWED_HOSTS``
    With auth off, the HTTP port serves only requests whose ``Host`` (and ``Origin``, when
    present) name this machine's loopback (``localhost``, ``127.0.0.1``, ``[::1]``) or the
    address it is bound to, so a web page cannot reach it through DNS rebinding; others are
    refused PERMISSION_DENIED ``HOST_NOT_ALLOWED`` (``service/lane/server/api/host_check.py``).
    This lists more host names, comma-separated (no ports); ``*`` serves any. Unset: none. With
    auth on the check is off and this is unused.
``LANE_HTTP_IDLE_TIMEOUT_SECONDS``
    An HTTP connection with no request in progress (idle between requests, or still sending a
    request's headers, or a TLS handshake) is closed after this long; ``0 < seconds <= 3600``.
    Default ``30``. Streams are not idle.
``LANE_HTTP_BODY_TIMEOUT_SECONDS``
    A request's body must arrive in full within this long of its headers, or the call is
    refused DEADLINE_EXCEEDED ``BODY_TIMEOUT`` and its connection closed;
    ``0 < seconds <= 3600``. Default ``60`` (4 MiB at about 0.5 Mbit/s).
``LANE_HTTP_MAX_CONNECTIONS``
    HTTP connections this process keeps open at once; one more is closed as soon as it is
    accepted. A whole number >= 1. Default ``1000``; keep it below the process's open-file
    limit (``ulimit -n``), which the database, gRPC and watchers share.
``LANE_METRICS_LISTEN``
    ``host:port`` to serve Prometheus metrics on over plain HTTP (any path; port 0 picks a free
    port), e.g. ``127.0.0.1:9464``. Unset: no metrics endpoint. It has no auth and names no
    lane; bind it where only the scraper reaches. See ``service/lane/server/metrics.py``. With N
    workers, worker k serves its own metrics on port + k - 1 (port 0: each picks a free port), so
    the ports up to port + N - 1 must exist.
``LANE_LOG_FORMAT``
    ``text`` (one ``time level logger: message [rpc=... lane_id=...]`` line per record) or
    ``json`` (one JSON object per line, with ``rpc``, ``namespace``, ``lane_id`` and
    ``operation_id`` of the request being served). Default ``text``. See
    ``service/lane/server/logs.py``.
``LANE_AUTH_TOKENS``, ``LANE_AUTH_TOKENS_FILE``
    Bearer tokens, as ``namespace:token`` pairs separated by commas, spaces or newlines (the
    file: one or more per line, ``#`` comments). Each token admits its callers to its
    namespace's lanes only. Neither set: auth is off, every caller is in namespace
    ``default``, and the service refuses to listen on anything but a loopback address.

``LANE_EVENT_LOOP``
    ``uvloop`` or ``asyncio``: the event loop the process runs on. Default ``uvloop`` (asyncio's
    own where uvloop does not install); see ``service/lane/server/app/event_loop.py``.
``LANE_OTEL``
    ``on`` or ``off``: OpenTelemetry traces (docs/deploying.md, "Traces"). Default ``off``: no
    span is made and the SDK is not loaded. On, the exporter, endpoint, sampler and service
    name come from the standard ``OTEL_*`` variables (``service/lane/server/app/tracing.py``); it
    needs the ``otel`` extra (``pip install 'lane-service[otel]'``).

A bad value raises :class:`ConfigError`, whose message names the variable.

:data:`SETTINGS` is the one table of these variables with their defaults, for ``lane serve``'s
flags and ``--help``; :meth:`Settings.from_env` reads no variable that is not in it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lane.limits import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_NAMESPACE,
    DEFAULT_MAX_TRANSFERS,
    DEFAULT_MAX_TRANSFERS_PER_NAMESPACE,
    DEFAULT_MAX_WATCHERS,
    DEFAULT_MAX_WATCHERS_PER_LANE,
    DEFAULT_MAX_WATCHERS_PER_NAMESPACE,
)
from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lane.server.api.auth import TokenError, parse_tokens
from lane.server.api.watch import DEFAULT_STREAM_BYTES, DEFAULT_WRITE_DEADLINE_SECONDS
from lane.server.app.event_loop import EVENT_LOOPS
from lane.server.app.tls_files import TlsFileError, check_tls_files
from lane.server.logs import LOG_FORMATS
from lane.server.store.pool import (
    DEFAULT_CHECKOUT_TIMEOUT_SECONDS,
    DEFAULT_POOL_SIZE,
    DEFAULT_RECONNECT_SECONDS,
)
from lane.server.store.retention import KEEP_ANSWERS

T = TypeVar("T")

_TRUE = frozenset({"on", "true", "1", "yes"})
_FALSE = frozenset({"off", "false", "0", "no"})
# An upper bound on the poll interval, only to catch typos such as milliseconds given as seconds.
_MAX_POLL_INTERVAL_SECONDS = 60.0
# The same for the checkout timeout; and answers are kept at least a minute (retries need them).
_MAX_CHECKOUT_TIMEOUT_SECONDS = 300.0
# Reconnecting more often than this would only load a recovering server; more rarely, a typo.
_MIN_RECONNECT_SECONDS = 0.05
_MAX_RECONNECT_SECONDS = 60.0
_MIN_REQUEST_RETENTION_SECONDS = 60.0
# A deadline past an hour is a typo too; and a stream budget must hold a few messages.
_MAX_WRITE_DEADLINE_SECONDS = 3600.0
_MIN_STREAM_BYTES = 64 * 1024
# The HTTP port's timeouts are bounded alike (an hour is a typo).
_MAX_HTTP_TIMEOUT_SECONDS = 3600.0
DEFAULT_HTTP_IDLE_TIMEOUT_SECONDS = 30.0
DEFAULT_HTTP_BODY_TIMEOUT_SECONDS = 60.0
DEFAULT_HTTP_MAX_CONNECTIONS = 1000
# A host name of LANE_HTTP_ALLOWED_HOSTS: a DNS name, an IPv4 address, an IPv6 one in
# brackets, or * (any).
_HOST_NAME = re.compile(r"\*|[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?|\[[0-9A-Fa-f:.]+\]")


class ConfigError(ValueError):
    """An environment variable holds a value the service cannot use."""

    def __init__(self, variable: str, value: str, problem: str) -> None:
        super().__init__(f"{variable}={value!r}: {problem}")
        self.variable = variable
        self.value = value
        self.problem = problem


@dataclass(frozen=True)
class Setting:
    """One ``LANE_*`` variable: its default as shown to people, and what it means."""

    variable: str
    default: str
    meaning: str
    #: A secret: no command-line flag for it (arguments show in every process listing).
    secret: bool = False

    @property
    def flag(self) -> str:
        """The ``lane serve`` flag: ``LANE_DB_POOL_SIZE`` is ``--db-pool-size``."""
        return "--" + self.variable.removeprefix("LANE_").lower().replace("_", "-")


#: Every setting, in the order ``lane serve --help`` lists them.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "LANE_LISTEN",
        "127.0.0.1:50051",
        "host:port to serve gRPC on ([::1]:50051 for IPv6, port 0 for any free port)",
    ),
    Setting(
        "LANE_DATABASE_URL",
        "unset: embedded PostgreSQL in LANE_DATA_DIR",
        "PostgreSQL URL or libpq key=value string (a password in a flag shows in process "
        "listings: prefer the variable)",
    ),
    Setting("LANE_DATA_DIR", "./.lane-data", "directory of the embedded PostgreSQL"),
    Setting(
        "LANE_WORKERS",
        "the number of CPUs",
        "server processes sharing the port under one supervisor (1: a single process)",
    ),
    Setting("LANE_GRACE_SECONDS", "5", "on SIGTERM/SIGINT, seconds calls in flight may still run"),
    Setting("LANE_NOTIFY", "on", "on/off: PostgreSQL NOTIFY doorbells between processes"),
    Setting("LANE_POLL_INTERVAL_SECONDS", "1.0", "period of the polling fallback (0 < s <= 60)"),
    Setting(
        "LANE_ORPHAN_SECONDS", "600", "a leased run with no live lease is ended after this long"
    ),
    Setting(
        "LANE_PLACE_QUIET_SECONDS",
        "5",
        "staged results left unplaced are placed by the service once their lane is this quiet",
    ),
    Setting(
        "LANE_MAX_WATCHERS_PER_LANE",
        str(DEFAULT_MAX_WATCHERS_PER_LANE),
        "WatchLane streams of one lane this process serves",
    ),
    Setting(
        "LANE_MAX_WATCHERS",
        str(DEFAULT_MAX_WATCHERS),
        "WatchLane streams this process serves in all",
    ),
    Setting(
        "LANE_MAX_WATCHERS_PER_NAMESPACE",
        str(DEFAULT_MAX_WATCHERS_PER_NAMESPACE),
        "WatchLane streams of one namespace this process serves (with 2+ namespaces)",
    ),
    Setting(
        "LANE_MAX_SESSIONS",
        str(DEFAULT_MAX_SESSIONS),
        "DriveLane streams this process serves in all",
    ),
    Setting(
        "LANE_MAX_SESSIONS_PER_NAMESPACE",
        str(DEFAULT_MAX_SESSIONS_PER_NAMESPACE),
        "DriveLane streams of one namespace this process serves (with 2+ namespaces)",
    ),
    Setting(
        "LANE_MAX_TRANSFERS",
        str(DEFAULT_MAX_TRANSFERS),
        "ExportLane and ImportLane calls this process serves at once in all",
    ),
    Setting(
        "LANE_MAX_TRANSFERS_PER_NAMESPACE",
        str(DEFAULT_MAX_TRANSFERS_PER_NAMESPACE),
        "ExportLane and ImportLane calls of one namespace at once (with 2+ namespaces)",
    ),
    Setting(
        "LANE_WATCH_WRITE_DEADLINE_SECONDS",
        f"{DEFAULT_WRITE_DEADLINE_SECONDS:g}",
        "a watcher whose client takes nothing for this long is ended WATCHER_TOO_SLOW",
    ),
    Setting(
        "LANE_WATCH_STREAM_BYTES",
        str(DEFAULT_STREAM_BYTES),
        "byte budget of one WatchLane stream's reads and message in flight (>= 65536)",
    ),
    Setting(
        "LANE_DB_POOL_SIZE",
        str(DEFAULT_POOL_SIZE),
        "PostgreSQL connections this process opens at most (plus the hub's two)",
    ),
    Setting(
        "LANE_DB_CHECKOUT_TIMEOUT_SECONDS",
        f"{DEFAULT_CHECKOUT_TIMEOUT_SECONDS:g}",
        "how long a command waits for a free connection before DATABASE_BUSY",
    ),
    Setting(
        "LANE_DB_RECONNECT_SECONDS",
        f"{DEFAULT_RECONNECT_SECONDS:g}",
        "after a failed attempt to connect to the database, the longest wait before the next",
    ),
    Setting(
        "LANE_REQUEST_RETENTION_SECONDS",
        f"{KEEP_ANSWERS.total_seconds():g}",
        "how long the answer to a request id is kept for retries (>= 60)",
    ),
    Setting("LANE_TLS_CERT_FILE", "unset", "PEM certificate chain: serve TLS (with the key)"),
    Setting("LANE_TLS_KEY_FILE", "unset", "PEM private key of the certificate"),
    Setting(
        "LANE_TLS_CLIENT_CA_FILE",
        "unset",
        "PEM CA bundle: clients must present a certificate it signed (mutual TLS)",
    ),
    Setting(
        "LANE_AUTH_TOKENS",
        "unset: auth off, loopback only",
        "bearer tokens as namespace:token pairs",
        secret=True,
    ),
    Setting("LANE_AUTH_TOKENS_FILE", "unset", "a file of namespace:token pairs, # comments"),
    Setting(
        "LANE_HTTP_LISTEN",
        "unset: no HTTP port",
        "host:port to also serve LaneService on over Connect and gRPC-Web (HTTP/1.1, HTTP/2)",
    ),
    Setting(
        "LANE_HTTP_ALLOWED_HOSTS",
        "unset: loopback names only",
        "auth off: more Host names the HTTP port serves (comma-separated, * for any)",
    ),
    Setting(
        "LANE_HTTP_IDLE_TIMEOUT_SECONDS",
        f"{DEFAULT_HTTP_IDLE_TIMEOUT_SECONDS:g}",
        "an HTTP connection without a request in progress is closed after this long",
    ),
    Setting(
        "LANE_HTTP_BODY_TIMEOUT_SECONDS",
        f"{DEFAULT_HTTP_BODY_TIMEOUT_SECONDS:g}",
        "an HTTP request body not in by this long after its headers is refused",
    ),
    Setting(
        "LANE_HTTP_MAX_CONNECTIONS",
        str(DEFAULT_HTTP_MAX_CONNECTIONS),
        "HTTP connections this process keeps open at once",
    ),
    Setting(
        "LANE_METRICS_LISTEN",
        "unset: no metrics",
        "host:port to serve Prometheus metrics on over plain HTTP",
    ),
    Setting("LANE_LOG_FORMAT", "text", "text or json (one JSON object per line)"),
    Setting("LANE_EVENT_LOOP", "uvloop", "uvloop or asyncio"),
    Setting(
        "LANE_OTEL",
        "off",
        "on/off: OpenTelemetry traces, exported as the standard OTEL_* variables say",
    ),
)
_VARIABLES = frozenset(setting.variable for setting in SETTINGS)


@dataclass(frozen=True)
class Settings:
    """Everything the service reads from its environment. See the module docstring."""

    # Kept out of repr: the URL may hold a password, and settings end up in logs and tracebacks.
    database_url: str | None = field(default=None, repr=False)
    data_dir: Path = field(default_factory=lambda: Path.cwd() / ".lane-data")
    listen: str = "127.0.0.1:50051"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    grace_seconds: float = 5.0
    notify: bool = True
    poll_interval_seconds: float = 1.0
    orphan_seconds: float = 600.0
    place_quiet_seconds: float = 5.0
    max_watchers_per_lane: int = DEFAULT_MAX_WATCHERS_PER_LANE
    max_watchers: int = DEFAULT_MAX_WATCHERS
    max_watchers_per_namespace: int = DEFAULT_MAX_WATCHERS_PER_NAMESPACE
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_sessions_per_namespace: int = DEFAULT_MAX_SESSIONS_PER_NAMESPACE
    max_transfers: int = DEFAULT_MAX_TRANSFERS
    max_transfers_per_namespace: int = DEFAULT_MAX_TRANSFERS_PER_NAMESPACE
    watch_write_deadline_seconds: float = DEFAULT_WRITE_DEADLINE_SECONDS
    watch_stream_bytes: int = DEFAULT_STREAM_BYTES
    db_pool_size: int = DEFAULT_POOL_SIZE
    db_checkout_timeout_seconds: float = DEFAULT_CHECKOUT_TIMEOUT_SECONDS
    db_reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS
    request_retention_seconds: float = KEEP_ANSWERS.total_seconds()
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    #: ``host:port`` of the Connect / gRPC-Web port (``LANE_HTTP_LISTEN``), None when off.
    http_listen: str | None = None
    #: Auth off: Host names the HTTP port serves besides the loopback ones (``*``: any).
    http_allowed_hosts: tuple[str, ...] = ()
    http_idle_timeout_seconds: float = DEFAULT_HTTP_IDLE_TIMEOUT_SECONDS
    http_body_timeout_seconds: float = DEFAULT_HTTP_BODY_TIMEOUT_SECONDS
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    metrics_listen: str | None = None
    log_format: str = "text"
    #: ``uvloop`` (where it installs) or ``asyncio``: see ``service/lane/server/app/event_loop.py``.
    event_loop: str = "uvloop"
    #: OpenTelemetry traces (``LANE_OTEL``): see ``service/lane/server/app/tracing.py``.
    otel: bool = False
    #: {token: namespace}; empty = auth off. Secrets: kept out of repr.
    auth_tokens: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the ``LANE_*`` variables of ``environ`` (default ``os.environ``).

        Raises :class:`ConfigError` naming the first variable with a bad value.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            if name not in _VARIABLES:
                raise KeyError(f"{name} is missing from config.SETTINGS")
            value = env.get(name, "").strip()
            return value or None

        def setting(name: str, parse: Callable[[str, str], T], default: T) -> T:
            """``name``'s value as ``parse(name, value)`` reads it, ``default`` when unset."""
            value = get(name)
            return default if value is None else parse(name, value)

        defaults = cls()
        database_url = get("LANE_DATABASE_URL")
        if database_url is not None:
            _check_database_url(database_url)
        counts = {
            name: _count(name, value)
            for name in (
                "LANE_MAX_WATCHERS_PER_NAMESPACE",
                "LANE_MAX_SESSIONS",
                "LANE_MAX_SESSIONS_PER_NAMESPACE",
                "LANE_MAX_TRANSFERS",
                "LANE_MAX_TRANSFERS_PER_NAMESPACE",
            )
            if (value := get(name)) is not None
        }
        cert, key, client_ca = (
            _file(name, get(name))
            for name in ("LANE_TLS_CERT_FILE", "LANE_TLS_KEY_FILE", "LANE_TLS_CLIENT_CA_FILE")
        )
        if (cert is None) != (key is None):
            raise ConfigError(
                "LANE_TLS_KEY_FILE" if key is None else "LANE_TLS_CERT_FILE",
                "",
                "TLS needs both LANE_TLS_CERT_FILE and LANE_TLS_KEY_FILE",
            )
        if client_ca is not None and cert is None:
            raise ConfigError(
                "LANE_TLS_CLIENT_CA_FILE", str(client_ca), "client certificates need TLS on"
            )
        if cert is not None and key is not None:
            try:
                check_tls_files(cert, key, client_ca)
            except TlsFileError as err:
                raise ConfigError(err.variable, str(err.path), err.problem) from None
        tokens = _tokens("LANE_AUTH_TOKENS", get("LANE_AUTH_TOKENS"))
        tokens_file = _file("LANE_AUTH_TOKENS_FILE", get("LANE_AUTH_TOKENS_FILE"))
        if tokens_file is not None:
            from_file = _tokens("LANE_AUTH_TOKENS_FILE", tokens_file.read_text(), str(tokens_file))
            for token, namespace in from_file.items():
                if tokens.setdefault(token, namespace) != namespace:
                    raise ConfigError(
                        "LANE_AUTH_TOKENS_FILE",
                        str(tokens_file),
                        "a token it names is given to another namespace by LANE_AUTH_TOKENS",
                    )
        settings = cls(
            database_url=database_url,
            data_dir=setting(
                "LANE_DATA_DIR",
                lambda _, value: Path(value).expanduser().absolute(),
                defaults.data_dir,
            ),
            listen=setting("LANE_LISTEN", parse_listen, defaults.listen),
            workers=setting("LANE_WORKERS", _count, defaults.workers),
            grace_seconds=setting(
                "LANE_GRACE_SECONDS", partial(_seconds, allow_zero=True), defaults.grace_seconds
            ),
            notify=setting("LANE_NOTIFY", _switch, defaults.notify),
            poll_interval_seconds=setting(
                "LANE_POLL_INTERVAL_SECONDS",
                partial(_seconds, allow_zero=False, maximum=_MAX_POLL_INTERVAL_SECONDS),
                defaults.poll_interval_seconds,
            ),
            orphan_seconds=setting(
                "LANE_ORPHAN_SECONDS", partial(_seconds, allow_zero=True), defaults.orphan_seconds
            ),
            place_quiet_seconds=setting(
                "LANE_PLACE_QUIET_SECONDS",
                partial(_seconds, allow_zero=True),
                defaults.place_quiet_seconds,
            ),
            max_watchers_per_lane=setting(
                "LANE_MAX_WATCHERS_PER_LANE", _count, defaults.max_watchers_per_lane
            ),
            max_watchers=setting("LANE_MAX_WATCHERS", _count, defaults.max_watchers),
            max_watchers_per_namespace=counts.get(
                "LANE_MAX_WATCHERS_PER_NAMESPACE", defaults.max_watchers_per_namespace
            ),
            max_sessions=counts.get("LANE_MAX_SESSIONS", defaults.max_sessions),
            max_sessions_per_namespace=counts.get(
                "LANE_MAX_SESSIONS_PER_NAMESPACE", defaults.max_sessions_per_namespace
            ),
            max_transfers=counts.get("LANE_MAX_TRANSFERS", defaults.max_transfers),
            max_transfers_per_namespace=counts.get(
                "LANE_MAX_TRANSFERS_PER_NAMESPACE", defaults.max_transfers_per_namespace
            ),
            watch_write_deadline_seconds=setting(
                "LANE_WATCH_WRITE_DEADLINE_SECONDS",
                partial(_seconds, allow_zero=False, maximum=_MAX_WRITE_DEADLINE_SECONDS),
                defaults.watch_write_deadline_seconds,
            ),
            watch_stream_bytes=setting(
                "LANE_WATCH_STREAM_BYTES",
                partial(_count, minimum=_MIN_STREAM_BYTES, of="bytes"),
                defaults.watch_stream_bytes,
            ),
            db_pool_size=setting("LANE_DB_POOL_SIZE", _count, defaults.db_pool_size),
            db_checkout_timeout_seconds=setting(
                "LANE_DB_CHECKOUT_TIMEOUT_SECONDS",
                partial(_seconds, allow_zero=False, maximum=_MAX_CHECKOUT_TIMEOUT_SECONDS),
                defaults.db_checkout_timeout_seconds,
            ),
            db_reconnect_seconds=setting(
                "LANE_DB_RECONNECT_SECONDS",
                partial(
                    _seconds,
                    allow_zero=False,
                    minimum=_MIN_RECONNECT_SECONDS,
                    maximum=_MAX_RECONNECT_SECONDS,
                ),
                defaults.db_reconnect_seconds,
            ),
            request_retention_seconds=setting(
                "LANE_REQUEST_RETENTION_SECONDS",
                partial(_seconds, allow_zero=False, minimum=_MIN_REQUEST_RETENTION_SECONDS),
                defaults.request_retention_seconds,
            ),
            tls_cert_file=cert,
            tls_key_file=key,
            tls_client_ca_file=client_ca,
            http_listen=setting("LANE_HTTP_LISTEN", parse_listen, None),
            http_allowed_hosts=setting(
                "LANE_HTTP_ALLOWED_HOSTS", _host_names, defaults.http_allowed_hosts
            ),
            http_idle_timeout_seconds=setting(
                "LANE_HTTP_IDLE_TIMEOUT_SECONDS", _http_seconds, defaults.http_idle_timeout_seconds
            ),
            http_body_timeout_seconds=setting(
                "LANE_HTTP_BODY_TIMEOUT_SECONDS", _http_seconds, defaults.http_body_timeout_seconds
            ),
            http_max_connections=setting(
                "LANE_HTTP_MAX_CONNECTIONS", _count, defaults.http_max_connections
            ),
            metrics_listen=setting("LANE_METRICS_LISTEN", parse_listen, None),
            log_format=setting(
                "LANE_LOG_FORMAT", partial(_choice, choices=LOG_FORMATS), defaults.log_format
            ),
            event_loop=setting(
                "LANE_EVENT_LOOP", partial(_choice, choices=EVENT_LOOPS), defaults.event_loop
            ),
            otel=setting("LANE_OTEL", _switch, defaults.otel),
            auth_tokens=tokens,
        )
        require_auth_or_loopback(settings)
        _check_metrics_ports(settings)
        return settings


def require_auth_or_loopback(settings: Settings) -> None:
    """Refuse to serve without auth anywhere but on a loopback address."""
    if not settings.auth_tokens and not is_loopback(settings.listen):
        raise ConfigError(
            "LANE_LISTEN",
            settings.listen,
            "without auth the service listens on a loopback address only; set LANE_AUTH_TOKENS "
            "or LANE_AUTH_TOKENS_FILE to serve other hosts",
        )
    if not settings.auth_tokens and settings.http_listen and not is_loopback(settings.http_listen):
        raise ConfigError(
            "LANE_HTTP_LISTEN",
            settings.http_listen,
            "without auth the service listens on a loopback address only; set LANE_AUTH_TOKENS "
            "or LANE_AUTH_TOKENS_FILE to serve other hosts",
        )


def _check_metrics_ports(settings: Settings) -> None:
    """With N workers on a fixed metrics port P, worker k serves metrics on P + k - 1."""
    if settings.metrics_listen is None:
        return
    port = int(settings.metrics_listen.rpartition(":")[2])
    last = port + settings.workers - 1
    if port != 0 and last > 65535:
        raise ConfigError(
            "LANE_METRICS_LISTEN",
            settings.metrics_listen,
            f"with {settings.workers} workers the metrics ports run from {port} to {last},"
            " past 65535",
        )


def is_loopback(listen: str) -> bool:
    """Whether the ``host:port`` address ``listen`` is reachable from this host only."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to anything


def parse_listen(variable: str, value: str) -> str:
    """Check that ``value`` is ``host:port`` (IPv6 hosts in brackets); return it unchanged."""
    host, colon, port_text = value.rpartition(":")
    if not colon or not host:
        raise ConfigError(variable, value, "expected host:port, e.g. 127.0.0.1:50051")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise ConfigError(variable, value, "an IPv6 host goes in brackets, e.g. [::1]:50051")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(variable, value, "the port must be a number from 0 to 65535")
    return value


def mask_password(dsn: str) -> str:
    """Return ``dsn`` (URL or ``key=value`` form) with any password replaced by ``***``."""
    if "://" not in dsn:
        params = conninfo_to_dict(dsn)
        if "password" in params:
            params["password"] = "***"
        return make_conninfo("", **params)
    parts = urlsplit(dsn)
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    netloc = f"{user}:***@{hostinfo}" if at and colon and password else parts.netloc
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key == "password" for key, _ in pairs):
        query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*/")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _check_database_url(value: str) -> None:
    # Parse without connecting: a typo is reported now, naming the variable, rather than as a
    # pool timeout later. Reachability is checked at start-up.
    try:
        conninfo_to_dict(value)
    except ProgrammingError as err:
        # The message of a parse error never echoes a password, but the value might: don't.
        problem = f"not a connection string: {str(err).strip()}"
        raise ConfigError("LANE_DATABASE_URL", "<hidden>", problem) from None


def _seconds(
    variable: str,
    value: str,
    *,
    allow_zero: bool,
    maximum: float = math.inf,
    minimum: float | None = None,
) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(variable, value, "expected a number of seconds") from None
    low_ok = seconds >= 0 if allow_zero else seconds > 0
    if minimum is not None and low_ok and seconds < minimum:
        low_ok = False
    if not math.isfinite(seconds) or not low_ok or seconds > maximum:
        bound = ">= 0" if allow_zero else "> 0"
        if minimum is not None:
            bound = f">= {minimum:g}"
        if math.isfinite(maximum):
            bound += f" and <= {maximum:g}"
        raise ConfigError(variable, value, f"the number of seconds must be {bound}")
    return seconds


def _http_seconds(variable: str, value: str) -> float:
    return _seconds(variable, value, allow_zero=False, maximum=_MAX_HTTP_TIMEOUT_SECONDS)


def _host_names(variable: str, value: str) -> tuple[str, ...]:
    """Comma-separated host names (no ports), lower case."""
    names = tuple(name.strip().lower() for name in value.split(",") if name.strip())
    for name in names:
        if not _HOST_NAME.fullmatch(name):
            raise ConfigError(
                variable,
                value,
                f"{name!r} is not a host name: expected names such as devbox.local, "
                "192.168.1.5 or [fd00::5], without a port, comma-separated (* for any)",
            )
    return names


def _tokens(variable: str, text: str | None, shown: str = "<hidden>") -> dict[str, str]:
    if text is None:
        return {}
    try:
        return parse_tokens(text)
    except TokenError as err:
        raise ConfigError(variable, shown, str(err)) from None


def _file(variable: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(variable, value, "no such file")
    return path


def _count(variable: str, value: str, *, minimum: int = 1, of: str = "") -> int:
    """A whole number >= ``minimum`` (``of``: what it counts, for the message, e.g. "bytes")."""
    what = f"number of {of}" if of else "number"
    try:
        count = int(value)
    except ValueError:
        raise ConfigError(variable, value, f"expected a whole {what}") from None
    if count < minimum:
        raise ConfigError(variable, value, f"the {what} must be >= {minimum}")
    return count


def _choice(variable: str, value: str, choices: tuple[str, ...]) -> str:
    lowered = value.lower()
    if lowered not in choices:
        raise ConfigError(variable, value, f"expected {' or '.join(choices)}")
    return lowered


def _switch(variable: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(variable, value, "expected on or off")
