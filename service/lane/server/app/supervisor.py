"""``lane serve --workers N``: N server processes on one port, under one supervisor.

One service process keeps about one core busy at most: its Python code runs one thread at a
time. With ``LANE_WORKERS`` (or ``--workers``) N > 1 the process started becomes a supervisor
that runs N worker processes instead; with N = 1 nothing changes (one process, no supervisor).

The mechanism, and why
----------------------

- **The kernel spreads the connections.** Every worker binds the same ``host:port`` with
  ``SO_REUSEPORT`` (:data:`~lane.server.app.server.WORKER_SERVER_OPTIONS`), and Linux hands each
  new TCP connection to one of the listening sockets. There is no proxy hop, the workers share
  nothing but the port and the database, and a worker that dies leaves the group at once, so
  new connections go to the others. (Alternatives: ``grpc.aio`` cannot serve on a listening
  socket created by another process, so the supervisor cannot accept and hand sockets over;
  and gRPC does not survive ``fork``, so workers are fresh interpreters, not forked copies.)
  Other systems' ``SO_REUSEPORT`` does not balance (macOS gives every connection to one
  socket): there, the supervisor warns and runs the workers anyway.
- **A worker is the ordinary service process.** Each is ``python -m lane.server.app`` started
  with :data:`~lane.server.app.worker_role.WORKER_VARIABLE` set (worker_role.py): the
  single-process service (its own store pool, hub with its LISTEN connection, watchers,
  maintenance tasks and metrics endpoint), bound with ``SO_REUSEPORT``, its log lines tagged
  ``[worker K pid P]``. No lane state that matters for
  correctness lives in a process, so it does not matter which worker serves a call: a commit
  made through one reaches watchers on the others by the hub's NOTIFY doorbell naming the lane
  (or, with ``LANE_NOTIFY=off`` or a lost doorbell, by polling), exactly as between hosts.
- **What must happen once happens in the supervisor, before the first worker starts**: the
  embedded PostgreSQL when ``LANE_DATABASE_URL`` is unset (workers get its URL; the supervisor
  stops it after the last worker exited), the migrations (workers find nothing left to apply,
  which would be safe anyway under the migrator's advisory lock), and the port. The supervisor
  checks that nothing listens there yet (so a second service on the same port still fails
  loudly instead of silently sharing it), picks a free port for port 0, and keeps a socket
  bound to it with ``SO_REUSEPORT`` (bound, never listening: it takes no connections) for as
  long as it runs, so the port stays the workers' while they come and go (shared_port.py).
- **Replacing workers.** A worker that exits while nobody asked it to is logged at WARNING and
  replaced. One that had reported itself serving is replaced at once; one that died during its
  start-up is retried after a delay that doubles each time (from
  :data:`START_RETRY_FIRST_SECONDS` to :data:`START_RETRY_MAX_SECONDS`), so a worker that
  cannot start does not spin. After :data:`MAX_START_FAILURES` start-up failures in a row
  (over all workers; any worker reaching SERVING resets the count) the supervisor gives up:
  it stops the remaining workers and exits 1. A worker reports that it serves by writing to a
  pipe the supervisor gave it.
- **Stopping.** SIGTERM or SIGINT to the supervisor is forwarded to every worker; each drains
  as a single process does (health NOT_SERVING, watch streams ended with UNAVAILABLE so their
  clients resume on another process, ``LANE_GRACE_SECONDS`` for calls in flight). When all
  have exited the supervisor releases the port, stops the embedded PostgreSQL if it started
  one, and exits 0. A worker still running :data:`DRAIN_MARGIN_SECONDS` after its grace
  period is killed.
- **A killed supervisor takes its workers along**: on Linux each worker asks the kernel to
  SIGKILL it when the supervisor dies (``PR_SET_PDEATHSIG``), as if one process had been
  killed, so a restarted service finds its port free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import psycopg

from lane.server.app.config import Settings, mask_password
from lane.server.app.embedded import EmbeddedPostgres, start_embedded
from lane.server.app.server import StartupError, check_database, transport_description
from lane.server.app.shared_port import reserve_port
from lane.server.app.worker_role import READY, WORKER_VARIABLE
from lane.server.store import Store

_log = logging.getLogger(__name__)

#: Start-up failures in a row (over all workers) after which the supervisor gives up.
MAX_START_FAILURES = 5
#: The delay before retrying a worker that died during start-up; doubles on each failure.
START_RETRY_FIRST_SECONDS = 0.25
START_RETRY_MAX_SECONDS = 8.0
#: How long after its grace period a stopping worker may still take before it is killed.
DRAIN_MARGIN_SECONDS = 30.0
#: Database connections a worker holds besides its pool (``LANE_DB_POOL_SIZE``): the hub's
#: LISTEN and doorbell connections. Only for the start-up warning below.
HUB_CONNECTIONS = 2


def supervise(settings: Settings) -> int:
    """Run ``settings.workers`` workers until SIGTERM or SIGINT; return the exit status.

    0 after a graceful stop, 1 when start-up failed or the workers kept failing to start.
    """
    try:
        return asyncio.run(Supervisor(settings).run())
    except StartupError as err:
        _log.error("lane service failed to start: %s", err)
        return 1


@dataclass
class _Worker:
    number: int
    process: asyncio.subprocess.Process
    #: Resolves to True once the worker serves, False if it exited before that.
    ready: asyncio.Task[bool]

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Supervisor:
    """Starts, watches, replaces and stops the workers; see the module docstring."""

    settings: Settings
    _workers: dict[int, _Worker] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _stop_signal: signal.Signals = signal.SIGTERM
    _failed: bool = False
    _start_failures: int = 0
    _worker_env: dict[str, str] = field(default_factory=dict)

    async def run(self) -> int:
        """Prepare, run the workers until asked to stop, stop them; return the exit status."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            async with contextlib.AsyncExitStack() as held:
                # A signal during a slow start (initdb, an unreachable database) must not wait.
                preparing = asyncio.ensure_future(self._prepare(held))
                stop_waiter = asyncio.ensure_future(self._stopping.wait())
                try:
                    await asyncio.wait(
                        {preparing, stop_waiter}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    stop_waiter.cancel()
                if not preparing.done():
                    preparing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await preparing
                    _log.info("start-up abandoned")
                    return 0
                preparing.result()  # raises StartupError
                await self._run_workers()
            _log.info("lane supervisor stopped")
            return 1 if self._failed else 0
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    # -- before the workers ---------------------------------------------------------------

    async def _prepare(self, held: contextlib.AsyncExitStack) -> None:
        """Start the embedded PostgreSQL if needed, migrate, reserve the port; ``held`` releases
        what was taken, after the workers exit (also when this is cancelled half-way)."""
        settings = self.settings
        if sys.platform != "linux":
            _log.warning(
                "SO_REUSEPORT does not spread connections over processes on %s: one worker "
                "may get them all; set LANE_WORKERS=1 here",
                sys.platform,
            )
        if settings.database_url is None:
            embedded = await _start_embedded_once(settings, held)
            dsn, database = embedded.uri, f"embedded PostgreSQL at {embedded.cluster_dir}"
        else:
            dsn, database = settings.database_url, mask_password(settings.database_url)
        await check_database(dsn, database)
        store = await Store.open(dsn, min_size=1, max_size=1)
        try:
            applied = await store.migrate()
            await self._warn_about_connections(store)
        finally:
            await store.close()
        sockets, address = await asyncio.to_thread(reserve_port, settings.listen)
        for sock in sockets:
            held.callback(sock.close)
        self._worker_env = self._base_worker_env(dsn, address)
        if settings.http_listen is not None:
            # The HTTP port is shared the same way: reserved here (a free one picked for port
            # 0, so that every worker serves the same), bound by each worker with SO_REUSEPORT.
            sockets, http_address = await asyncio.to_thread(reserve_port, settings.http_listen)
            for sock in sockets:
                held.callback(sock.close)
            self._worker_env["LANE_HTTP_LISTEN"] = http_address
            scheme = "http" if settings.tls_cert_file is None else "https"
            _log.info(
                "workers serve Connect and gRPC-Web on %s; web view at %s://%s/",
                http_address,
                scheme,
                http_address,
            )
        _log.info(
            "lane supervisor (pid %d) starting %d workers on %s (%s); database: %s; "
            "migrations applied now: %s",
            os.getpid(),
            settings.workers,
            address,
            transport_description(settings),
            database,
            ", ".join(applied) if applied else "none (schema up to date)",
        )

    async def _warn_about_connections(self, store: Store) -> None:
        needed = self.settings.workers * (self.settings.db_pool_size + HUB_CONNECTIONS)
        try:
            allowed = await store.connections_allowed()
        except psycopg.Error:
            return  # only a warning: never a reason not to start
        if allowed is not None and needed > allowed:
            _log.warning(
                "%d workers may open up to %d database connections, more than the %d the "
                "database allows: lower LANE_WORKERS or LANE_DB_POOL_SIZE, or raise "
                "max_connections",
                self.settings.workers,
                needed,
                allowed,
            )

    def _base_worker_env(self, dsn: str, address: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            LANE_DATABASE_URL=dsn,
            LANE_LISTEN=address,
            LANE_WORKERS="1",
            # As in service/lane/server/app/__main__.py: no gRPC fork handlers in the worker.
            GRPC_ENABLE_FORK_SUPPORT="0",
        )
        # The worker reads the rest (TLS, auth, limits, log format) itself, from the same
        # environment the supervisor checked.
        return env

    # -- the workers -----------------------------------------------------------------------

    async def _run_workers(self) -> None:
        slots = [
            asyncio.create_task(self._keep(number), name=f"worker-{number}")
            for number in range(1, self.settings.workers + 1)
        ]
        try:
            await self._stopping.wait()
            _, pending = await asyncio.wait(
                slots, timeout=self.settings.grace_seconds + DRAIN_MARGIN_SECONDS
            )
            if pending:
                for worker in list(self._workers.values()):
                    _log.warning(
                        "worker %d (pid %d) still running after its grace period: killing it",
                        worker.number,
                        worker.pid,
                    )
                    with contextlib.suppress(ProcessLookupError):
                        worker.process.kill()
                await asyncio.wait(pending)
        finally:
            for slot in slots:
                slot.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            for worker in list(self._workers.values()):  # only after a bug: never leave one
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                await worker.process.wait()

    async def _keep(self, number: int) -> None:
        """Keep worker ``number`` running until the supervisor stops."""
        retry = START_RETRY_FIRST_SECONDS
        try:
            while not self._stopping.is_set():
                worker = await self._spawn(number)
                try:
                    ready = await worker.ready
                    if ready:
                        self._start_failures = 0
                        retry = START_RETRY_FIRST_SECONDS
                    status = await worker.process.wait()
                finally:
                    self._workers.pop(number, None)
                if self._stopping.is_set():
                    return
                if ready:
                    _log.warning(
                        "worker %d (pid %d) died unexpectedly (%s); starting a replacement",
                        number,
                        worker.pid,
                        describe_exit(status),
                    )
                    continue
                self._start_failures += 1
                if self._start_failures >= MAX_START_FAILURES:
                    _log.error(
                        "worker %d (pid %d) failed to start (%s): %d start-up failures in a "
                        "row, giving up",
                        number,
                        worker.pid,
                        describe_exit(status),
                        self._start_failures,
                    )
                    self._fail()
                    return
                _log.warning(
                    "worker %d (pid %d) failed to start (%s); retrying in %.2g s",
                    number,
                    worker.pid,
                    describe_exit(status),
                    retry,
                )
                with contextlib.suppress(TimeoutError):  # not wait_for: see Hub._send_doorbells
                    async with asyncio.timeout(retry):
                        await self._stopping.wait()
                retry = min(retry * 2, START_RETRY_MAX_SECONDS)
        except Exception:
            _log.exception("supervising worker %d failed", number)
            self._fail()

    async def _spawn(self, number: int) -> _Worker:
        read_fd, write_fd = os.pipe()
        try:
            env = self._worker_env | {WORKER_VARIABLE: f"{number}:{write_fd}:{os.getpid()}"}
            metrics = worker_metrics_listen(self.settings.metrics_listen, number)
            if metrics is not None:
                env["LANE_METRICS_LISTEN"] = metrics
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "lane.server.app",
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        worker = _Worker(number, process, asyncio.create_task(_read_ready(read_fd)))
        self._workers[number] = worker
        _log.info("worker %d started (pid %d)", number, worker.pid)
        if self._stopping.is_set():  # asked to stop while it was being spawned
            _signal(worker, self._stop_signal)
        return worker

    # -- stopping --------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stopping.is_set():
            _log.info("received %s: stopping %d workers", sig.name, len(self._workers))
        self._stop(sig)

    def _fail(self) -> None:
        self._failed = True
        self._stop(signal.SIGTERM)

    def _stop(self, sig: signal.Signals) -> None:
        if not self._stopping.is_set():
            self._stop_signal = sig
            self._stopping.set()
        for worker in list(self._workers.values()):
            _signal(worker, sig)


async def _start_embedded_once(
    settings: Settings, held: contextlib.AsyncExitStack
) -> EmbeddedPostgres:
    # pgserver blocks (initdb, pg_ctl) and cannot be interrupted: if we are cancelled
    # meanwhile, let it finish and stop it again rather than leave it running unknown.
    starting = asyncio.ensure_future(asyncio.to_thread(start_embedded, settings.data_dir))
    try:
        embedded = await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            started = await starting
            await asyncio.to_thread(started.stop)
        raise
    held.push_async_callback(asyncio.to_thread, embedded.stop)
    return embedded


async def _read_ready(read_fd: int) -> bool:
    """Whether the worker behind ``read_fd`` wrote that it serves before closing the pipe."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(read_fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        return await reader.read() == READY
    finally:
        transport.close()


def _signal(worker: _Worker, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        worker.process.send_signal(sig)


def describe_exit(status: int) -> str:
    """``exit status 1`` or ``killed by SIGKILL`` for a process's return code."""
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


def worker_metrics_listen(listen: str | None, number: int) -> str | None:
    """Worker ``number``'s metrics address: port + number - 1 (port 0 stays 0: any free)."""
    if listen is None:
        return None
    host, _, port = listen.rpartition(":")
    return listen if int(port) == 0 else f"{host}:{int(port) + number - 1}"
