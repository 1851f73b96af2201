"""The PostgreSQL store: one transaction per command under the lane row lock."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from service.store.pool import migrate_pool, open_pool


class Store:
    """Durable lanes in PostgreSQL. Create with :meth:`open`."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, dsn: str, *, min_size: int = 2, max_size: int = 10) -> Store:
        """Connect a pool to ``dsn``. Does not migrate; call :meth:`migrate`."""
        return cls(await open_pool(dsn, min_size=min_size, max_size=max_size))

    async def migrate(self) -> list[str]:
        """Apply pending schema migrations; return their names."""
        return await migrate_pool(self.pool)

    async def close(self) -> None:
        """Close every connection."""
        await self.pool.close()
