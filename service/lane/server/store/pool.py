"""The store's connection pool and its lifecycle.

A command checks a connection out of the pool (``LANE_DB_POOL_SIZE`` connections at most) and
holds it for its one transaction. Checking out ends in one of three ways:

* a connection, at once or after waiting for another command to give one back;
* :class:`DatabaseBusy` when the wait ran out (``LANE_DB_CHECKOUT_TIMEOUT_SECONDS``) while the
  database was reachable: every connection stayed lent to other commands, and no attempt to
  connect had failed since the database last answered. The api answers RESOURCE_EXHAUSTED
  ``DATABASE_BUSY``: the database is healthy but this process has more work than connections;
* :class:`DatabaseUnreachable` when no connection can be made: the pool's last attempt to
  connect failed (PostgreSQL down, refusing connections, or unreachable) and no command has
  used a connection successfully since, or the pool has nothing lent that could come back.
  The api answers UNAVAILABLE, as for a connection that breaks mid-command. This comes
  promptly, not after the checkout timeout: while the last attempt to connect failed, a
  command waits at most :data:`UNREACHABLE_WAIT_SECONDS` (the pool may be reconnecting
  meanwhile), and a command already waiting is answered as soon as an attempt fails.

Both are :class:`~psycopg_pool.PoolTimeout` (a ``psycopg.OperationalError``), so code that
treats any database error as transient (the maintenance loops, the hub) needs no change.

A command never waits past its caller's gRPC deadline: grpc.aio cancels the handler when the
deadline passes, and a cancelled checkout gives its place (or its connection) back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection, InterfaceError, pq
from psycopg_pool import AsyncConnectionPool, PoolTimeout

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
    """No connection to the database could be made."""


async def _configure(conn: AsyncConnection[object]) -> None:
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


class LanePool(AsyncConnectionPool):
    """An :class:`AsyncConnectionPool` whose checkout tells a busy pool from an unreachable
    database (see the module docstring)."""

    def __init__(self, conninfo: str, *, checkout_timeout: float, **kwargs: Any) -> None:
        super().__init__(conninfo, timeout=checkout_timeout, **kwargs)
        #: Connections checked out and not yet given back.
        self.lent = 0
        #: Set while the pool's last attempt to connect failed.
        self._unreachable = asyncio.Event()
        self._returning: set[asyncio.Task[None]] = set()

    @property
    def reachable(self) -> bool:
        """False while the pool's last attempt to connect failed."""
        return not self._unreachable.is_set()

    async def _connect(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the base)
        # The pool makes every connection here (at open, growing, replacing a broken one).
        try:
            conn = await super()._connect(timeout)
        except Exception:
            self._unreachable.set()  # also wakes the commands waiting for a connection
            raise
        self._unreachable.clear()
        return conn

    async def getconn(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the base)
        """A connection, or :class:`DatabaseBusy` / :class:`DatabaseUnreachable`."""
        wait = self.timeout if timeout is None else timeout
        try:
            if self._unreachable.is_set():
                conn = await super().getconn(min(wait, UNREACHABLE_WAIT_SECONDS))
            elif self.get_stats()["pool_available"]:
                conn = await super().getconn(wait)
            else:
                conn = await self._wait_for_connection(wait)
        except (DatabaseBusy, DatabaseUnreachable):
            raise
        except PoolTimeout:
            if self.lent and not self._unreachable.is_set():
                raise DatabaseBusy(self.max_size, wait) from None
            raise DatabaseUnreachable("no connection to the database could be made") from None
        self.lent += 1
        return conn

    async def putconn(self, conn: Any) -> None:
        self.lent -= 1
        if conn.pgconn.status == pq.ConnStatus.OK:
            # A command just used it: the database is reachable, whatever a failed attempt to
            # open another connection said (e.g. the server's max_connections was reached).
            self._unreachable.clear()
        await super().putconn(conn)

    async def _wait_for_connection(self, wait: float) -> Any:
        """Wait in the pool's queue for a connection, giving up as soon as an attempt to
        connect fails."""
        checkout = asyncio.ensure_future(super().getconn(wait))
        unreachable = asyncio.ensure_future(self._unreachable.wait())
        claimed = False
        try:
            await asyncio.wait((checkout, unreachable), return_when=asyncio.FIRST_COMPLETED)
            if not checkout.done():
                raise DatabaseUnreachable("no connection to the database could be made")
            conn = checkout.result()
            claimed = True
            return conn
        finally:
            unreachable.cancel()
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
) -> LanePool:
    """Open a pool of autocommit connections (transactions are explicit) and wait for it.

    ``checkout_timeout``: how long a command waits for a free connection while the database
    is reachable (see the module docstring); None: :data:`DEFAULT_CHECKOUT_TIMEOUT_SECONDS`."""
    pool = LanePool(
        dsn,
        checkout_timeout=(
            DEFAULT_CHECKOUT_TIMEOUT_SECONDS if checkout_timeout is None else checkout_timeout
        ),
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


async def migrate_pool(pool: AsyncConnectionPool) -> list[str]:
    """Apply pending migrations using one pooled connection."""
    async with pool.connection() as conn:
        return await migrations.migrate(conn)
