"""The lane service as a process: read the environment, configure logging, serve until
SIGTERM or SIGINT, then shut down gracefully. :func:`main` is the entry point behind
``python -m service.app`` and ``lane serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from service.app.config import ConfigError, Settings
from service.app.server import StartupError, start_server
from service.logs import configure as configure_log_format

_log = logging.getLogger(__name__)


async def serve(settings: Settings) -> None:
    """Run the service until SIGTERM or SIGINT, then shut down within the grace period."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, _request_stop, sig, stop_requested)
    try:
        # A signal during a slow start (initdb, an unreachable database) must not wait for it.
        starting = asyncio.ensure_future(start_server(settings))
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
            try:
                await stop_waiter
            finally:
                await running.stop(settings.grace_seconds)
        finally:
            stop_waiter.cancel()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def main() -> int:
    """Process entry point: read the environment, serve, return the exit status.

    0 after a graceful shutdown, 2 for a bad configuration, 1 when start-up fails.
    """
    try:
        settings = Settings.from_env()
    except ConfigError as err:
        print(f"lane: configuration error: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    try:
        asyncio.run(serve(settings))
    except StartupError as err:
        _log.error("lane service failed to start: %s", err)
        return 1
    return 0


def configure_logging(log_format: str = "text") -> None:
    """Log INFO and above to stderr as ``text`` or ``json`` lines carrying the served request's
    ids (``service/logs.py``), unless the application configured logging already."""
    configure_log_format(log_format)
    # pgserver narrates every step of starting PostgreSQL at INFO; keep its warnings.
    logging.getLogger("pgserver").setLevel(logging.WARNING)


def _request_stop(sig: signal.Signals, stop_requested: asyncio.Event) -> None:
    if not stop_requested.is_set():
        _log.info("received %s: shutting down", sig.name)
    stop_requested.set()
