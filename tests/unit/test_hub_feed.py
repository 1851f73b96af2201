"""A lane's feed of recent groups: what it serves, what it refuses, what it keeps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lane.server.hub import feed
from lane.server.hub.feed import Feed
from lane.server.store import EventGroup

T = datetime(2026, 1, 1, tzinfo=UTC)


def group(first: int, size: int = 1, body: bytes = b"e") -> EventGroup:
    return EventGroup(first, [body] * size, T)


def firsts(groups: list[feed.SharedGroup] | None) -> list[int] | None:
    return None if groups is None else [g.first for g in groups]


def test_an_unpositioned_feed_serves_nobody() -> None:
    f = Feed()
    assert (f.start, f.end) == (None, None)
    assert f.after(0) is None
    f.position(5)
    f.position(9)  # only the first position counts
    assert (f.start, f.end) == (5, 5)
    assert f.after(5) == []
    assert f.after(4) is None  # behind: read the log
    assert f.after(6) is None  # ahead of what the feed knows


def test_groups_after_a_boundary_inside_the_feed() -> None:
    f = Feed()
    f.position(10)
    assert f.add([group(11, 2), group(13), group(14, 3)])
    assert (f.start, f.end) == (10, 16)
    assert firsts(f.after(10)) == [11, 13, 14]
    assert firsts(f.after(12)) == [13, 14]
    assert firsts(f.after(13)) == [14]
    assert f.after(16) == []
    assert f.after(11) is None  # inside the first group: only the log can cut it there
    assert f.after(9) is None


def test_groups_it_has_are_skipped_and_a_gap_starts_it_over() -> None:
    f = Feed()
    f.position(0)
    assert f.add([group(1), group(2, 2)])
    assert not f.add([group(1), group(2, 2)])  # read again: nothing new
    assert f.add([group(2, 2), group(4)])
    assert firsts(f.after(0)) == [1, 2, 4]
    # Retention removed 5..7: the feed starts over after the gap.
    assert f.add([group(8)])
    assert (f.start, f.end) == (7, 8)
    assert f.after(4) is None
    assert firsts(f.after(7)) == [8]


def test_it_keeps_the_newest_groups_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feed, "FEED_MAX_GROUPS", 3)
    monkeypatch.setattr(feed, "FEED_MAX_BYTES", 10)
    f = Feed()
    f.position(0)
    f.add([group(n) for n in range(1, 6)])
    assert firsts(f.after(2)) == [3, 4, 5]
    assert f.after(1) is None
    f.add([group(6, body=b"x" * 8)])  # 8 bytes: with the newest two, over 10
    assert firsts(f.after(4)) == [5, 6]
    f.add([group(7, body=b"y" * 50)])  # larger than the bound: kept alone, as the newest
    assert (f.start, f.end) == (6, 7)
    assert firsts(f.after(6)) == [7]


def test_a_group_is_framed_once_for_every_watcher() -> None:
    f = Feed()
    f.position(0)
    f.add([EventGroup(1, [b"a", b"b"], T)])
    framed: list[list[bytes]] = []

    def framer(bodies: object) -> bytes:
        framed.append(list(bodies))  # type: ignore[call-overload]
        return b"frame"

    (shared,) = f.after(0) or []
    assert (shared.first, shared.last, shared.size) == (1, 2, 2)
    assert shared.committed_at == T.timestamp()
    assert shared.frame(framer) == shared.frame(framer) == b"frame"
    assert framed == [[b"a", b"b"]]


def test_the_feeds_of_a_process_stay_within_their_memory_together() -> None:
    memory = feed.FeedMemory(limit=10)
    quiet, busy, newest = Feed(memory), Feed(memory), Feed(memory)
    for f in (quiet, busy, newest):
        f.position(0)
    assert quiet.add([group(1, body=b"q" * 4)])
    assert busy.add([group(1, body=b"b" * 4)])
    assert memory.bytes == 8
    assert busy.add([group(2, body=b"b" * 2)])  # busy is now the most recently appended to
    assert memory.bytes == 10
    # Over the limit: the feed that went longest without a commit (quiet) is emptied first,
    # staying positioned: a watcher at its end waits, one behind reads the log.
    assert newest.add([group(1, body=b"n" * 3)])
    assert memory.bytes == 9
    assert quiet.after(1) == [] and quiet.after(0) is None
    assert firsts(busy.after(0)) == [1, 2]
    # A single group over the limit is still kept by its own feed, the others emptied.
    assert newest.add([group(2, body=b"n" * 20)])
    assert firsts(newest.after(1)) == [2]
    assert busy.after(0) is None and busy.after(2) == []
    assert memory.bytes == 23
    # A feed that goes (its lane's last watcher left) gives its bytes back.
    memory.forget(newest)
    assert memory.bytes == 0
