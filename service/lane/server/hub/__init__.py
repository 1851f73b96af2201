"""Fan-out: each watched lane's recent groups shared by its watchers (handed over by local
commits, read once per lane after NOTIFY or polling)."""

from lane.server.hub.feed import FEED_MAX_BYTES, FEED_MAX_GROUPS, SharedGroup
from lane.server.hub.hub import Hub, Subscription

__all__ = ["FEED_MAX_BYTES", "FEED_MAX_GROUPS", "Hub", "SharedGroup", "Subscription"]
