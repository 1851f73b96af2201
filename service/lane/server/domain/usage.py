"""Usage arithmetic."""

from __future__ import annotations

from lane.v1 import messages_pb2

from lane.server.domain.errors import InvalidArgument

_INT64_MAX = 2**63 - 1

_COUNTS = ("input", "output", "cache_read", "cache_write", "total_tokens")
_COSTS = ("input", "output", "cache_read", "cache_write", "total")


def add_usage(total: messages_pb2.Usage, more: messages_pb2.Usage) -> messages_pb2.Usage:
    """Return ``total + more`` field by field (a new message)."""
    result = messages_pb2.Usage()
    for name in _COUNTS:
        value = getattr(total, name) + getattr(more, name)
        if not -_INT64_MAX <= value <= _INT64_MAX:
            raise InvalidArgument(
                "USAGE_OVERFLOW",
                f"usage {name} would overflow the lane's total",
                field=f"usage.{name}",
            )
        setattr(result, name, value)
    for name in _COSTS:
        setattr(result.cost, name, getattr(total.cost, name) + getattr(more.cost, name))
    return result
