"""Lane changes for WatchLanes: each followed namespace's lanes, their latest summaries, and the
streams that follow them in this process.

A namespace with WatchLanes streams here has a :class:`Board`: the latest summary this process
knows of each lane in its streams' scope, and the streams (:class:`Follower`). A change reaches
the board in one of these ways, and each summary is computed once per change and process and
shared by all its streams (which frame it once, too: :meth:`LaneChange.entry`):

- a commit in this process (the store's commit listener, through the hub): the summary is
  computed from the lane's state the store keeps in memory, with no read — or read, when that
  state is not the commit's or does not tell how the last operation ended;
- a doorbell from another process (NOTIFY ``ns/lane``: a hub sends them for every commit in a
  namespace another process announced, ``interest.py``) or its deletion notice: the lane's
  summary is read, coalesced with the others waiting, a few hundred lanes per statement;
- the poll, every ``poll_interval`` seconds, one statement per followed namespace shared by all
  its streams: the head (incarnation, revision) of every lane in the streams' scope, compared
  with the board's; a lane that moved, is new, or is gone is read or ended. Correctness never
  depends on NOTIFY: a lost doorbell costs at most one poll interval.

A board publishes a lane's change only when it is newer than what it holds (a later
incarnation, or a later revision of the same one), so summaries never go back. Each stream
keeps at most one pending change per lane — the latest — so a stream that does not read holds
one entry per lane it follows, never a backlog. A deletion is a change too (``deleted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from lane.v1 import lane_service_pb2 as pb

from lane.server.hub.idle import Bell, IdleWakeups
from lane.server.store import EventGroup, LaneFilter, LaneRef, Store
from lane.server.store.lane_summary import known_result_status, summary_of

log = logging.getLogger(__name__)

#: Lanes whose summaries one read takes at most.
READ_BATCH = 500
#: A failed read is tried again after this long, doubling up to the maximum.
READ_RETRY_SECONDS = 0.1
READ_RETRY_MAX_SECONDS = 1.0

#: Frames a summary as one entry of a WatchLanesResponse (the api's framing).
Framer = Callable[[pb.LaneSummary], bytes]


class LaneChange:
    """A lane's latest state as one process knows it: its summary, or its deletion."""

    __slots__ = ("_entry", "deleted", "incarnation", "lane_id", "revision", "summary")

    def __init__(
        self,
        lane_id: str,
        incarnation: int,
        revision: int,
        line: pb.LaneSummary | None,
    ) -> None:
        self.lane_id = lane_id
        self.incarnation = incarnation
        self.revision = revision
        #: None for a deletion.
        self.summary = line
        self.deleted = line is None
        self._entry: bytes | None = None

    @classmethod
    def of(cls, line: pb.LaneSummary) -> LaneChange:
        """The change to ``line``."""
        return cls(line.lane_id, int(line.incarnation), line.revision, line)

    def newer_than(self, other: LaneChange | None) -> bool:
        """Whether this change comes after ``other`` (None: nothing known)."""
        if other is None:
            return True
        if self.incarnation != other.incarnation:
            return self.incarnation > other.incarnation
        if self.deleted or other.deleted:
            return self.deleted and not other.deleted
        return self.revision > other.revision

    def entry(self, framer: Framer) -> bytes:
        """The summary framed for the wire, by the first stream to send it (always with the
        same ``framer``), the same bytes for every later one."""
        if self._entry is None:
            assert self.summary is not None
            self._entry = framer(self.summary)
        return self._entry


