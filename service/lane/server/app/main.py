"""The lane service as a process: read the environment, configure logging, serve until
SIGTERM or SIGINT, then shut down gracefully. :func:`main` is the entry point behind
``python -m lane.server.app`` and ``lane serve``.

With ``LANE_WORKERS`` (``lane serve --workers N``) above 1 the process is a supervisor of that
many worker processes instead (``service/lane/server/app/supervisor.py``); each worker is this same
entry point, told by its environment that it is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from lane.server.app import event_loop
from lane.server.app.collector import tune_for_serving
from lane.server.app.config import ConfigError, Settings
from lane.server.app.native_logs import route_native_stderr
from lane.server.app.server import StartupError, start_server
from lane.server.app.supervisor import supervise
from lane.server.app.tracing import check_tracing, start_tracing, stop_tracing
from lane.server.app.worker_role import WorkerRole
from lane.server.logs import configure as configure_log_format

_log = logging.getLogger(__name__)


async def serve(
    settings: Settings,
    *,
    reuse_port: bool = False,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run the service until SIGTERM or SIGINT, then shut down within the grace period.

    A worker passes ``reuse_port`` (share the port with its siblings) and ``on_ready`` (called
    once it serves)."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, _request_stop, sig, stop_requested)
    try:
        # A signal during a slow start (initdb, an unreachable database) must not wait for it.
        starting = asyncio.ensure_future(start_server(settings, reuse_port=reuse_port))
        stop_waiter = asyncio.ensure_future(stop_requested.wait())
        try:
            await asyncio.wait({starting, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                _log.info("start-up abandoned")
                return
            running = starting.result()
            tune_for_serving()
            if on_ready is not None:
                on_ready()
            try:
                await stop_waiter
            finally:
                await running.stop(settings.grace_seconds)
        finally:
            stop_waiter.cancel()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def main(workers: int | None = None, *, given_as: Mapping[str, str] | None = None) -> int:
    """Process entry point: read the environment, serve, return the exit status.

    ``workers`` overrides ``LANE_WORKERS``. ``given_as`` maps variables that came from
    command-line flags (``lane serve --listen``) to those flags, so a bad value is reported as
    the flag the person typed. 0 after a graceful shutdown, 2 for a bad configuration, 1 when
    start-up fails (with workers: also when they keep failing to start).
    """
    environ: Mapping[str, str] = os.environ
    if workers is not None:
        environ = {**os.environ, "LANE_WORKERS": str(workers)}
    try:
        settings = Settings.from_env(environ)
        role = WorkerRole.from_env(environ)
        if settings.otel:
            check_tracing(environ)  # a bad OTEL_* value stops start-up here, as any setting
    except ConfigError as err:
        flag = (given_as or {}).get(err.variable)
        shown = f"{flag} {err.value!r}: {err.problem}" if flag else str(err)
        print(f"lane: configuration error: {shown}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    if role is None and settings.workers > 1:
        return supervise(settings)  # the workers trace, each with its own provider
    if role is not None:
        role.attach(settings.log_format)
    try:
        provider = start_tracing(environ) if settings.otel else None
    except ConfigError as err:
        print(f"lane: configuration error: {err}", file=sys.stderr)
        return 2
    try:
        if role is not None:
            return _run(serve(settings, reuse_port=True, on_ready=role.report_ready), settings)
        return _run(serve(settings), settings)
    finally:
        stop_tracing(provider)


def _run(serving: Coroutine[Any, Any, None], settings: Settings) -> int:
    try:
        event_loop.run(serving, settings.event_loop)
    except StartupError as err:
        _log.error("lane service failed to start: %s", err)
        return 1
    return 0


def configure_logging(log_format: str = "text") -> None:
    """Log INFO and above to stderr as ``text`` or ``json`` lines carrying the served request's
    ids (``service/lane/server/logs.py``), unless the application configured logging already. With
    ``json``, gRPC core's own lines become records too
    (``service/lane/server/app/native_logs.py``)."""
    if log_format == "json" and not logging.getLogger().handlers:
        route_native_stderr()
    configure_log_format(log_format)
    # pgserver narrates every step of starting PostgreSQL at INFO; keep its warnings.
    logging.getLogger("pgserver").setLevel(logging.WARNING)


def _request_stop(sig: signal.Signals, stop_requested: asyncio.Event) -> None:
    if not stop_requested.is_set():
        _log.info("received %s: shutting down", sig.name)
    stop_requested.set()
