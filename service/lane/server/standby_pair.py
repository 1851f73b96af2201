"""A PostgreSQL primary and its synchronous hot standby on this machine, for failover drills.

Production runs the service on a replicated PostgreSQL: a primary, a standby fed by streaming
replication, and a multi-host URL with ``target_session_attrs=read-write`` that connects to
whichever of them accepts writes (docs/deploying.md, "A replicated PostgreSQL"). This builds
that topology in a temporary directory, as an operator would::

    pair = StandbyPair.create()          # initdb, pg_basebackup -R, the standby in sync
    pair.url                              # postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/lane?...
    pair.stop_primary()                   # pg_ctl stop -m immediate: the primary crashes
    pair.promote()                        # pg_ctl promote -w: the standby accepts writes
    pair.destroy()

It lives in the server package, not among the tests, so the failover benchmark
(``bench/failover.py``) uses it too.

The clusters:

* run the PostgreSQL binaries of the system (Debian's ``/usr/lib/postgresql/<version>/bin``,
  the newest of version 15 or later), else those the ``pgserver`` wheel bundles;
* run as the ``postgres`` user when this process is root (``initdb`` refuses to run as root),
  which is created first when it does not exist, as on a fresh CI machine. Every command goes
  through ``runuser`` (a plain exec), never ``subprocess``'s ``user=``: that makes Python
  ``fork()``, and a forked child of a process with gRPC threads can die before it execs;
* listen on 127.0.0.1 on free ports, with trust authentication (local use only);
* are a primary with ``synchronous_standby_names = 'standby'`` and a standby made by
  ``pg_basebackup -R`` whose ``cluster_name`` (its walreceiver's application name) is
  ``standby``: a commit is acknowledged only once the standby has its WAL, so none is lost by
  a failover. The standby's own ``synchronous_standby_names`` is empty: promoted, it has no
  standby of its own to wait for (a failover manager resets it so, too);
* run with ``fsync = off``: a drill crashes the server process, not the host, and the
  operating system keeps what the process wrote.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg

__all__ = ["PostgresControlError", "StandbyPair", "postgres_binaries"]

#: The OS user the clusters run as when this process is root.
OS_USER = "postgres"
#: The standby's name in ``synchronous_standby_names`` (its ``cluster_name``).
STANDBY_NAME = "standby"
DATABASE = "lane"
#: How long start, stop and promote may take.
_CONTROL_TIMEOUT_SECONDS = 60
_SYNC_WITHIN_SECONDS = 30.0
_DEBIAN_BINARIES = Path("/usr/lib/postgresql")
_MIN_VERSION = 15


class PostgresControlError(RuntimeError):
    """A PostgreSQL command failed; the message holds its output and the server's log tail."""


def postgres_binaries() -> Path:
    """The directory of the PostgreSQL binaries the pair runs: the system's newest of version 15
    or later (Debian's layout), else the ``pgserver`` wheel's."""
    versions = []
    if _DEBIAN_BINARIES.is_dir():
        for entry in _DEBIAN_BINARIES.iterdir():
            if entry.name.isdigit() and (entry / "bin" / "pg_basebackup").is_file():
                versions.append((int(entry.name), entry / "bin"))
    usable = [found for found in versions if found[0] >= _MIN_VERSION]
    if usable:
        return max(usable)[1]
    with warnings.catch_warnings():
        # pgserver's import warns when XDG_RUNTIME_DIR is unset (root in containers).
        warnings.simplefilter("ignore")
        import pgserver
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ensure_os_user() -> None:
    """Create the ``postgres`` system user when it does not exist (root only)."""
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", OS_USER],
            check=True,
            capture_output=True,
            timeout=30,
        )