class Follower(Bell):
    """One WatchLanes stream's interest: its filter, its pending changes (the latest per lane),
    its doorbell. Use it as a context manager; leaving it stops following."""

    __slots__ = ("_board", "_pending", "lanes")

    def __init__(self, board: Board, lanes: LaneFilter, *, closed: bool) -> None:
        super().__init__(board.idle, closed=closed)
        self.lanes = lanes
        self._board = board
        self._pending: dict[str, LaneChange] = {}

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._board.unfollow(self)

    def offer(self, change: LaneChange) -> None:
        """A lane this stream may follow changed: keep only its latest change, and wake it."""
        self._pending[change.lane_id] = change
        self.ring()

    def take(self) -> list[LaneChange]:
        """The changes since the last take, at most one per lane (the latest)."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, {}
        return list(pending.values())

    def seen(self, lines: Iterable[pb.LaneSummary]) -> None:
        """The stream read these summaries itself (its listing): the board learns them."""
        self._board.learn(lines)


class Board:
    """A namespace followed here: its streams, the latest change of each lane in their scope,
    the lanes waiting to be read."""

    def __init__(self, changes: LaneChanges, namespace: str) -> None:
        self.namespace = namespace
        self.followers: set[Follower] = set()
        #: The latest change of each lane this process knows of (summaries and deletions).
        self.latest: dict[str, LaneChange] = {}
        #: Lanes whose summaries are to be read.
        self.dirty: set[str] = set()
        self.reader: asyncio.Task[None] | None = None
        self.idle = changes.idle
        self._changes = changes

    def unfollow(self, follower: Follower) -> None:
        """``follower``'s stream ended."""
        self.followers.discard(follower)
        if not self.followers:
            self._changes._drop(self)

    def admits(self, lane_id: str) -> bool:
        """Whether any stream here may follow ``lane_id``."""
        return any(follower.lanes.admits_id(lane_id) for follower in self.followers)

    def scope(self) -> tuple[frozenset[str] | None, frozenset[str]]:
        """The lanes the streams may follow: (prefixes, ids) — None for prefixes: all."""
        prefixes: set[str] = set()
        ids: set[str] = set()
        for follower in self.followers:
            lanes = follower.lanes
            if lanes.lane_ids is not None:
                ids.update(lanes.lane_ids)
            elif lanes.prefix:
                prefixes.add(lanes.prefix)
            else:
                return None, frozenset()
        return frozenset(prefixes), frozenset(ids)

    def publish(self, change: LaneChange) -> bool:
        """Hand ``change`` to the streams that may follow its lane, if it is news."""
        if not change.newer_than(self.latest.get(change.lane_id)):
            return False
        self.latest[change.lane_id] = change
        for follower in self.followers:
            if follower.lanes.admits_id(change.lane_id):
                follower.offer(change)
        return True

    def learn(self, lines: Iterable[pb.LaneSummary]) -> None:
        """Summaries read by a stream's listing: kept as the latest where they are news (the
        other streams get them too: they may not have read them yet)."""
        for line in lines:
            self.publish(LaneChange.of(line))

    def want(self, lane_ids: Iterable[str]) -> None:
        """Read these lanes' summaries soon (coalesced: one reader per board)."""
        self.dirty.update(lane_ids)
        if self.reader is None and self.dirty and self._changes._boards.get(self.namespace) is self:
            reader = asyncio.create_task(self._read(), name="lane-changes-read")
            self.reader = reader
            self._changes._readers.add(reader)
            reader.add_done_callback(self._changes._readers.discard)

    async def _read(self) -> None:
        retry = READ_RETRY_SECONDS
        store = self._changes.store
        try:
            while self.dirty and self._changes._boards.get(self.namespace) is self:
                batch = sorted(self.dirty)[:READ_BATCH]
                self.dirty.difference_update(batch)
                before = {lane_id: self.latest.get(lane_id) for lane_id in batch}
                try:
                    rows = await store.lane_summaries(
                        self.namespace, LaneFilter(lane_ids=frozenset(batch)), len(batch)
                    )
                except Exception as exc:  # the database: transient, try again
                    log.warning("could not read lane summaries of %s: %s", self.namespace, exc)
                    self.dirty.update(batch)
                    await asyncio.sleep(retry)
                    retry = min(retry * 2, READ_RETRY_MAX_SECONDS)
                    continue
                retry = READ_RETRY_SECONDS
                found = set()
                for row in rows:
                    found.add(row.lane_id)
                    self.publish(LaneChange.of(row.line()))
                for lane_id, known in before.items():
                    # Gone since: deleted (unless something newer came meanwhile).
                    gone = lane_id not in found and known is not None and not known.deleted
                    if gone and known is not None and self.latest.get(lane_id) is known:
                        self.publish(LaneChange(lane_id, known.incarnation, 0, None))
        finally:
            self.reader = None


