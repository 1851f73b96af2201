"""Group commit: the optimistic commit statements ready at the same moment in this process go
to PostgreSQL together, in one round trip and one transaction.

Each command's statement decides alone (``lane_writes``): it writes everything or, when its
lane's version moved on, nothing, and says which. So statements of different lanes can share a
transaction without one's outcome changing another's: the group is sent in one pipeline,
BEGIN, the statements, COMMIT, and each command reads its own statement's answer. What a
shared transaction saves is PostgreSQL's per-commit work (a commit record, a WAL flush, the
transaction's bookkeeping) and a pool checkout and a round trip per command.

An *error* is different: it aborts the whole transaction (a request id or an operation id used
before fails its statement on a primary key, a deadlock with another process's commit the
statement that waited, a row lock held longer than :data:`LOCK_WAIT` the statement that waited
for it). Then nothing of the group was written. The statement that failed is
known (the first whose result did not come back); its command gets the error, and every other
statement goes out again at once. A command never fails because of a neighbour, and none is
written twice. A lost connection fails the whole group, as it failed a lone command. The other
ways considered — a savepoint per statement, or a Sync per statement so that each commits
alone — and what they cost are in docs/architecture.md ("Group commit").

No commit window: a lone command is sent at once. A committer takes everything queued when it
starts a round trip; what arrives while that round trip is out waits for the next one. The busier
the process, the larger the groups (the natural batching of a leader/follower queue), and an
idle process commits each command by itself. A round trip out longer than
:data:`STALLED_SECONDS` lets another committer start.

Statements go out in lane order, so two groups (two processes) that touch the same lanes lock
their rows in the same order and never deadlock on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from lane.server import metrics
from lane.server.store.lane_ref import LaneRef
from lane.server.store.lane_writes import CommitStatement

#: Round trips in flight at once per process (besides stalled ones). One keeps groups largest;
#: PostgreSQL still overlaps this process's group with other processes' commits.
COMMITTERS = 1
#: Statements per group at most: a transaction stays short, and so does each row lock held.
MAX_GROUP = 64
#: A round trip out this long (a statement waiting for a row lock another process holds, a
#: checkout waiting for a connection) stops holding the queue back: another committer starts,
#: so one blocked group never blocks every command of the process.
STALLED_SECONDS = 0.05


#: How long a statement of a group of several waits for a row lock (another process's commit,
#: a transaction held by hand) before it gives up: the group is then sent again without it, and
#: its command waits for the lock in a transaction of its own (lane_store). Waiting in the group
#: would hold every other statement of the group, and their commands, for as long as the lock.
LOCK_WAIT = "100ms"


#: The transaction of a group of several. Its statements are prepared on first use on each
#: connection, and planned once there (a generic plan): they find their rows by key, so a plan
#: made for the values at hand (PostgreSQL's custom plans, which it otherwise makes for a
#: statement's first five executions and whenever it judges them cheaper) is the same plan,
#: planned again. The setting is the transaction's own: other queries of the connection are
#: planned as usual. A lone statement goes alone (see ``_send_alone``): under load, when
#: planning counts, groups hold several.
_BEGIN = (
    "BEGIN",
    "SET LOCAL plan_cache_mode = force_generic_plan",
    f"SET LOCAL lock_timeout = '{LOCK_WAIT}'",
)


class _Committer:
    """One committer task's state."""

    __slots__ = ("stalled",)

    def __init__(self) -> None:
        self.stalled = False


class _Queued:
    """A statement waiting for its group, and where its outcome goes."""

    __slots__ = ("future", "lane", "statement")

    def __init__(
        self, lane: LaneRef, statement: CommitStatement, future: asyncio.Future[bool]
    ) -> None:
        self.lane = lane
        self.statement = statement
        self.future = future