@dataclass
class Cluster:
    """One PostgreSQL cluster of the pair."""

    name: str
    data: Path
    port: int

    @property
    def log_file(self) -> Path:
        return self.data.parent / f"{self.name}.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class StandbyPair:
    """A primary and its synchronous hot standby; see the module docstring."""

    base: Path
    binaries: Path
    primary: Cluster
    standby: Cluster
    #: Run the PostgreSQL commands as the ``postgres`` user (this process is root).
    as_postgres: bool

    @classmethod
    def create(cls, parent: Path | None = None) -> StandbyPair:
        """Build and start the pair in a new directory under ``parent`` (default: the system's
        temporary directory, which the ``postgres`` user can reach; a pytest ``tmp_path`` is
        not) and wait until the standby is synchronous. On failure nothing is left running."""
        as_postgres = os.geteuid() == 0
        if as_postgres:
            _ensure_os_user()
        base = Path(tempfile.mkdtemp(prefix="lane-standby-pair-", dir=parent))
        if as_postgres:
            entry = pwd.getpwnam(OS_USER)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        pair = cls(
            base=base,
            binaries=postgres_binaries(),
            primary=Cluster("primary", base / "primary", _free_port()),
            standby=Cluster("standby", base / "standby", _free_port()),
            as_postgres=as_postgres,
        )
        try:
            pair._build()
        except BaseException:
            pair.destroy()
            raise
        return pair

    @property
    def url(self) -> str:
        """The multi-host URL of the service: whichever of the two accepts writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://{OS_USER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def cluster_url(self, cluster: Cluster, database: str = DATABASE) -> str:
        """The URL of one cluster alone."""
        return f"postgresql://{OS_USER}@127.0.0.1:{cluster.port}/{database}"

    def version(self) -> str:
        """``postgres --version`` of the binaries in use."""
        done = subprocess.run(
            [str(self.binaries / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.stdout.strip()

    # -- the drill's steps --------------------------------------------------------------------

    def standby_connections_before_promotion(self) -> int:
        """How many connections the standby received before it was promoted (its log's
        ``connection received`` lines; the walreceiver's go to the primary)."""
        log = self.standby.log_file.read_text(errors="replace")
        return log.partition("received promote request")[0].count("connection received:")

    def stop_primary(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m mode`` on the primary (``immediate``: a crash), waiting until it
        is gone."""
        self._pg_ctl(self.primary, "-m", mode, "-w", "-t", str(_CONTROL_TIMEOUT_SECONDS), "stop")

    def promote(self) -> None:
        """``pg_ctl promote -w`` on the standby: returns once it accepts writes."""
        self._pg_ctl(self.standby, "-w", "-t", str(_CONTROL_TIMEOUT_SECONDS), "promote")

    def destroy(self) -> None:
        """Stop both clusters (if running) and remove the directory."""
        try:
            for cluster in (self.primary, self.standby):
                if (cluster.data / "postmaster.pid").exists():
                    self._pg_ctl(cluster, "-m", "immediate", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    # -- building -----------------------------------------------------------------------------

    def _build(self) -> None:
        primary, standby = self.primary, self.standby
        self._run(
            "initdb",
            "-D",
            str(primary.data),
            "-U",
            OS_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        )
        self._append_conf(
            primary,
            listen_addresses="'127.0.0.1'",
            port=str(primary.port),
            unix_socket_directories=f"'{self.base}'",
            synchronous_standby_names=f"'{STANDBY_NAME}'",
            synchronous_commit="on",
            fsync="off",
            shared_buffers="'32MB'",
            max_connections="100",
            wal_keep_size="'64MB'",
            # Every attempt to connect is a log line: a drill counts the service's attempts.
            log_connections="on",
        )
        self._start(primary)
        with psycopg.connect(self.cluster_url(primary, "postgres"), autocommit=True) as conn:
            # No standby yet to wait for: this one commit is acknowledged by the primary alone.
            conn.execute("SET synchronous_commit = local")
            conn.execute(f"CREATE DATABASE {DATABASE}")
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            OS_USER,
            "-D",
            str(standby.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        self._append_conf(
            standby,
            port=str(standby.port),
            cluster_name=f"'{STANDBY_NAME}'",
            synchronous_standby_names="''",
        )
        self._start(standby)
        self._wait_in_sync()

    def _append_conf(self, cluster: Cluster, **settings: str) -> None:
        # Appended as the cluster's owner: the file is theirs, and later lines win.
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        self._run("sh", "-c", f"cat >> {cluster.data / 'postgresql.conf'}", stdin=lines)

    def _start(self, cluster: Cluster) -> None:
        self._pg_ctl(
            cluster, "-w", "-t", str(_CONTROL_TIMEOUT_SECONDS), "-l", str(cluster.log_file), "start"
        )

    def _wait_in_sync(self) -> None:
        give_up = time.monotonic() + _SYNC_WITHIN_SECONDS
        url = self.cluster_url(self.primary, "postgres")
        while True:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
            if row is not None and row[0] == "sync":
                return
            if time.monotonic() > give_up:
                raise PostgresControlError(
                    f"the standby is not synchronous after {_SYNC_WITHIN_SECONDS:g}s "
                    f"(state {row}):\n{self.standby.log_tail()}"
                )
            time.sleep(0.1)

    # -- running commands ---------------------------------------------------------------------

    def _pg_ctl(self, cluster: Cluster, *args: str, check: bool = True) -> int:
        try:
            self._run("pg_ctl", "-D", str(cluster.data), *args)
        except PostgresControlError as error:
            if check:
                log = cluster.log_tail()
                raise PostgresControlError(f"{error}\n{cluster.name} log:\n{log}") from None
            return 1
        return 0

    def _run(self, program: str, *args: str, stdin: str | None = None) -> None:
        path = self.binaries / program
        command = [str(path) if path.is_file() else program, *args]
        if self.as_postgres:
            command = ["runuser", "-u", OS_USER, "--", *command]
        # Never a pipe for the output: a postmaster started by pg_ctl inherits it and keeps it
        # open, and the read would wait for the server to exit.
        with tempfile.TemporaryFile("w+") as output:
            done = subprocess.run(
                command,
                cwd=self.base,
                stdout=output,
                stderr=output,
                text=True,
                timeout=_CONTROL_TIMEOUT_SECONDS + 30,
                check=False,
                **({"stdin": subprocess.DEVNULL} if stdin is None else {"input": stdin}),
            )
            output.seek(0)
            text = output.read()
        if done.returncode != 0:
            shown = " ".join([program, *args])
            raise PostgresControlError(f"{shown} exited {done.returncode}: {text.strip()[-2000:]}")
