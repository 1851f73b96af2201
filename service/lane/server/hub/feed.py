"""A lane's feed: its most recent event groups, shared by all of its watchers in this process.

The feed holds a contiguous run of whole groups, revisions ``start + 1`` through ``end``, the
bytes each as the store wrote them. Groups come in two ways:

- a commit made in this process hands its group over from memory (no read at all);
- a commit made elsewhere (a NOTIFY, or the poll seeing the head move) is read from the event
  log once for the lane — one read for every watcher of the lane here.

A watcher whose last revision is a group boundary in ``[start, end]`` takes the groups after it
from the feed; one that is behind ``start`` (slow, or just resumed), or inside a group, reads
the log itself, as every watcher used to, then takes from the feed again once it has caught up.
The feed keeps at most :data:`FEED_MAX_GROUPS` groups and :data:`FEED_MAX_BYTES` bytes of
events (always the newest group, whatever its size); older ones are dropped from its start.
All the feeds of a process together keep at most :data:`FEEDS_MAX_BYTES` (:class:`FeedMemory`):
past it, the feeds that went longest without a commit are emptied — their watchers, if behind,
read the log instead.

A feed is *positioned* once it knows a revision the log is read after: by the first commit
handed over, or by the first watcher that reached the head (a snapshot, or a short read of the
log). Until then every watcher reads the log itself.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence

from lane.server.store import EventGroup

#: Groups a feed keeps at most: enough for watchers a few commits behind (those writing while
#: their lane commits fast) to be served from it ...
FEED_MAX_GROUPS = 32
#: ... and bytes of encoded events at most (the newest group is kept even when larger). A
#: process holds at most this (plus one group of up to 4 MiB) per lane it has watchers of.
FEED_MAX_BYTES = 256 * 1024

#: Bytes of events all the feeds of a process hold together at most (a process with watchers
#: on many busy lanes would otherwise hold 256 KiB and up to a 4 MiB group for each).
FEEDS_MAX_BYTES = 64 * 1024 * 1024

#: Frames encoded events as one stream message (``lane.server.api.framing.event_group_frame``).
Framer = Callable[[Sequence[bytes]], bytes]


class SharedGroup:
    """One event group in a feed, framed once for all the watchers that send it."""

    __slots__ = ("_bodies", "_frame", "committed_at", "first", "last", "size")
    #: Where the watcher got it (the ``lane.watch.delivery`` span's ``lane.source``).
    source = "feed"

    def __init__(self, group: EventGroup) -> None:
        self.first = group.first_revision
        self.last = group.last_revision
        #: The commit time, in seconds since the epoch.
        self.committed_at = group.commit_time.timestamp()
        self.size = sum(len(body) for body in group.bodies)
        self._bodies: Sequence[bytes] = group.bodies
        self._frame: bytes | None = None

    def frame(self, framer: Framer) -> bytes:
        """The group as one stream message: framed by the first watcher to send it (always
        with the same ``framer``), the same bytes for every later one."""
        if self._frame is None:
            self._frame = framer(self._bodies)
            self._bodies = ()  # the frame holds them now
        return self._frame


class FeedMemory:
    """The bytes all the feeds of a process hold, kept under ``limit`` by emptying the feeds
    that were appended to least recently."""

    def __init__(self, limit: int = FEEDS_MAX_BYTES) -> None:
        self.limit = limit
        self.bytes = 0
        #: Feeds holding bytes, least recently appended to first.
        self._feeds: OrderedDict[Feed, None] = OrderedDict()

    def changed(self, feed: Feed, delta: int) -> None:
        """``feed`` now holds ``delta`` more bytes (it was just appended to when > 0)."""
        self.bytes += delta
        if delta > 0:
            self._feeds[feed] = None
            self._feeds.move_to_end(feed)
        while self.bytes > self.limit and self._feeds:
            oldest = next(iter(self._feeds))
            if oldest is feed:
                break  # the feed just appended to keeps its newest group, as always
            del self._feeds[oldest]
            self.bytes -= oldest.empty()

    def forget(self, feed: Feed) -> None:
        """``feed`` is gone (its lane has no watchers here any more)."""
        self._feeds.pop(feed, None)
        self.bytes -= feed.empty()


class Feed:
    """A lane's recent groups (see the module docstring)."""

    def __init__(self, memory: FeedMemory | None = None) -> None:
        self._groups: deque[SharedGroup] = deque()
        self._bytes = 0
        self._memory = memory
        #: The revision through which the feed is contiguous (None: not positioned yet).
        self.end: int | None = None

    @property
    def start(self) -> int | None:
        """The revision the feed's first group follows (None: not positioned yet)."""
        return self._groups[0].first - 1 if self._groups else self.end

    def position(self, revision: int) -> None:
        """Start an empty feed after ``revision`` (only if it is not positioned yet)."""
        if self.end is None:
            self.end = revision

    def after(self, revision: int) -> list[SharedGroup] | None:
        """The groups after ``revision`` ([] when it is the end), or None when the feed cannot
        serve it: not positioned, ahead of it, behind its start, or inside a group."""
        end = self.end
        if end is None or revision > end:
            return None
        if revision == end:
            return []
        groups = self._groups
        # Newest first: a watcher served from the feed is usually a group or two behind.
        for index in range(len(groups) - 1, -1, -1):
            first = groups[index].first
            if first == revision + 1:
                return list(itertools.islice(groups, index, None))
            if first <= revision:
                return None  # inside a group: only the log can cut it there
        return None  # behind the start

    def add(self, groups: Iterable[EventGroup]) -> bool:
        """Append the groups that continue the feed (those it has already are skipped; a gap,
        where retention removed events, starts the feed over after it); True if any was
        appended. The feed must be positioned."""
        appended = False
        held = self._bytes
        for group in groups:
            assert self.end is not None
            if group.last_revision <= self.end:
                continue  # handed over or read already
            if group.first_revision != self.end + 1:
                self._groups.clear()
                self._bytes = 0
                self.end = group.first_revision - 1
            shared = SharedGroup(group)
            self._groups.append(shared)
            self._bytes += shared.size
            self.end = shared.last
            appended = True
        while len(self._groups) > 1 and (
            len(self._groups) > FEED_MAX_GROUPS or self._bytes > FEED_MAX_BYTES
        ):
            self._bytes -= self._groups.popleft().size
        if self._memory is not None and self._bytes != held:
            self._memory.changed(self, self._bytes - held)
        return appended

    def empty(self) -> int:
        """Drop every group, staying positioned at the end; return the bytes freed."""
        freed, self._bytes = self._bytes, 0
        self._groups.clear()
        return freed
