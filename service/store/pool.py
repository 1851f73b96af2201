"""The store's connection pool and its lifecycle."""

from __future__ import annotations

from psycopg import AsyncConnection, InterfaceError, pq
from psycopg_pool import AsyncConnectionPool

from service.store import migrations

CHECKOUT_TIMEOUT_SECONDS = 3.0


async def _configure(conn: AsyncConnection[object]) -> None:
    await conn.set_autocommit(True)
    # A client that dies inside a transaction must not hold a lane row lock forever.
    await conn.execute("SET idle_in_transaction_session_timeout = '60s'")


async def _reset(conn: AsyncConnection[object]) -> None:
    # A caller cancelled inside ``conn.pipeline()`` leaves the connection in pipeline mode,
    # which the pool does not see (its transaction status reads idle). Raising here makes the
    # pool discard the connection instead of handing it to the next command.
    if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise InterfaceError("connection returned in pipeline mode; discarding it")


async def open_pool(dsn: str, *, min_size: int = 2, max_size: int = 10) -> AsyncConnectionPool:
    """Open a pool of autocommit connections (transactions are explicit) and wait for it."""
    pool: AsyncConnectionPool = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=_configure,
        reset=_reset,
        # No check on checkout: it costs a round trip per command. A connection broken while
        # idle fails its command with UNAVAILABLE (clients retry) and the pool replaces it.
        kwargs={"keepalives": 1, "keepalives_idle": 30},
        # While the database is down a command must fail fast with UNAVAILABLE (clients retry
        # with the same request id), not wait for the pool's default 30 s.
        timeout=CHECKOUT_TIMEOUT_SECONDS,
    )
    await pool.open(wait=True, timeout=30)
    return pool


async def migrate_pool(pool: AsyncConnectionPool) -> list[str]:
    """Apply pending migrations using one pooled connection."""
    async with pool.connection() as conn:
        return await migrations.migrate(conn)
