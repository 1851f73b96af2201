"""Unary answers within one message: a unary RPC's answer over the message limit is refused.

A unary call carries one answer message, and the service sends none over the limit (4 MiB, what
a client with default settings receives). DriveLane sends an answer of any size in parts
(message_parts.py), so a large snapshot or run state is read there; the unary RPC refuses it
with RESOURCE_EXHAUSTED and says so (a command refused so has run: sent again with its request
id on DriveLane, its recorded answer comes back).
"""

from __future__ import annotations

from lane.limits import MAX_MESSAGE_BYTES

from lane.server.domain.errors import ResourceExhausted


def check_snapshot_message(lane_id: str, size: int, limit: int = MAX_MESSAGE_BYTES) -> None:
    """Refuse (RESOURCE_EXHAUSTED ``SNAPSHOT_TOO_LARGE``) a unary GetLaneSnapshot answer of
    ``size`` bytes over ``limit``: WatchLane and DriveLane send it in parts."""
    if size > limit:
        raise ResourceExhausted(
            "SNAPSHOT_TOO_LARGE",
            f"lane {lane_id}'s snapshot is {size} bytes, more than one message carries "
            f"({limit}); read it with WatchLane or over DriveLane, which send it in parts",
            laneId=lane_id,
            bytes=size,
            limit=limit,
        )


def answer_too_large(method: str, size: int, limit: int = MAX_MESSAGE_BYTES) -> ResourceExhausted:
    """The refusal (RESOURCE_EXHAUSTED ``ANSWER_TOO_LARGE``) of a unary ``method`` whose answer
    is ``size`` bytes, over ``limit``."""
    return ResourceExhausted(
        "ANSWER_TOO_LARGE",
        f"the answer to {method} is {size} bytes, more than one message carries ({limit}); "
        f"send {method} over DriveLane, which sends answers of any size in parts (a command "
        "has run: send it again with the same request_id to read its answer)",
        method=method,
        bytes=size,
        limit=limit,
    )
