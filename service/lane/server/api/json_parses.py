"""JSON request bodies of the HTTP port read into request bytes: small ones at once, larger
ones in threads of their own, a few per namespace at a time.

A JSON body over :data:`~lane.server.api.json_counts.CHECKED_FROM_BYTES` is walked
(``json_counts.py``) and parsed in one of :data:`PARSE_THREADS` threads kept for this alone:
the default executor serves the commands' own work (``store/commit_step.py``), which large
JSON bodies must not queue. Each namespace has :data:`PARSES_PER_NAMESPACE` of those parses at
a time; up to :data:`WAITING_PER_NAMESPACE` more wait their turn, in order, and a body past
those is refused RESOURCE_EXHAUSTED ``TOO_MANY_JSON_REQUESTS`` with a retry delay. So one
client, however many requests it sends, holds at most that many of the threads, and another
namespace's body waits for at most one parse. (With auth off every caller is one namespace.)
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from lane.server.api.json_counts import CHECKED_FROM_BYTES, check_json_counts
from lane.server.domain.errors import ResourceExhausted

#: Threads that parse large JSON bodies, for the whole process.
PARSE_THREADS = 2
#: Large JSON bodies of one namespace parsed at once, and waiting for their turn.
PARSES_PER_NAMESPACE = 2
WAITING_PER_NAMESPACE = 8
#: The retry delay a TOO_MANY_JSON_REQUESTS refusal asks for (google.rpc.RetryInfo).
RETRY_SECONDS = 1.0


def json_to_bytes(text: bytes, request_type: type[Message]) -> bytes:
    """The JSON body ``text`` as the encoded ``request_type`` message; refuse one over a count
    limit before parsing it (``json_counts.py``). Raises what parsing raises on bad JSON."""
    check_json_counts(text, request_type)
    message = json_format.Parse(text, request_type(), ignore_unknown_fields=True)
    return bytes(message.SerializeToString())


@dataclass
class _Turns:
    """One namespace's parses: running (holding the semaphore) and waiting for it."""

    running: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(PARSES_PER_NAMESPACE)
    )
    queued: int = 0


class JsonParses:
    """The process's parses of large JSON bodies (see the module docstring)."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._namespaces: dict[str, _Turns] = {}

    async def to_bytes(self, text: bytes, request_type: type[Message], namespace: str) -> bytes:
        """:func:`json_to_bytes` of ``text``: at once when small, else in a parse thread, in
        ``namespace``'s turn (or refused ``TOO_MANY_JSON_REQUESTS`` when too many wait)."""
        if len(text) <= CHECKED_FROM_BYTES:
            return json_to_bytes(text, request_type)
        turns = self._namespaces.setdefault(namespace, _Turns())
        if turns.queued >= PARSES_PER_NAMESPACE + WAITING_PER_NAMESPACE:
            refusal = ResourceExhausted(
                "TOO_MANY_JSON_REQUESTS",
                f"namespace {namespace} has {turns.queued} large JSON requests being read on "
                "this server, its limit; retry later, or send the binary encoding "
                "(application/proto), which is read at once",
                namespace=namespace,
                limit=PARSES_PER_NAMESPACE + WAITING_PER_NAMESPACE,
            )
            refusal.retry_after_seconds = RETRY_SECONDS
            raise refusal
        turns.queued += 1
        try:
            await turns.running.acquire()
        except BaseException:
            self._leave(namespace, turns)
            raise
        if self._executor is None:
            self._executor = ThreadPoolExecutor(PARSE_THREADS, "lane-json")
        loop = asyncio.get_running_loop()
        parse = self._executor.submit(json_to_bytes, text, request_type)
        # The turn ends when the thread is done, not when the caller stops waiting: a client
        # that sends and leaves does not get to queue more parses behind its last.
        parse.add_done_callback(lambda _: _call_soon(loop, self._finished, namespace, turns))
        return await asyncio.wrap_future(parse)

    def _finished(self, namespace: str, turns: _Turns) -> None:
        turns.running.release()
        self._leave(namespace, turns)

    def _leave(self, namespace: str, turns: _Turns) -> None:
        turns.queued -= 1
        if turns.queued == 0 and self._namespaces.get(namespace) is turns:
            del self._namespaces[namespace]

    def close(self) -> None:
        """Let the parse threads go (parses in progress finish first)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """``callback(*args)`` on ``loop`` from a parse thread, unless the loop is gone (shutdown)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)
