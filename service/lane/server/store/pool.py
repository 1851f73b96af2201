"""The store's connection pool and its lifecycle.

A command checks a connection out of the pool (``LANE_DB_POOL_SIZE`` connections at most) and
holds it for its one transaction. Checking out ends in one of three ways:

* a connection, at once or after waiting for another command to give one back;
* :class:`DatabaseBusy` when the wait ran out (``LANE_DB_CHECKOUT_TIMEOUT_SECONDS``) while the
  database was reachable: every connection stayed lent to other commands, and no attempt to
  connect had failed since the database last answered. The api answers RESOURCE_EXHAUSTED
  ``DATABASE_BUSY``: the database is healthy but this process has more work than connections;
* :class:`DatabaseUnreachable` when no connection can be made: the pool's last attempt to
  connect failed (PostgreSQL down, refusing connections, unreachable, or read-only: a standby
  not yet promoted) and no command has used a connection successfully since, or the pool has
  nothing lent that could come back. The api answers UNAVAILABLE with a RetryInfo, as for a
  connection that breaks mid-command. This comes promptly, not after the checkout timeout:
  while the last attempt to connect failed, a command waits at most
  :data:`UNREACHABLE_WAIT_SECONDS` (the pool may be reconnecting meanwhile), and every waiting
  command is answered as soon as an attempt to connect fails.

Reconnecting. A connection that broke is replaced in the background. psycopg_pool's own
schedule for a failed attempt backs off 1, 2, 4, 8, 16 s ...: after a failover the pool would
find the promoted standby up to twice the outage late. Here a failed attempt is tried again
after a short wait drawn between half of ``LANE_DB_RECONNECT_SECONDS`` and all of it (so that
processes that lost the database together do not come back in step), for as long as it fails;
while the database is unreachable one attempt per wait is enough, so the other connections'
attempts hold back. A command that arrives meanwhile makes the next attempt happen now (unless
one is under way or began a quarter of the wait ago), so under load the pool follows a new
primary within a fraction of a second; and the first success sends every other waiting attempt
at once. Attempts give up on a host after ``connect_timeout`` (5 s unless the URL says
otherwise; libpq's default is to wait for TCP, minutes on a host that vanished), then try the
URL's next host.

Read-only servers are refused. A server in recovery (a hot standby) or with
``default_transaction_read_only`` on fails every write; with ``target_session_attrs=read-write``
libpq refuses it, and without it the pool does the same (the server reports both settings at
connect and when they change, so this costs no round trip): such an attempt counts as failed,
and a pooled connection whose server turned read-only is discarded when it comes back.

Both errors are :class:`~psycopg_pool.PoolTimeout` (a ``psycopg.OperationalError``), so code
that treats any database error as transient (the maintenance loops, the hub) needs no change.

A command never waits past its caller's gRPC deadline: grpc.aio cancels the handler when the
deadline passes, and a cancelled checkout gives its place (or its connection) back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from typing import Any

from psycopg import AsyncConnection, InterfaceError, OperationalError, pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.pool_async import AddConnection, MaintenanceTask

from lane.server import traces
from lane.server.store import migrations

#: The defaults of ``LANE_DB_POOL_SIZE`` and ``LANE_DB_CHECKOUT_TIMEOUT_SECONDS`` (reasons in
#: ``service/lane/server/app/config.py``).
DEFAULT_POOL_SIZE = 10
DEFAULT_CHECKOUT_TIMEOUT_SECONDS = 10.0
#: Connections the pool keeps open when idle (fewer when the pool is smaller).
MIN_IDLE_CONNECTIONS = 2
#: While the last attempt to connect failed, how long a command waits for a connection (one may
#: come from a reconnection in progress) before it is answered UNAVAILABLE.
UNREACHABLE_WAIT_SECONDS = 1.0
#: The default of ``LANE_DB_RECONNECT_SECONDS``: after a failed attempt to connect, the next
#: comes after a wait drawn between half of this and all of it (see the module docstring).
DEFAULT_RECONNECT_SECONDS = 1.0
#: libpq's ``connect_timeout`` (seconds, per host) unless the URL names one.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 5


def reconnect_delay(longest: float) -> float:
    """The wait before trying to connect again after a failure: drawn between half of
    ``longest`` and ``longest``, so that processes failing together do not retry together."""
    return random.uniform(longest / 2, longest)


def with_connect_timeout(conninfo: str) -> str:
    """``conninfo`` with ``connect_timeout`` set to :data:`DEFAULT_CONNECT_TIMEOUT_SECONDS`
    when it names none (libpq would wait for TCP: minutes on a host that vanished, before it
    tries a multi-host URL's next host)."""
    if "connect_timeout" in conninfo_to_dict(conninfo):
        return conninfo
    return make_conninfo(conninfo, connect_timeout=DEFAULT_CONNECT_TIMEOUT_SECONDS)


class DatabaseBusy(PoolTimeout):
    """Every connection stayed busy with other commands for the whole checkout wait, while the
    database was reachable."""

    def __init__(self, pool_size: int, waited: float) -> None:
        super().__init__(
            f"all {pool_size} database connections of this server stayed busy for {waited:g}s"
        )
        self.pool_size = pool_size
        self.waited = waited


class DatabaseUnreachable(PoolTimeout):
    """No connection to the database could be made (or none to a server that takes writes)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__("no connection to a writable database could be made")
        #: When the pool will have tried again (the refusal's RetryInfo), in seconds.
        self.retry_after = retry_after


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (libpq's run on with hints and every host tried)."""
    return str(error).strip().partition("\n")[0]


def read_only(conn: AsyncConnection[Any]) -> bool:
    """Whether the server of ``conn`` refuses writes: in recovery (a hot standby) or with
    ``default_transaction_read_only`` on, as it reported them (PostgreSQL 14 and later report
    both, at connect and when they change; older servers: False)."""
    status = conn.info.parameter_status
    return status("in_hot_standby") == "on" or status("default_transaction_read_only") == "on"


async def _configure(conn: AsyncConnection[object]) -> None:
    if read_only(conn):
        # A URL without target_session_attrs=read-write that reaches a standby: no use to
        # commands. Failing here makes it a failed attempt to connect (module docstring).
        await conn.close()
        raise OperationalError("the server is read-only (a standby, or read-only by default)")
    await conn.set_autocommit(True)
    # A client that dies inside a transaction must not hold a lane row lock forever. And the
    # service bumps lane versions itself; writers without lane.writer bump them through
    # triggers (schema 0005), so no process commands a lane from a copy older than a hand edit.
    await conn.execute(
        "SET idle_in_transaction_session_timeout = '60s'; SET lane.writer = 'service'"
    )
    traces.instrument_connection(conn)  # nothing while traces are off


async def _reset(conn: AsyncConnection[object]) -> None:
    # A caller cancelled inside ``conn.pipeline()`` leaves the connection in pipeline mode,
    # which the pool does not see (its transaction status reads idle). Raising here makes the
    # pool discard the connection instead of handing it to the next command.
    if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise InterfaceError("connection returned in pipeline mode; discarding it")
    if read_only(conn):
        raise InterfaceError("the server turned read-only; discarding the connection")


class LanePool(AsyncConnectionPool):
    """An :class:`AsyncConnectionPool` whose checkout tells a busy pool from an unreachable
    database, and which reconnects on a short schedule (see the module docstring)."""

    def __init__(
        self,
        conninfo: str,
        *,
        checkout_timeout: float,
        reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(conninfo, timeout=checkout_timeout, **kwargs)
        #: Connections checked out and not yet given back.
        self.lent = 0
        #: The longest wait between attempts to connect (``LANE_DB_RECONNECT_SECONDS``).
        self.reconnect_seconds = reconnect_seconds
        #: Set while the pool's last attempt to connect failed.
        self._unreachable = asyncio.Event()
        #: Set when an attempt to connect fails, then replaced: whoever holds it learns of the
        #: next failure.
        self._failure = asyncio.Event()
        self._connecting = 0
        self._last_attempt = -float("inf")
        #: When a connection last showed the database reachable and writable (monotonic).
        self.last_writable = -float("inf")
        #: Why the last failed attempt to connect failed (its error's first line).
        self.last_failure = ""
        #: Attempts to connect waiting for their time, each woken early by setting its future.
        self._due: deque[asyncio.Future[None]] = deque()
        self._waiting_attempts: set[asyncio.Task[None]] = set()
        self._returning: set[asyncio.Task[None]] = set()

    @property
    def reachable(self) -> bool:
        """False while the pool's last attempt to connect failed."""
        return not self._unreachable.is_set()

    async def wait_unreachable(self) -> None:
        """Return once an attempt to connect has failed (at once if the last one did)."""
        await self._unreachable.wait()

    async def _connect(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the base)
        # The pool makes every connection here (at open, growing, replacing a broken one).
        self._connecting += 1
        self._last_attempt = time.monotonic()
        try:
            conn = await super()._connect(timeout)
        except Exception as exc:
            self.last_failure = first_line(exc)
            self._unreachable.set()
            failure, self._failure = self._failure, asyncio.Event()
            failure.set()  # wakes the commands waiting for a connection
            raise
        finally:
            self._connecting -= 1
        self._reachable_again()
        return conn

    def _reachable_again(self) -> None:
        self.last_writable = time.monotonic()
        if self._unreachable.is_set():
            self._unreachable.clear()
            self._wake_attempts(every=True)  # fill the pool now, not one wait later

    async def schedule_task(self, task: MaintenanceTask, delay: float) -> None:
        """Run ``task`` after ``delay`` seconds; an attempt to connect that failed is tried
        again on this pool's schedule instead (see the module docstring)."""
        if not isinstance(task, AddConnection):
            await super().schedule_task(task, delay)
            return
        waiting = asyncio.ensure_future(self._attempt_again(task))
        self._waiting_attempts.add(waiting)
        waiting.add_done_callback(self._waiting_attempts.discard)

    async def _attempt_again(self, task: AddConnection) -> None:
        loop = asyncio.get_running_loop()
        while True:
            woken = loop.create_future()
            self._due.append(woken)
            try:
                async with asyncio.timeout(reconnect_delay(self.reconnect_seconds)):
                    await woken
                break  # woken: a command is waiting, or the database is back
            except TimeoutError:
                pass
            finally:
                with contextlib.suppress(ValueError):
                    self._due.remove(woken)
            if self.reachable or not self._tried_within(self.reconnect_seconds / 2):
                break
            # Unreachable, and another attempt is under way or has just failed: one per wait
            # is enough, the others wait another turn.
        self.run_task(task)

    def _tried_within(self, seconds: float) -> bool:
        """Whether an attempt to connect is under way or began less than ``seconds`` ago."""
        return bool(self._connecting) or time.monotonic() - self._last_attempt < seconds

    def _wake_attempts(self, *, every: bool) -> None:
        while self._due:
            woken = self._due.popleft()
            if not woken.done():
                woken.set_result(None)
                if not every:
                    return

    def _attempt_soon(self) -> None:
        """A command waits while the database is unreachable: make the next attempt to
        connect now, unless one is under way or began a quarter of the wait ago."""
        if not self._tried_within(self.reconnect_seconds / 4):
            self._wake_attempts(every=False)

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 (the base)
        """Close the pool (and drop the attempts to connect still waiting)."""
        for waiting in list(self._waiting_attempts):
            waiting.cancel()
        await super().close(timeout)

    async def getconn(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the base)
        """A connection, or :class:`DatabaseBusy` / :class:`DatabaseUnreachable`."""
        wait = self.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            if self._unreachable.is_set():
                self._attempt_soon()
                try:
                    conn = await self._wait_for_connection(min(wait, UNREACHABLE_WAIT_SECONDS))
                except PoolTimeout:
                    raise self._unreachable_error() from None
            elif self.get_stats()["pool_available"]:
                # One is ready (the usual case): taken at once. If another command took it
                # first, this one waits in the queue, but never long without checking on the
                # database: the queue alone would hold it for the whole checkout timeout.
                try:
                    conn = await super().getconn(min(wait, UNREACHABLE_WAIT_SECONDS))
                except PoolTimeout:
                    left = wait - (time.monotonic() - started)
                    if left <= 0 or self._unreachable.is_set():
                        raise
                    conn = await self._wait_for_connection(left)
            else:
                conn = await self._wait_for_connection(wait)
        except (DatabaseBusy, DatabaseUnreachable):
            raise
        except PoolTimeout:
            if self.lent and not self._unreachable.is_set():
                raise DatabaseBusy(self.max_size, wait) from None
            raise self._unreachable_error() from None
        self.lent += 1
        return conn

    def _unreachable_error(self) -> DatabaseUnreachable:
        return DatabaseUnreachable(retry_after=self.reconnect_seconds / 2)

    async def putconn(self, conn: Any) -> None:
        self.lent -= 1
        if conn.pgconn.status == pq.ConnStatus.OK and not read_only(conn):
            # A command just used it: the database is reachable, whatever a failed attempt to
            # open another connection said (e.g. the server's max_connections was reached).
            self._reachable_again()
        await super().putconn(conn)

    async def _wait_for_connection(self, wait: float) -> Any:
        """Wait in the pool's queue for a connection, giving up as soon as an attempt to
        connect fails."""
        checkout = asyncio.ensure_future(super().getconn(wait))
        failed = asyncio.ensure_future(self._failure.wait())
        claimed = False
        try:
            await asyncio.wait((checkout, failed), return_when=asyncio.FIRST_COMPLETED)
            if not checkout.done():
                raise self._unreachable_error()
            conn = checkout.result()
            claimed = True
            return conn
        finally:
            failed.cancel()
            if not claimed:
                # Also when this command was cancelled: a connection the checkout got anyway
                # goes back to the pool, not lost.
                checkout.cancel()
                checkout.add_done_callback(self._give_back)

    def _give_back(self, checkout: asyncio.Future[Any]) -> None:
        if checkout.cancelled() or checkout.exception() is not None:
            return
        task = asyncio.ensure_future(AsyncConnectionPool.putconn(self, checkout.result()))
        self._returning.add(task)
        task.add_done_callback(self._returning.discard)


async def open_pool(
    dsn: str,
    *,
    min_size: int = MIN_IDLE_CONNECTIONS,
    max_size: int = 10,
    checkout_timeout: float | None = None,
    reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS,
) -> LanePool:
    """Open a pool of autocommit connections (transactions are explicit) and wait for it.

    ``checkout_timeout``: how long a command waits for a free connection while the database
    is reachable (see the module docstring); None: :data:`DEFAULT_CHECKOUT_TIMEOUT_SECONDS`.
    ``reconnect_seconds``: the longest wait between attempts to connect after a failure."""
    pool = LanePool(
        with_connect_timeout(dsn),
        checkout_timeout=(
            DEFAULT_CHECKOUT_TIMEOUT_SECONDS if checkout_timeout is None else checkout_timeout
        ),
        reconnect_seconds=reconnect_seconds,
        min_size=min(min_size, max_size),
        max_size=max_size,
        open=False,
        configure=_configure,
        reset=_reset,
        # No check on checkout: it costs a round trip per command. A connection broken while
        # idle fails its command with UNAVAILABLE (clients retry) and the pool replaces it.
        kwargs={"keepalives": 1, "keepalives_idle": 30},
    )
    await pool.open(wait=True, timeout=30)
    return pool


async def unready_reason(pool: LanePool, *, within: float) -> str | None:
    """Why commands cannot be served now (None: they can): no connection to the database can
    be made, or its server refuses writes. A connection used well less than ``within`` seconds
    ago, with no failed attempt to connect since, answers without a probe; else one is checked
    out (waiting ``within`` at most) and asked. A pool too busy to lend one that soon counts as
    ready: the database answers, the process is merely busy."""
    if pool.reachable and time.monotonic() - pool.last_writable < within:
        return None
    try:
        conn = await pool.getconn(within)
    except DatabaseBusy:
        return None
    except PoolTimeout:
        return f"no connection to a writable database ({pool.last_failure or 'none made'})"
    try:
        cursor = await conn.execute(
            "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"
        )
        row = await cursor.fetchone()
    except OperationalError as exc:
        return f"the database connection failed ({first_line(exc)})"
    finally:
        await pool.putconn(conn)
    if row is not None and row[0]:
        return "the database is read-only (a standby)"
    return None


async def migrate_pool(pool: AsyncConnectionPool) -> list[str]:
    """Apply pending migrations using one pooled connection."""
    async with pool.connection() as conn:
        return await migrations.migrate(conn)
