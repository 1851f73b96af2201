"""A group's transaction in one write: BEGIN, its settings, its statements, COMMIT and a Sync go
to PostgreSQL together, and their results are read back together.

psycopg's pipeline mode writes each statement to the socket as it is queued: a group of K
statements costs K + 5 writes (BEGIN, the settings, the statements, COMMIT, the Sync and a
flush request), each a system call here and a wake-up of the backend there, and a pass through
psycopg's execute path each. This module queues the whole group on the connection's libpq
pipeline (``psycopg.pq``, psycopg's public libpq layer) and writes it once, with psycopg's own
parameter adaptation (``psycopg.adapt.Transformer``): the same bytes psycopg would send, in
one write.

Each statement is prepared once per connection under a name of this module's (prepared
statements outlive a rolled-back transaction, so one prepared in a group that failed is kept
too). psycopg deallocates every prepared statement of a connection when it rolls back a
transaction there (``DEALLOCATE ALL``, e.g. after a refused command under the lane lock), so
a statement this module prepared may be gone: the group that finds one missing is rolled back,
every name of that connection forgotten, and the group sent again at once with its statements
prepared anew (under new names).

When a statement fails (a request id used before, a row lock waited for too long, a
deadlock) the transaction is rolled back, on the same pipeline (psycopg's own ``rollback()``
would also deallocate every prepared statement of the connection), and :func:`write_group`
names the statement and its error (psycopg's exception for the SQLSTATE, with the server's
diagnostics): the caller gives that command the error and sends the rest again. Anything else
that keeps the group from committing (a parameter that cannot be adapted, a failed COMMIT)
makes the caller send the group again through psycopg's own pipeline, statement by statement.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection, pq
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq.abc import PGresult

from lane.server import traces
from lane.server.store.lane_writes import CommitStatement

#: A statement's shape: its SQL and its parameters' types.
_Shape = tuple[bytes, tuple[int, ...]]
#: The shapes prepared on each connection, and their names.
_PREPARED: weakref.WeakKeyDictionary[AsyncConnection[Any], dict[_Shape, bytes]] = (
    weakref.WeakKeyDictionary()
)
_NAMES = itertools.count(1)
_PLACEHOLDER = re.compile(r"%\((\w+)\)([sbt])|%%")
_FORMATS = {"s": PyFormat.AUTO, "b": PyFormat.BINARY, "t": PyFormat.TEXT}


class _Queued(NamedTuple):
    """One statement as it goes out: its prepared statement (and whether to prepare it first)
    and its parameters, adapted."""

    name: bytes
    sql: bytes
    types: tuple[int, ...]
    prepare: bool
    values: Sequence[Buffer | None]
    formats: Sequence[int]


class Stats:
    """What happened here in this process."""

    __slots__ = ("statements_lost",)

    def __init__(self) -> None:
        #: Groups that found their connection's prepared statements gone (and went again).
        self.statements_lost = 0


stats = Stats()


class GroupFailed(Exception):
    """The group's transaction did not commit (nothing of it was written): send it again the
    usual way."""


class StatementFailed(Exception):
    """The statement at ``index`` failed with ``error`` (psycopg's exception for its SQLSTATE),
    and the group's transaction with it: nothing of the group was written."""

    def __init__(self, index: int, error: psycopg.Error) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


@lru_cache(maxsize=1024)
def converted(sql: str) -> tuple[bytes, tuple[str, ...], tuple[PyFormat, ...]]:
    """``sql`` with ``%(name)s`` / ``%(name)b`` / ``%(name)t`` placeholders as PostgreSQL's
    ``$n`` (one per name, as psycopg numbers them), the names in order, and each one's format."""
    names: dict[str, tuple[str, PyFormat]] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        name, fmt = match.group(1), _FORMATS[match.group(2)]
        found = names.get(name)
        if found is None:
            found = names[name] = (f"${len(names) + 1}", fmt)
        elif found[1] != fmt:
            raise ValueError(f"placeholder {name} has two formats")
        return found[0]

    text = _PLACEHOLDER.sub(number, sql)
    return (
        text.encode(),
        tuple(names),
        tuple(fmt for _, fmt in names.values()),
    )


async def write_group(
    conn: AsyncConnection[Any],
    statements: Sequence[CommitStatement],
    prologue: Sequence[str] = (),
    epilogue: Sequence[str] = (),
    *,
    again: bool = False,
) -> list[bool]:
    """Run ``prologue`` (BEGIN and the settings: commands without parameters), ``statements``
    and ``epilogue`` (COMMIT) on ``conn`` in one write, followed by a Sync (which commits a
    lone statement sent without BEGIN and COMMIT); whether each statement wrote. When the
    transaction did not commit (it was rolled back: nothing written), raises
    :class:`StatementFailed` when a statement failed, else :class:`GroupFailed`; and whatever
    the connection raises when it breaks. (``again``: this is the second try of a group whose
    prepared statements were gone.)"""
    prepared = _PREPARED.setdefault(conn, {})
    #: Names given in this group to shapes new on the connection.
    made: dict[_Shape, bytes] = {}
    # Every statement's parameters adapted first: one that cannot be (a bug) fails here, before
    # anything is sent, and the group goes the usual way, where it fails alone.
    transformer = Transformer.from_context(conn)
    queued: list[_Queued] = []
    try:
        for statement in statements:
            sql, names, formats = converted(statement.sql)
            params = statement.params
            values = transformer.dump_sequence([params[name] for name in names], formats)
            types = tuple(transformer.types or ())
            key = (sql, types)
            name = prepared.get(key) or made.get(key)
            prepare = name is None
            if name is None:
                name = made[key] = b"lane_group_%d" % next(_NAMES)
            formats_out = tuple(transformer.formats or ())
            queued.append(_Queued(name, sql, types, prepare, values, formats_out))
    except Exception as exc:
        raise GroupFailed() from exc
    first = prologue[0] if prologue else statements[0].sql if statements else ""
    with traces.statements(first, len(prologue) + len(statements) + len(epilogue)):
        return await _write(conn, queued, prologue, epilogue, prepared, statements, again)


async def _write(
    conn: AsyncConnection[Any],
    queued: Sequence[_Queued],
    prologue: Sequence[str],
    epilogue: Sequence[str],
    prepared: dict[_Shape, bytes],
    statements: Sequence[CommitStatement],
    again: bool,
) -> list[bool]:
    pg = conn.pgconn
    pg.enter_pipeline_mode()
    try:
        for command in prologue:
            pg.send_query_params(command.encode(), None)
        for one in queued:
            if one.prepare:
                pg.send_prepare(one.name, one.sql, param_types=one.types)
            pg.send_query_prepared(one.name, one.values, param_formats=one.formats)
        for command in epilogue:
            pg.send_query_params(command.encode(), None)
        pg.pipeline_sync()
        results = await _exchange(conn)
        failed = pg.transaction_status != pq.TransactionStatus.IDLE or any(
            result.status not in _OK for result in results
        )
        if failed and pg.transaction_status != pq.TransactionStatus.IDLE:
            # Rolled back here, not with psycopg's rollback(), which would also deallocate
            # every prepared statement of the connection (psycopg's and these).
            pg.send_query_params(b"ROLLBACK", None)
            pg.pipeline_sync()
            await _exchange(conn)
    except BaseException:
        # Written partly, or read partly: the connection's state is unknown; it is closed
        # (the pool drops it) rather than handed on.
        pg.finish()
        raise
    pg.exit_pipeline_mode()
    # The results: the prologue's, then per statement its Prepare's (if sent) and its own,
    # then the epilogue's.
    at = len(prologue)
    written = []
    first_error: tuple[int, PGresult] | None = None
    for index, one in enumerate(queued):
        mine = [results[at], results[at + 1]] if one.prepare else [results[at]]
        at += len(mine)
        if one.prepare and mine[0].status == pq.ExecStatus.COMMAND_OK:
            # Prepared statements outlive a rolled-back transaction: kept, whatever else.
            prepared[(one.sql, one.types)] = one.name
        for result in mine:
            if first_error is None and result.status == pq.ExecStatus.FATAL_ERROR:
                first_error = (index, result)
        written.append(mine[-1].ntuples > 0 and mine[-1].get_value(0, 0) == b"1")
    if not failed:
        return written
    if first_error is not None and _sqlstate(first_error[1]) == _NO_SUCH_STATEMENT:
        # Deallocated behind this module's back (psycopg's DEALLOCATE ALL after a rollback on
        # the connection): every name of it is gone. Nothing was written: once more, with
        # every statement prepared again.
        prepared.clear()
        stats.statements_lost += 1
        if not again:
            return await write_group(conn, statements, prologue, epilogue, again=True)
    elif first_error is not None:
        index, result = first_error
        error = psycopg.errors.lookup((_sqlstate(result) or b"XX000").decode())
        message = (result.error_message or b"").decode(errors="replace").strip()
        raise StatementFailed(index, error(message, info=result))
    raise GroupFailed()


def _sqlstate(result: PGresult) -> bytes | None:
    if result.status != pq.ExecStatus.FATAL_ERROR:
        return None
    return result.error_field(pq.DiagnosticField.SQLSTATE)


#: SQLSTATE invalid_sql_statement_name: a prepared statement the connection does not have.
_NO_SUCH_STATEMENT = b"26000"
_OK = frozenset({pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK})


async def _exchange(conn: AsyncConnection[Any]) -> list[PGresult]:
    """Write what the connection's pipeline holds and read every result up to its Sync (the
    Sync's own left out): one list entry per query, its last result."""
    pg = conn.pgconn
    loop = asyncio.get_running_loop()
    fd = conn.fileno()
    results: list[PGresult] = []
    while pg.flush():
        # The output did not fit the socket at once: wait until it takes more, reading what
        # comes back meanwhile so that neither side waits for the other.
        if await _ready(loop, fd, write=True):
            pg.consume_input()
    while True:
        while pg.is_busy():
            await _ready(loop, fd, write=False)
            pg.consume_input()
        result = pg.get_result()
        if result is None:
            continue  # the end of one query's results
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            return results
        results.append(result)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> bool:
    """Wait until ``fd`` can be read (or, ``write``, written or read); whether it can be
    read."""
    done: asyncio.Future[bool] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(True)

    def writable() -> None:
        if not done.done():
            done.set_result(False)

    loop.add_reader(fd, readable)
    if write:
        loop.add_writer(fd, writable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)
        if write:
            loop.remove_writer(fd)
