"""A local HTTP server speaking a model provider's wire format, for the official SDKs to talk
to through their ``base_url``.

A test queues :class:`Reply` s per path; each request takes the next one of its path and is
recorded (:attr:`FakeProvider.requests`: the path, headers and JSON body). A reply is either a
JSON body with a status (an error, say a 429 with ``retry-after``) or a server-sent-event
stream: :class:`Event` s written one chunk each (chunked transfer encoding), and
:class:`Gate` s, where the stream waits until the test opens them. Gates let a test see what
the lane holds while the provider is mid-answer, without timing anything; a gate never opened
is a provider that stalls mid-answer. :data:`DROP` in a stream cuts the connection there (no
end of the chunked body), as a provider whose connection breaks mid-answer.

HTTP/1.1 with ``Connection: close`` after every reply: small and enough for the SDKs' clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """One server-sent event: ``event:`` (optional) and ``data:`` (JSON, or text as is)."""

    data: Any
    event: str | None = None

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else json.dumps(self.data)
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {data}\n\n".encode()


@dataclass
class Gate:
    """A point in a stream where the server waits until :meth:`open` (and says it got there)."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    def open(self) -> None:
        self.opened.set()


@dataclass(frozen=True)
class Drop:
    """The point where the server drops the connection mid-stream."""


#: Drop the connection here.
DROP = Drop()


@dataclass
class Reply:
    """One HTTP answer: ``body`` as JSON with ``status``, or ``stream`` as SSE (status 200)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    stream: list[Event | Gate | Drop] | None = None


@dataclass(frozen=True)
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeProvider:
    """The server (see the module doc). ``async with FakeProvider() as provider:``."""

    def __init__(self) -> None:
        self.replies: dict[str, deque[Reply]] = defaultdict(deque)
        self.requests: list[Recorded] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def queue(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to ``path`` with ``replies``, in order."""
        self.replies[path].extend(replies)

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies of the requests to ``path``, in order."""
        return [r.body for r in self.requests if r.path == path]

    async def __aenter__(self) -> FakeProvider:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away (an aborted run closes its stream)
        except asyncio.CancelledError:
            # The server is closing with this reply held at a gate. Ending normally: asyncio
            # reports a cancelled connection task as an error.
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        path = target.split("?", 1)[0]
        self.requests.append(Recorded(method, path, headers, json.loads(raw) if raw else None))
        queued = self.replies.get(path)
        if not queued:
            reply = Reply(status=404, body={"error": {"message": f"nothing queued for {path}"}})
        else:
            reply = queued.popleft()
        if reply.stream is None:
            body = json.dumps(reply.body).encode()
            writer.write(
                self._head(reply, "application/json", {"content-length": str(len(body))}) + body
            )
            await writer.drain()
            return
        writer.write(self._head(reply, "text/event-stream", {"transfer-encoding": "chunked"}))
        await writer.drain()
        for item in reply.stream:
            if isinstance(item, Gate):
                item.reached.set()
                await item.opened.wait()
                continue
            if isinstance(item, Drop):
                writer.transport.abort()  # a reset, not the body's last chunk
                return
            data = item.encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    @staticmethod
    def _head(reply: Reply, content_type: str, extra: dict[str, str]) -> bytes:
        reasons = {
            200: "OK",
            400: "Bad Request",
            401: "Unauthorized",
            429: "Too Many Requests",
            500: "Server Error",
        }
        lines = [f"HTTP/1.1 {reply.status} {reasons.get(reply.status, 'Status')}"]
        headers = {"content-type": content_type, "connection": "close", **extra, **reply.headers}
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode()
