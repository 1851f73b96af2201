"""A dedicated PostgreSQL that a test stops and starts again: same data directory, same socket.

The session's PostgreSQL (``database_url``) is shared by every test, so an outage test gets a
server of its own: an embedded pgserver cluster in a directory of its own.

Two process-level details shape this module:

* ``initdb`` and ``pg_ctl`` refuse to run as root. pgserver then runs them as its own system
  user (``pgserver``) by passing ``user=`` to :mod:`subprocess`, which makes Python ``fork()``
  instead of ``vfork()``. In a process where gRPC threads are running, such a forked child can
  die with SIGSEGV before it execs (seen here on ``pg_ctl start``). So the cluster is created by
  a short-lived helper interpreter that never loaded gRPC, and ``pg_ctl stop``/``start`` run
  through ``runuser -u pgserver --`` (a plain exec, which Python spawns with ``vfork()``).
* pgserver listens on a Unix socket only (``-h ""``, ``-k <socket dir>``). Starting again with
  the same ``-k`` gives the same socket path, so the connection URI stays valid across the
  restart: the service's pool, its LISTEN connection and its doorbell connection all reconnect
  to the very address they used before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

_HELPER = r"""
import json, sys, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import pgserver
server = pgserver.get_server(sys.argv[1], cleanup_mode=None)
info = server.get_postmaster_info()
print(json.dumps({
    "uri": server.get_uri(),
    "socket_dir": str(info.socket_dir),
    "system_user": server.system_user,
}))
"""


def _postgres_bin() -> Path:
    with warnings.catch_warnings():
        # pgserver's import warns when XDG_RUNTIME_DIR is unset (root in containers).
        warnings.simplefilter("ignore")
        import pgserver
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


class PostgresControlError(RuntimeError):
    """pg_ctl failed; the message holds its output and the tail of the server log."""


@dataclass
class RestartablePostgres:
    """One embedded PostgreSQL cluster under ``pgdata``; see the module docstring."""

    pgdata: Path
    uri: str
    socket_dir: Path
    system_user: str | None

    @classmethod
    def create(cls, parent: Path) -> RestartablePostgres:
        """initdb (as the unprivileged user when root) and start a cluster in ``parent``."""
        pgdata = parent.absolute() / "postgres"
        parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-c", _HELPER, str(pgdata)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise PostgresControlError(f"pgserver helper failed: {done.stderr[-2000:]}")
        info = json.loads(done.stdout.strip().splitlines()[-1])
        return cls(
            pgdata=pgdata,
            uri=info["uri"],
            socket_dir=Path(info["socket_dir"]),
            system_user=info["system_user"],
        )

    @property
    def log_file(self) -> Path:
        return self.pgdata / "log"

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` and wait until the server is gone."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def start(self) -> None:
        """Start the server again on the same data directory and socket; wait until ready."""
        self._pg_ctl(
            "-w",
            "-t",
            "60",
            "-o",
            '-h ""',
            "-o",
            f"-k {self.socket_dir}",
            "-l",
            str(self.log_file),
            "start",
        )

    def running(self) -> bool:
        """Whether a postmaster runs on the data directory (``pg_ctl status``)."""
        return self._pg_ctl("status", check=False) == 0

    def destroy(self) -> None:
        """Stop the server (if running) and remove the data directory."""
        try:
            if self.running():
                self.stop("fast")
        finally:
            shutil.rmtree(self.pgdata, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def _pg_ctl(self, *args: str, check: bool = True) -> int:
        command = [str(_postgres_bin() / "pg_ctl"), "-D", str(self.pgdata), *args]
        if self.system_user is not None and os.geteuid() == 0:
            command = ["runuser", "-u", self.system_user, "--", *command]
        # Never a pipe: the postmaster started by pg_ctl would inherit it and keep it open.
        with tempfile.TemporaryFile("w+") as output:
            done = subprocess.run(
                command, stdout=output, stderr=output, stdin=subprocess.DEVNULL, timeout=90
            )
            output.seek(0)
            text = output.read()
        if check and done.returncode != 0:
            raise PostgresControlError(
                f"pg_ctl {' '.join(args)} exited {done.returncode}: {text.strip()}\n"
                f"server log:\n{self.log_tail()}"
            )
        return done.returncode
