"""Every Prometheus metric of the service, defined once for the whole process.

A cross-cutting module: it imports nothing of the service, so every layer may use it (the
domain stays pure and does not). Importing it registers nothing: the metrics live in a
:class:`Metrics`, and code counts on :data:`current` (``metrics.current.commands.labels(...)``).
Until the process installs its registry, :data:`current` holds metrics registered nowhere
(counted, never exported). ``service/lane/server/app/server.py`` calls :func:`install` at start-up:
once per process it makes the registry (the metrics below, and the standard ``process_*``,
``python_gc_*`` and ``python_info`` collectors) and makes it :data:`current`; later servers in
the process (as in the tests) get the same one and add to the same series.
``LANE_METRICS_LISTEN`` serves it over HTTP (:func:`serve_metrics`).

``lane_commands_total{method, code}`` (counter)
    Unary LaneService RPCs answered, by method (``StartRun``, ...; the read-only
    ``GetLaneSnapshot``, ``ListLanes`` and ``GetOperation`` included) and gRPC status code name
    (``OK``, ``FAILED_PRECONDITION``, ...). The ErrorInfo reason is left out to keep the label
    set bounded: each answer's DEBUG log line names it (``service/lane/server/api/instrument.py``).
``lane_command_duration_seconds{method}`` (histogram)
    Time from receiving a unary RPC's bytes to its answer, refusals included.
``lane_drive_frames_total{direction, kind}`` (counter)
    DriveLane messages: ``direction`` ``read`` (requests) or ``written`` (answers), ``kind``
    ``single`` (one command or answer) or ``batch`` (several in ``batch``). Commands per
    message is ``lane_commands_total`` of a session's methods over these.
``lane_events_appended_total`` (counter)
    Events committed to the event log (a command that changes nothing appends none).
``lane_watchers_active`` (gauge)
    WatchLane and WatchLanes streams being served now.
``lane_watchers_ended_total{reason}`` (counter)
    WatchLane and WatchLanes streams that ended: ``client_left`` (the client cancelled or went
    away), ``too_slow`` (RESOURCE_EXHAUSTED ``WATCHER_TOO_SLOW``), ``shutdown`` (UNAVAILABLE
    ``SERVER_SHUTTING_DOWN``), ``lane_deleted`` (NOT_FOUND ``LANE_DELETED``), ``out_of_range``
    (resume below the retention floor or past the head), ``not_found`` (no such lane), another
    refusal's code name in lower case (``resource_exhausted``, ...), or ``error`` (anything
    unexpected).
``lane_delivery_latency_seconds`` (histogram)
    From an event group's commit time (``HarnessEvent.commit_time``, stamped by the committing
    process) to the moment a watcher wrote the group to its stream; one observation per group
    and watcher. Across processes it includes their clock difference.
``lane_event_log_reads_total`` (counter)
    Reads of a lane's event log for watchers: one per lane and process for a commit made in
    another process (shared by all of that lane's watchers here), and a watcher's own reads
    while it catches up from behind its lane's recent groups. A commit made in this process
    reaches its watchers without one.
``lane_listener_reconnects_total`` (counter)
    Times the hub's LISTEN connection was lost or could not be opened (each is followed by a
    reconnection attempt; polling covers the gap).
``lane_notification_queue_usage_ratio`` (gauge)
    ``pg_notification_queue_usage()``: the fraction (0..1) of PostgreSQL's NOTIFY queue in use,
    refreshed every few seconds while the endpoint is on. Near 1, NOTIFY starts failing.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_wsgi_server,
)
from prometheus_client.core import HistogramMetricFamily

_COMMAND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_DELIVERY_BUCKETS = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
#: The reasons a watcher ends for, shown at zero before the first one does.
WATCHER_END_REASONS = ("client_left", "too_slow", "shutdown", "out_of_range", "error")


class Metrics:
    """The service's metrics, registered in ``registry`` (None: nowhere, never exported)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry
        self.commands = Counter(
            "lane_commands",
            "Unary LaneService RPCs answered, by method and gRPC status code name.",
            ["method", "code"],
            registry=registry,
        )
        self.command_seconds = Histogram(
            "lane_command_duration_seconds",
            "Time to answer a unary LaneService RPC, refusals included.",
            ["method"],
            buckets=_COMMAND_BUCKETS,
            registry=registry,
        )
        self.drive_frames = DriveFrames(registry)
        self.events_appended = Counter(
            "lane_events_appended",
            "Events committed to the event log.",
            registry=registry,
        )
        self.store_commits = Counter(
            "lane_store_commits",
            "Commands run by the store, by path: 'optimistic' (decided on the lane kept in"
            " memory and committed in one statement), 'locked' (the lane loaded under its row"
            " lock).",
            ["path"],
            registry=registry,
        )
        self.optimistic_commits = self.store_commits.labels("optimistic")
        self.locked_commits = self.store_commits.labels("locked")
        self.group_commits = Counter(
            "lane_store_group_commits",
            "PostgreSQL transactions that committed optimistic commands: each carries every"
            " command ready when it was sent (lane_store_commits_total{path='optimistic'} over"
            " this is the commands per transaction).",
            registry=registry,
        )
        self.watchers_active = Gauge(
            "lane_watchers_active",
            "WatchLane and WatchLanes streams being served.",
            registry=registry,
        )
        self.watchers_ended = Counter(
            "lane_watchers_ended",
            "WatchLane and WatchLanes streams that ended, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in WATCHER_END_REASONS:
            self.watchers_ended.labels(reason)
        self.delivery_seconds = LoopHistogram(
            "lane_delivery_latency_seconds",
            "From an event group's commit time to a watcher writing it to its stream.",
            _DELIVERY_BUCKETS,
            registry,
        )
        self.doorbells_sent = Counter(
            "lane_doorbells_sent",
            "NOTIFY doorbells sent for commits to lanes another process watches.",
            registry=registry,
        )
        self.event_log_reads = Counter(
            "lane_event_log_reads",
            "Reads of a lane's event log for watchers (shared per lane, or a watcher catching up).",
            registry=registry,
        )
        self.listener_reconnects = Counter(
            "lane_listener_reconnects",
            "Times the hub's LISTEN connection was lost or could not be opened.",
            registry=registry,
        )
        self.notification_queue_usage = Gauge(
            "lane_notification_queue_usage_ratio",
            "pg_notification_queue_usage(): the fraction of PostgreSQL's NOTIFY queue in use.",
            registry=registry,
        )


class LoopHistogram:
    """A histogram without labels observed from the event loop's thread only, exported like
    ``prometheus_client``'s: counts kept as plain integers, no lock. It is observed once per
    watcher and commit (a hundred times per commit on a busy lane), where the library's
    ``observe`` takes a lock per bucket and costs several times as much. A scrape from the
    endpoint's thread reads the counts as they are then (a count and its sum may be one
    observation apart)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry | None,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = [*buckets, math.inf]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        """Count ``value`` in its bucket."""
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The histogram as the registry exports it (cumulative buckets)."""
        counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self._name, self._documentation)
        buckets = [
            ("+Inf" if bound == math.inf else repr(bound), cumulative)
            for bound, cumulative in zip(self._bounds, itertools.accumulate(counts), strict=True)
        ]
        family.add_metric([], buckets, sum_value=total)
        yield family


