"""Versioned schema migrations, applied at start-up.

Migrations are the numbered ``schema/NNNN_name.sql`` files. Each is applied once, in order,
and recorded in ``schema_migrations``. All the migrations one start-up applies run in one
transaction, under an advisory lock: concurrent start-ups of several service processes wait
for each other, and a failing migration leaves the schema as it was before any of them.
"""

from __future__ import annotations

import re
from importlib import resources

import psycopg

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# An arbitrary constant: the key of the advisory lock that serializes migrators.
_MIGRATION_LOCK = 0x6C616E65


def available_migrations() -> list[tuple[int, str, str]]:
    """Return ``(version, name, sql)`` for every bundled migration, in version order."""
    found = []
    for item in resources.files("lane.server.store").joinpath("schema").iterdir():
        match = _MIGRATION_NAME.match(item.name)
        if match:
            found.append((int(match.group(1)), item.name, item.read_text(encoding="utf-8")))
    found.sort()
    return found


async def migrate(conn: psycopg.AsyncConnection[object]) -> list[str]:
    """Apply every migration not yet recorded; return the names applied."""
    applied: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_time timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT version FROM schema_migrations")
        done = {row[0] for row in await cur.fetchall()}  # type: ignore[index]
        for version, name, sql in available_migrations():
            if version in done:
                continue
            await conn.execute(sql.encode())
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name)
            )
            applied.append(name)
    return applied