class LaneChanges:
    """This process's boards (see the module docstring). The hub feeds it commits, deletions
    and doorbells, and runs its poll."""

    def __init__(
        self,
        store: Store,
        idle: IdleWakeups,
        *,
        poll_interval: float,
        followed: Callable[[str], None] = lambda namespace: None,
    ) -> None:
        self.store = store
        #: Ends the waits of streams idle for their heartbeat interval (the hub's).
        self.idle = idle
        self.poll_interval = poll_interval
        self._boards: dict[str, Board] = {}
        self._readers: set[asyncio.Task[None]] = set()
        self._followed = followed
        self._closing = False
        self._poll_soon = asyncio.Event()
        #: Summaries computed from a commit's state, and read from the database (counters for
        #: tests and benchmarks: the common path reads nothing).
        self.computed = 0
        self.polls = 0

    def namespaces(self) -> list[str]:
        """The namespaces followed here."""
        return sorted(self._boards)

    def follow(self, namespace: str, lanes: LaneFilter) -> Follower:
        """Start following the namespace's lanes that ``lanes`` admits; use the follower as a
        context manager. Subscribe before listing: no change after the listing passes unseen."""
        board = self._boards.get(namespace)
        if board is None:
            board = self._boards[namespace] = Board(self, namespace)
            self._followed(namespace)
        follower = Follower(board, lanes, closed=self._closing)
        board.followers.add(follower)
        return follower

    def followers(self, namespace: str | None = None) -> int:
        """Streams following lanes here (of one namespace, or of all)."""
        boards = self._boards.values() if namespace is None else [self._boards.get(namespace)]
        return sum(len(board.followers) for board in boards if board is not None)

    def _drop(self, board: Board) -> None:
        if self._boards.get(board.namespace) is board:
            del self._boards[board.namespace]

    def close(self) -> None:
        """Ask every stream, and every later one, to end (server shutdown)."""
        self._closing = True
        for board in self._boards.values():
            for follower in board.followers:
                follower.close()

    async def stop(self) -> None:
        """Stop the readers."""
        readers = list(self._readers)
        for reader in readers:
            reader.cancel()
        for reader in readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    # -- what the hub hands over --------------------------------------------------------------

    def committed(self, lane: LaneRef, incarnation: int, group: EventGroup) -> None:
        """A commit in this process: publish the lane's summary, from the state the store
        keeps when it is this commit's (else read it)."""
        board = self._boards.get(lane.namespace)
        if board is None or not board.admits(lane.lane_id):
            return
        state = self.store.known_state(lane)
        if (
            state is not None
            and state.incarnation == incarnation
            and state.revision == group.last_revision
        ):
            previous = board.latest.get(lane.lane_id)
            status = known_result_status(state, None if previous is None else previous.summary)
            if status is not None:
                self.computed += 1
                line = summary_of(state, last_activity=group.commit_time, last_result_status=status)
                board.publish(LaneChange.of(line))
                return
        board.want((lane.lane_id,))

    def deleted(self, lane: LaneRef, incarnation: int | None) -> None:
        """The lane's ``incarnation`` was deleted (None: some incarnation — read it)."""
        board = self._boards.get(lane.namespace)
        if board is None or not board.admits(lane.lane_id):
            return
        if incarnation is None:
            board.want((lane.lane_id,))
        else:
            board.publish(LaneChange(lane.lane_id, incarnation, 0, None))

    def rang(self, lane: LaneRef) -> None:
        """Another process committed to the lane (a doorbell): read its summary."""
        board = self._boards.get(lane.namespace)
        if board is not None and board.admits(lane.lane_id):
            board.want((lane.lane_id,))

    def poll_soon(self) -> None:
        """Poll now rather than at the next interval (a doorbell may have been missed)."""
        self._poll_soon.set()

    # -- the poll ---------------------------------------------------------------------------

    async def poll_forever(self) -> None:
        """Compare every followed namespace's heads with its board, every interval."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._poll_soon.wait()
            self._poll_soon.clear()
            for board in list(self._boards.values()):
                try:
                    await self._poll(board)
                except Exception as exc:  # the database: transient, try again next time
                    log.warning("lane poll of namespace %s failed: %s", board.namespace, exc)

    async def _poll(self, board: Board) -> None:
        prefixes, ids = board.scope()
        known = dict(board.latest)  # before the read: what is missing from it was deleted
        self.polls += 1
        heads = await self.store.namespace_heads(board.namespace, prefixes, ids)
        if self._boards.get(board.namespace) is not board:
            return

        def in_scope(lane_id: str) -> bool:
            return (
                prefixes is None
                or lane_id in ids
                or any(lane_id.startswith(prefix) for prefix in prefixes)
            )

        moved = []
        for lane_id, (incarnation, revision) in heads.items():
            change = known.get(lane_id)
            head = (incarnation, revision)
            news = change is None or head != (change.incarnation, change.revision)
            if news and board.latest.get(lane_id) is change:  # nothing newer during the read
                moved.append(lane_id)
        for lane_id, change in known.items():
            gone = lane_id not in heads and not change.deleted and in_scope(lane_id)
            if gone and board.latest.get(lane_id) is change:
                board.publish(LaneChange(lane_id, change.incarnation, 0, None))
        if moved:
            board.want(moved)
