"""LISTEN/NOTIFY on connections of their own, for the hub's doorbells.

Neither kind of connection comes from the pool: a LISTEN connection must stay one session for
as long as it listens, and a pooled connection per doorbell would cost a checkout and compete
with commands. Failures of either come out as :class:`ChannelError` (the cause chained), so the
hub needs nothing of psycopg.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

import psycopg

#: Channel names are spelled into ``LISTEN`` as they are: plain lower-case identifiers only.
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]*\Z")


class ChannelError(Exception):
    """A LISTEN or NOTIFY connection could not be opened, or failed (see ``__cause__``)."""


class Notification(NamedTuple):
    """One NOTIFY heard."""

    #: The backend pid of the session that sent it (compare :attr:`Notifier.pid`).
    pid: int
    payload: str


def _checked(channel: str) -> str:
    if not _CHANNEL.match(channel):
        raise ValueError(f"not a plain channel name: {channel!r}")
    return channel


class Listener:
    """A session LISTENing on one channel (see :func:`listen`)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def notifications(self) -> AsyncIterator[Notification]:
        """Every notification heard, as it arrives, until the connection fails
        (:class:`ChannelError`)."""
        try:
            async for notification in self._conn.notifies():
                yield Notification(notification.pid, notification.payload)
        except (psycopg.Error, OSError) as exc:
            raise ChannelError(str(exc)) from exc


@contextlib.asynccontextmanager
async def listen(
    conninfo: str, channel: str, *, hello: str | None, application_name: str
) -> AsyncIterator[Listener]:
    """A new session on ``conninfo`` that sends ``hello`` on ``channel`` (when not None), then
    LISTENs on it, for the block. Raises :class:`ChannelError` when that fails."""
    channel = _checked(channel)
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, application_name=application_name
        )
    except (psycopg.Error, OSError) as exc:
        raise ChannelError(str(exc)) from exc
    try:
        try:
            if hello is not None:
                await conn.execute("SELECT pg_notify(%s, %s)", (channel, hello))
            # Spelled out (the channel was checked): tools find the session by this query.
            await conn.execute(f"LISTEN {channel}")
        except (psycopg.Error, OSError) as exc:
            raise ChannelError(str(exc)) from exc
        yield Listener(conn)
    finally:
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()


class Notifier:
    """One session that sends NOTIFYs, opened on first use and again after a failure."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pid = 0

    @property
    def pid(self) -> int:
        """The backend pid of the session opened last (0 before the first): notifications
        from it are this notifier's own."""
        return self._pid

    async def send(self, channel: str, payloads: Sequence[str]) -> None:
        """NOTIFY ``channel`` once per payload, in one transaction of their own. Raises
        :class:`ChannelError` when that fails (the session is then opened again next time)."""
        channel = _checked(channel)
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                self._pid = self._conn.info.backend_pid
            await self._conn.execute(
                "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload",
                (channel, list(payloads)),
            )
        except (psycopg.Error, OSError) as exc:
            await self.close()
            raise ChannelError(str(exc)) from exc

    async def close(self) -> None:
        """Close the session, if one is open."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
