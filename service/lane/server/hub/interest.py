"""Which lanes other processes watch: so doorbells go only where a watcher waits for them.

Every hub tells the others which lanes its watchers follow, on the doorbell channel itself:

- a lane's first local watcher is announced at once (payload ``+ns/lane``, several lanes per
  payload on separate lines), and every watched lane again every :data:`REFRESH_SECONDS`;
- a hub that starts listening says hello (an empty payload), and every hub that hears it
  announces all its lanes at once, so a new process learns what the others watch;
- an announcement holds for :data:`TTL_SECONDS`, then lapses unless refreshed;
- a namespace whose lanes a WatchLanes stream follows is announced whole: the line ``ns/``
  (no lane id is empty), and every lane of it counts as watched.

A hub sends a doorbell for a commit only when some other process announced the lane. A lane
announced a moment after a commit there misses that doorbell; the announcing hub rings its own
watchers again shortly after announcing (and polling covers anything else), so the only cost of
the race is latency. Namespace names never contain ``+`` or ``/`` and never start with ``-``
(a deletion notice's prefix), so the payloads cannot be mistaken for one another.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable
from typing import TypeVar

from lane.server.store import LaneRef

K = TypeVar("K", bound=Hashable)

#: How often a hub announces every lane it watches.
REFRESH_SECONDS = 30.0
#: How long an announcement holds: a refresh may be late or lost once.
TTL_SECONDS = 3 * REFRESH_SECONDS
#: The largest NOTIFY payload sent (PostgreSQL's limit is 8,000 bytes).
MAX_PAYLOAD_BYTES = 7_000
ANNOUNCE = "+"
#: The prefix of a deletion notice (``-ns/lane``, a newline, the incarnation deleted): the
#: lane was deleted; the watchers of that incarnation end.
DELETED = "-"


def doorbell(lane: LaneRef) -> str:
    """The payload ringing ``lane``."""
    return f"{lane.namespace}/{lane.lane_id}"


def deletion(lane: LaneRef, incarnation: int) -> str:
    """The payload saying ``lane``'s ``incarnation`` was deleted."""
    return f"{DELETED}{doorbell(lane)}\n{incarnation}"


def deleted_lane(payload: str) -> tuple[LaneRef, int | None]:
    """The lane and incarnation a deletion notice names (None: a notice without one, from a
    process of an earlier version). Lane ids are printable: a newline ends one."""
    body, newline, incarnation = payload[len(DELETED) :].rpartition("\n")
    if newline and incarnation.isdigit():
        return rung_lane(body), int(incarnation)
    return rung_lane(payload[len(DELETED) :]), None


def whole(namespace: str) -> LaneRef:
    """What announces every lane of ``namespace`` (announced like a lane: ``ns/``)."""
    return LaneRef(namespace, "")


def rung_lane(payload: str) -> LaneRef:
    """The lane a doorbell payload rings."""
    namespace, _, lane_id = payload.partition("/")
    return LaneRef(namespace, lane_id)


def announcements(lanes: Iterable[LaneRef]) -> list[str]:
    """Payloads announcing ``lanes``, each within :data:`MAX_PAYLOAD_BYTES`."""
    payloads: list[str] = []
    lines: list[str] = []
    size = 0
    for lane in lanes:
        line = doorbell(lane)
        line_bytes = len(line.encode()) + 1
        if lines and size + line_bytes > MAX_PAYLOAD_BYTES:
            payloads.append(ANNOUNCE + "\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += line_bytes
    if lines:
        payloads.append(ANNOUNCE + "\n".join(lines))
    return payloads


class RemoteInterest:
    """The lanes, and whole namespaces, other processes announced, until their announcements
    lapse."""

    def __init__(self) -> None:
        self._until: dict[LaneRef, float] = {}
        self._namespaces: dict[str, float] = {}

    def heard(self, payload: str) -> None:
        """Record an announcement payload (``+ns/lane`` lines; ``ns/``: the whole namespace)."""
        until = time.monotonic() + TTL_SECONDS
        for line in payload[len(ANNOUNCE) :].split("\n"):
            if line:
                lane = rung_lane(line)
                if lane.lane_id:
                    self._until[lane] = until
                else:
                    self._namespaces[lane.namespace] = until

    def watched(self, lane: LaneRef) -> bool:
        """Whether another process watches ``lane`` (or follows its whole namespace)."""
        return _holds(self._until, lane) or (
            bool(self._namespaces) and _holds(self._namespaces, lane.namespace)
        )


def _holds(announced: dict[K, float], key: K) -> bool:
    """Whether ``key``'s announcement holds (a lapsed one is forgotten)."""
    until = announced.get(key)
    if until is None:
        return False
    if until < time.monotonic():
        del announced[key]
        return False
    return True
