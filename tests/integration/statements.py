"""Recording the SQL statements this process sends (the tests' servers run in it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from lane.server.store import group_commit, group_write


@dataclass
class Statement:
    sql: str
    params: Any
    #: The transaction it ran in (per connection), or None for a statement of its own.
    transaction: int | None


@dataclass
class Recorder:
    statements: list[Statement] = field(default_factory=list)
    transactions: dict[int, int] = field(default_factory=dict)
    next_transaction: int = 0

    def record(self, conn: Any, query: Any, params: Any) -> None:
        sql = query.decode() if isinstance(query, bytes) else str(query)
        self.statements.append(Statement(sql, params, self.transactions.get(id(conn))))


@contextlib.asynccontextmanager
async def recording(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Recorder]:
    recorder = Recorder()
    execute = psycopg.AsyncCursor.execute
    executemany = psycopg.AsyncCursor.executemany
    write_group = group_write.write_group
    transaction = psycopg.AsyncConnection.transaction

    async def recorded_execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        recorder.record(self.connection, query, params)
        return await execute(self, query, params, **kw)

    async def recorded_executemany(self: Any, query: Any, params_seq: Any, **kw: Any) -> Any:
        params_seq = list(params_seq)
        for params in params_seq:
            recorder.record(self.connection, query, params)
        return await executemany(self, query, params_seq, **kw)

    @contextlib.asynccontextmanager
    async def recorded_transaction(self: Any, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        outer = id(self) not in recorder.transactions
        if outer:
            recorder.next_transaction += 1
            recorder.transactions[id(self)] = recorder.next_transaction
        try:
            async with transaction(self, *args, **kw) as tx:
                yield tx
        finally:
            if outer:
                del recorder.transactions[id(self)]

    async def recorded_group(conn: Any, statements: Any, *args: Any, **kw: Any) -> Any:
        # The group committer's own path (one write for a group): each statement as sent.
        for statement in statements:
            recorder.record(conn, statement.sql, statement.params)
        return await write_group(conn, statements, *args, **kw)

    monkeypatch.setattr(group_commit, "write_group", recorded_group)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", recorded_execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "executemany", recorded_executemany)
    monkeypatch.setattr(psycopg.AsyncConnection, "transaction", recorded_transaction)
    yield recorder