class GroupCommitter:
    """Commits :class:`CommitStatement`\\ s of different lanes together (module docstring)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        committers: int = COMMITTERS,
        max_group: int = MAX_GROUP,
    ) -> None:
        self._pool = pool
        self._committers = committers
        self._max_group = max_group
        self._queue: list[_Queued] = []
        #: Committers running and not stalled (each a task sending groups until the queue is
        #: empty).
        self._active = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Transactions committed, and the statements they carried (both only grow): the
        #: process's commits per transaction is their ratio.
        self.transactions = 0
        self.statements = 0
        #: Groups sent again without a statement that failed them.
        self.retried_groups = 0

    async def commit(self, lane: LaneRef, statement: CommitStatement) -> bool:
        """Commit ``statement`` with whatever else is ready; True when it wrote (the lane was
        at the version it expects). A database error of this statement is raised as is; one of
        another statement of its group is not: this one is then sent again."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(lane, statement, future))
        if self._active < self._committers:
            self._start()
        return await future

    def _start(self) -> None:
        self._active += 1
        task = asyncio.create_task(self._commit_queued(), name="group-commit")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stalled(self, committer: _Committer) -> None:
        """``committer``'s round trip is out for :data:`STALLED_SECONDS`: it no longer holds
        the next group back."""
        committer.stalled = True
        self._active -= 1
        if self._queue and self._active < self._committers:
            self._start()

    async def _commit_queued(self) -> None:
        """Send the queue in groups until it is empty (or this committer stalled: another
        one took over)."""
        me = _Committer()
        loop = asyncio.get_running_loop()
        try:
            while self._queue and not me.stalled:
                group = self._queue[: self._max_group]
                del self._queue[: self._max_group]
                stall = loop.call_later(STALLED_SECONDS, self._stalled, me)
                try:
                    await self._commit_group(group)
                except BaseException as exc:
                    # Connection lost, pool exhausted, cancelled: the outcome of the whole
                    # group is that of one statement whose connection failed mid-commit.
                    for queued in group:
                        if not queued.future.done():
                            queued.future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    stall.cancel()
        finally:
            # No await between the queue found empty and this: a statement queued after it
            # finds a committer place free and starts one.
            if not me.stalled:
                self._active -= 1
            if self._queue and not self._active:
                # Cancelled (the process stops): the statements still queued will not be sent.
                for queued in self._queue:
                    queued.future.cancel()
                self._queue.clear()

    async def _commit_group(self, group: list[_Queued]) -> None:
        group.sort(key=_lane_order)
        async with self._pool.connection() as conn:
            while group:
                failed = await self._send(conn, group)
                if failed is None:
                    return
                # Everything was rolled back: the rest go again, the failed one has its error.
                group = [queued for queued in group if queued is not failed]
                self.retried_groups += bool(group)

    async def _send(self, conn: AsyncConnection[Any], group: Sequence[_Queued]) -> _Queued | None:
        """One round trip: the group's statements in one transaction. Sets each statement's
        outcome and returns None, or, when a statement failed (nothing was written then), sets
        that one's error and returns it."""
        if len(group) == 1:
            return await self._send_alone(conn, group[0])
        cursors = []
        try:
            # BEGIN and COMMIT spelled out, not left to the implicit transaction the pipeline's
            # Sync would commit: should anything fail here before COMMIT is queued, the Sync
            # then commits nothing, and no statement of the group is written half-acknowledged.
            async with conn.pipeline():
                for command in _BEGIN:
                    await conn.execute(command)
                for queued in group:
                    statement = queued.statement
                    cursors.append(
                        await conn.execute(statement.sql, statement.params, prepare=True)
                    )
                await conn.execute("COMMIT")
        except psycopg.Error as exc:
            if conn.broken:
                raise
            # Also forgets the connection's prepared statements, on both sides: a statement
            # whose preparation was queued after the error was skipped, though psycopg took
            # it as prepared.
            await conn.rollback()
            failed = _failed(group, cursors)
            if failed is None:
                raise
            if not failed.future.done():  # (cancelled: the process stops)
                failed.future.set_exception(exc)
            return failed
        self._committed(len(group))
        for queued, cursor in zip(group, cursors, strict=True):
            _answer(queued, await cursor.fetchone())
        return None

    async def _send_alone(self, conn: AsyncConnection[Any], queued: _Queued) -> _Queued | None:
        """A group of one: the statement alone, its own transaction (one statement is all or
        nothing by itself: no BEGIN, no COMMIT, no plan setting to send around it)."""
        statement = queued.statement
        try:
            cursor = await conn.execute(statement.sql, statement.params, prepare=True)
            row = await cursor.fetchone()
        except psycopg.Error as exc:
            if conn.broken:
                raise
            if not queued.future.done():
                queued.future.set_exception(exc)
            return queued
        self._committed(1)
        _answer(queued, row)
        return None

    def _committed(self, statements: int) -> None:
        self.transactions += 1
        self.statements += statements
        metrics.current.group_commits.inc()


def _answer(queued: _Queued, row: tuple[Any, ...] | None) -> None:
    """Tell the statement's command whether it wrote."""
    if not queued.future.done():  # (cancelled: the process stops)
        queued.future.set_result(row is not None and row[0] == 1)


def _lane_order(queued: _Queued) -> LaneRef:
    return queued.lane


def _failed(
    group: Sequence[_Queued], cursors: Sequence[psycopg.AsyncCursor[Any]]
) -> _Queued | None:
    """The statement whose error aborted the group: the first one without a result (psycopg
    sets a statement's result only when it succeeded; those after the error were skipped).
    None when every statement came back (the error was the commit's own)."""
    for queued, cursor in zip(group, cursors, strict=False):
        if cursor.pgresult is None:
            return queued
    if len(cursors) < len(group):
        return group[len(cursors)]  # failed while being queued (psycopg raised at execute)
    return None
