"""Fan-out: wake a process's watchers when their lanes commit (local, NOTIFY, or polling)."""

from service.hub.hub import Hub, Subscription

__all__ = ["Hub", "Subscription"]
