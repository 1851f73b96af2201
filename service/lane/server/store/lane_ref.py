"""A lane's identity in storage: the namespace it belongs to and its id within it."""

from __future__ import annotations

from typing import NamedTuple

#: The namespace of every caller when the service runs without auth.
DEFAULT_NAMESPACE = "default"

#: The prefix of the few statements that span lanes: maintenance scans (retention, pruning,
#: the reconciler's search, the hub's poll) and ListLanes. Every other statement names one
#: lane by its key (namespace, lane id), and a transaction never touches two lanes, so the
#: tables can be distributed by that key (docs/deploying.md); tests hold every statement to it.
LANE_SCAN = "/* lane scan */ "


class LaneRef(NamedTuple):
    """Names one lane. Lane ids are unique within a namespace only, so every query about a
    lane names both; a lane of another namespace is, to the store, a lane that does not exist."""

    namespace: str
    lane_id: str

    @property
    def params(self) -> dict[str, str]:
        """The ``%(ns)s`` / ``%(lane)s`` query parameters naming this lane."""
        return {"ns": self.namespace, "lane": self.lane_id}
