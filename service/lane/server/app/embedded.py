"""An embedded PostgreSQL for running without a configured database.

The ``pgserver`` wheel ships PostgreSQL binaries and runs them as an unprivileged user even when
we are root (plain ``initdb`` refuses root). The cluster lives in ``<data_dir>/postgres`` and
listens only on a Unix socket, so several data directories can run side by side without port
clashes. :func:`start_embedded` initialises the cluster on first use and otherwise reuses it:
if a server for that directory is already running (say, a second service process), it is
shared; pgserver counts the processes using it and the last one to stop it really stops it.
Stopping keeps the data for the next start.

Known limit: a process killed with SIGKILL stays in pgserver's count, so the server then keeps
running after the other processes stop. The next start reuses it, so nothing is lost.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)


@dataclass
class EmbeddedPostgres:
    """A running embedded PostgreSQL. Call :meth:`stop` when done with it."""

    cluster_dir: Path
    uri: str
    _server: Any = field(repr=False)
    _stopped: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stop(self) -> None:
        """Stop the server unless another process still uses it; keep the data. Idempotent.

        Blocks while PostgreSQL shuts down: from async code call it in a thread.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        # cleanup() honours the cleanup_mode given at start: "stop" stops, never deletes.
        self._server.cleanup()
        _log.info("embedded PostgreSQL at %s released", self.cluster_dir)


def start_embedded(data_dir: Path) -> EmbeddedPostgres:
    """Start (or reuse) the embedded PostgreSQL under ``data_dir``; return it.

    Creates ``data_dir`` if needed. Blocks for the start-up (a few seconds on first use, for
    ``initdb``): from async code call it in a thread.
    """
    cluster_dir = data_dir.expanduser().absolute() / "postgres"
    # A subdirectory, not data_dir itself: initdb wants an empty directory, and pgserver
    # changes the owner of the directory it is given to its own system user.
    cluster_dir.parent.mkdir(parents=True, exist_ok=True)
    pgserver = _import_pgserver()
    server = pgserver.get_server(cluster_dir, cleanup_mode="stop")
    uri: str = server.get_uri()
    _log.info("embedded PostgreSQL running at %s", cluster_dir)
    return EmbeddedPostgres(cluster_dir=cluster_dir, uri=uri, _server=server)


def _import_pgserver() -> Any:
    # pgserver asks platformdirs for a runtime directory at import time, which warns when
    # XDG_RUNTIME_DIR is unset (as it is for root in containers and CI). The fallback it takes
    # (/tmp/runtime-<uid>) is fine, and a warning turned into an error by a test run must not
    # stop the import.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver
