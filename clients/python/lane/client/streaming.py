"""Committing a streaming model's partial answers, coalesced.

A streaming model reports its answer so far through ``ModelRequest.partial`` as often as its
provider sends a delta (:mod:`lane.client.model`). :class:`PartialCommits` turns those reports
into ``AppendAssistantStream`` commits under one rule:

* **at most one commit per ``interval``** (0.1 s by default: at most 10 commits per second per
  run), and one at a time: a commit starts once the previous one was answered and ``interval``
  passed since it started;
* **the newest partial wins**: the partials reported between two commits are coalesced, and
  the next commit carries the message as it is when the commit starts;
* **a finished block is never coalesced away**: a partial reported with
  ``block_complete=True`` is copied then and goes in the next commit as a partial of its own
  (one commit may carry several, each its own ``message_update`` event), so every text,
  thinking and tool-call block is committed in its finished form while the answer still
  streams.

Each committed partial is a copy with stop reason ``PENDING``. Nothing is flushed at the end:
the settled message (``SettleAssistantMessage``) replaces the partial, so :meth:`close` only
waits for a commit in flight, which keeps the commits of one turn in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from lane.v1 import messages_pb2

__all__ = ["DEFAULT_INTERVAL", "PartialCommits"]

_log = logging.getLogger(__name__)

#: Seconds between two commits of one run's partials (10 per second at most).
DEFAULT_INTERVAL = 0.1

#: Bytes of copied finished-block partials one commit carries at most (far below the service's
#: 4 MiB request limit); older copies beyond it are dropped, the newest partial always goes.
_CARRY_BYTES = 1 << 20

Commit = Callable[[list[messages_pb2.AssistantMessage]], Awaitable[None]]


def _pending_copy(message: messages_pb2.AssistantMessage) -> messages_pb2.AssistantMessage:
    partial = messages_pb2.AssistantMessage()
    partial.CopyFrom(message)
    partial.stop_reason = messages_pb2.STOP_REASON_PENDING
    partial.ClearField("error_message")
    if not partial.HasField("timestamp"):
        partial.timestamp.GetCurrentTime()
    return partial


class PartialCommits:
    """The partials of one model call, committed by ``commit`` (see the module doc). Call it
    as the request's :class:`~lane.client.model.PartialSink`; :meth:`close` before settling."""

    def __init__(self, commit: Commit, *, interval: float = DEFAULT_INTERVAL) -> None:
        self._commit = commit
        self._interval = interval
        #: The newest partial (a reference: read when the commit starts) and its number.
        self._latest: messages_pb2.AssistantMessage | None = None
        self._latest_seq = 0
        #: Copies of partials that completed a block, with their numbers, not committed yet.
        self._finished: list[tuple[int, messages_pb2.AssistantMessage]] = []
        self._seq = 0
        self._committed_seq = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._in_commit = False
        #: The exception that stopped committing, if any.
        self.failure: BaseException | None = None
        #: Commits made, and partials they carried.
        self.commits = 0
        self.partials = 0

    def __call__(
        self, message: messages_pb2.AssistantMessage, *, block_complete: bool = False
    ) -> None:
        if self._closed or self.failure is not None:
            return
        self._seq += 1
        self._latest, self._latest_seq = message, self._seq
        if block_complete:
            self._finished.append((self._seq, _pending_copy(message)))
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="commit partials")

    async def _run(self) -> None:
        last_start = float("-inf")
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            if self._latest_seq <= self._committed_seq:
                continue
            wait = last_start + self._interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            batch, seq = self._take()
            last_start = time.monotonic()
            self._in_commit = True
            try:
                await self._commit(batch)
            except Exception as err:  # kept for the driver; the settlement decides the turn
                _log.warning("committing a streamed partial failed: %s", err)
                self.failure = err
                return
            finally:
                self._in_commit = False
            self._committed_seq = seq
            self.commits += 1
            self.partials += len(batch)

    def _take(self) -> tuple[list[messages_pb2.AssistantMessage], int]:
        """The partials of the next commit, oldest first: the finished-block copies (the newest
        that fit in ``_CARRY_BYTES``), then the newest partial unless the last copy is it."""
        finished, self._finished = self._finished, []
        seq = self._latest_seq
        batch: list[messages_pb2.AssistantMessage] = []
        newest_copied = bool(finished) and finished[-1][0] == seq
        if not newest_copied and self._latest is not None:
            batch.append(_pending_copy(self._latest))
        size = sum(m.ByteSize() for m in batch)
        for _, copy in reversed(finished):
            size += copy.ByteSize()
            if batch and size > _CARRY_BYTES:
                break
            batch.insert(0, copy)
        return batch, seq

    async def close(self) -> None:
        """Stop committing: a commit in flight is awaited, partials not yet committed are
        dropped (the settled message replaces them)."""
        self._closed = True
        task = self._task
        if task is None or task.done():
            return
        if self._in_commit:
            # Let it finish: the lane sees the partial before the settlement, and the commands
            # of the turn stay in order (a unary settle must not overtake it).
            self._wake.set()
            await task
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
