"""What a driver hands the domain beside messages: a run's settings, a tool call's outcome and
its replay policy, and streamed partials, in the domain's own types.

The commands build these from the requests (``service/lane/server/commands/inputs.py``), so the
domain never reads the service's request messages. Enum values are the contract's numbers
(lane.v1's DeliveryMode, ToolExecution, ReplayPolicy, SyntheticCause; a unit test keeps them
equal), so a value passes between the two unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from lane.v1 import messages_pb2


class Delivery(IntEnum):
    """How queued steering or follow-up messages are delivered (lane.v1.DeliveryMode)."""

    UNSPECIFIED = 0
    ALL = 1
    ONE_AT_A_TIME = 2


class ToolExecution(IntEnum):
    """How a batch's calls run (lane.v1.ToolExecution)."""

    UNSPECIFIED = 0
    PARALLEL = 1
    SEQUENTIAL = 2


class Replay(IntEnum):
    """Whether a call may run again after a takeover (lane.v1.ReplayPolicy)."""

    UNSPECIFIED = 0
    NEVER = 1
    SAFE = 2


class Cause(IntEnum):
    """Why the service, not the tool, settled a call (lane.v1.SyntheticCause)."""

    UNSPECIFIED = 0
    UNKNOWN_TOOL = 1
    INVALID_ARGUMENTS = 2
    DENIED = 3
    TRUNCATED = 4
    CANCELLED = 5
    INTERRUPTED = 6


@dataclass(frozen=True, slots=True)
class RunSettings:
    """A run's settings, as StartRun gave them (unspecified values stay unspecified)."""

    tool_execution: int = ToolExecution.UNSPECIFIED
    steering_mode: int = Delivery.UNSPECIFIED
    follow_up_mode: int = Delivery.UNSPECIFIED


@dataclass(frozen=True, slots=True)
class Executed:
    """A call's result as its tool produced it."""

    result: messages_pb2.ToolResult
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Synthetic:
    """A call settled by the service (``message``: the validation message or the denial
    reason; ``terminate``: a denial that ends the run)."""

    cause: int = Cause.UNSPECIFIED
    message: str = ""
    terminate: bool = False


#: A call's final outcome: its executed result, or the service's synthetic one.
Outcome = Executed | Synthetic


@dataclass(frozen=True, slots=True)
class Partial:
    """One partial of a streaming assistant response (the complete message so far) and the
    provider's stream event, as JSON text, if any."""

    message: messages_pb2.AssistantMessage
    stream_event_json: str | None = None