class DriveFrames:
    """``lane_drive_frames_total``'s four series, bound once."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        frames = Counter(
            "lane_drive_frames",
            "DriveLane messages read (requests) and written (answers), single or batches.",
            ["direction", "kind"],
            registry=registry,
        )
        self.read_single = frames.labels("read", "single")
        self.read_batch = frames.labels("read", "batch")
        self.written_single = frames.labels("written", "single")
        self.written_batch = frames.labels("written", "batch")


#: The metrics code counts on: registered nowhere until :func:`install` replaces them.
current = Metrics(None)
_install_lock = threading.Lock()


def install() -> CollectorRegistry:
    """The process's registry, made (and its metrics made :data:`current`) by the first call:
    the app calls it where the process starts. Metrics counted before are not carried over."""
    global current
    with _install_lock:
        if current.registry is not None:
            return current.registry
        registry = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
        current = Metrics(registry)
        return registry


@dataclass
class MetricsEndpoint:
    """The HTTP endpoint serving a registry (any path) from a daemon thread."""

    server: WSGIServer
    thread: threading.Thread
    host: str
    port: int

    @property
    def address(self) -> str:
        """``host:port`` as bound (IPv6 hosts in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop serving and close the socket (blocks up to about half a second)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serve ``registry`` on ``host``:``port`` (``[::1]`` or ``::1`` for IPv6; port 0 picks
    a free one). Raises OSError when the address cannot be bound."""
    host = host.removeprefix("[").removesuffix("]")
    server, thread = start_wsgi_server(port, addr=host, registry=registry)
    bound = server.socket.getsockname()
    return MetricsEndpoint(server, thread, host, int(bound[1]))


__all__ = [
    "WATCHER_END_REASONS",
    "Metrics",
    "MetricsEndpoint",
    "current",
    "install",
    "serve_metrics",
]
