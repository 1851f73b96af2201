"""Event groups: one commit's events as the store wrote them to the event log.

A commit appends its events at consecutive revisions as one group, encoded once (for the
events INSERT, ``lane_writes``). The same bytes reach watchers twice over: read back from the
log (:meth:`~service.store.Store.read_events`), or handed over at commit, from memory, to the
store's commit listeners (the hub), so that a commit made in this process needs no read.
"""

from __future__ import annotations

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
