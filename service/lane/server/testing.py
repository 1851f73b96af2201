"""Throwaway databases on a real PostgreSQL, for tests, benchmarks and soak runs.

The service keeps everything in one database, so a test (or a program built on the service)
that wants a clean slate needs a database of its own::

    async with scratch_database("postgresql://me@localhost/postgres") as url:
        running = await start_server(url, listen="127.0.0.1:0")  # migrates the empty database
        ...

The server's role needs CREATEDB. The database in ``server_url`` is only used to run
``CREATE DATABASE``/``DROP DATABASE``; it is never written to. It lives in the server package,
not among the tests, so benchmarks use it without depending on the test suite.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

__all__ = ["scratch_database"]

#: PostgreSQL silently truncates longer identifiers, and the URL would name another database.
_MAX_NAME_BYTES = 63


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, *, prefix: str = "lane_scratch") -> AsyncIterator[str]:
    """Create an empty database ``<prefix>_<32 hex digits>`` on the server of ``server_url``;
    yield its URL (``server_url`` with the database name replaced); drop it on exit.

    The drop forces out connections still open (a test that leaked one must not make it fail
    or hang), and runs however the block ends.
    """
    name = f"{prefix}_{uuid.uuid4().hex}"
    if len(name.encode()) > _MAX_NAME_BYTES:
        raise ValueError(f"prefix {prefix!r} is too long for a database name")
    # CREATE/DROP DATABASE cannot run inside a transaction block.
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
