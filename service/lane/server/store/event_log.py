"""Event groups: one commit's events as the store wrote them to the event log.

A commit appends its events at consecutive revisions as one group, encoded once (for the
events INSERT, ``lane_writes``). The same bytes reach watchers twice over: read back from the
log (:meth:`~lane.server.store.Store.read_events`), or handed over at commit, from memory, to the
store's commit listeners (the hub), so that a commit made in this process needs no read.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple


class EventGroup(NamedTuple):
    """One commit's events as stored (from a read after a revision inside a group: its rest)."""

    first_revision: int
    #: Encoded HarnessEvent bodies, in revision order.
    bodies: list[bytes]
    #: When the group was committed (its events' ``commit_time``).
    commit_time: datetime

    @property
    def last_revision(self) -> int:
        """The revision of the group's last event."""
        return self.first_revision + len(self.bodies) - 1


def read_was_full(groups: Sequence[EventGroup], limit: int, max_bytes: int) -> bool:
    """Whether a :meth:`~lane.server.store.Store.read_events` that returned ``groups`` reached one
    of its bounds: then more may be waiting after it."""
    events = sum(len(group.bodies) for group in groups)
    size = sum(len(body) for group in groups for body in group.bodies)
    return events >= limit or size >= max_bytes
