"""The Python client of the lane service.

Everything a caller needs is importable from here::

    from lane.client import Driver, LaneClient, Tool, ToolContext, ToolResult, watch_lane

* :class:`LaneClient`: the service's commands as typed async methods (request ids, lease
  tokens, retries and deadlines handled).
* :class:`Driver`: runs an agent on a lane with a :data:`Model` and :class:`Tool` s,
  committing every step (a streaming model's answer as it grows); :class:`RunResult` is how a
  run ended; a model raises :class:`ModelError` to say whether a failure is worth retrying.
  Real models are in :mod:`lane.client.models` (optional extras ``openai``, ``anthropic``).
* :func:`watch_lane`: follows a lane live as :class:`LaneView` s, resuming after failures.
* :func:`watch_lanes`: follows many lanes' summaries live (a lane list) as
  :class:`LanesView` s, listing again after failures.
* :class:`RetryPolicy`: how everything that retries retries.
* :class:`LaneError` and its subclasses, one per reason a caller acts on, derived from
  :data:`Reason`, the contract's enum of refusal reasons (shared with the TypeScript client).

The submodules (``lane.client.session``, ``lane.client.reducer``, ...) are the building blocks
underneath; the generated contract is ``lane.v1``.
"""

from lane.client.connect import open_channel
from lane.client.driver import Driver, RunResult
from lane.client.errors import (
    LaneBusy,
    LaneError,
    LaneNotFound,
    LeaseHeld,
    NotReplayable,
    OperationCancelled,
    OperationNotOpen,
    RequestIdReused,
    RevisionOutOfRange,
    StaleLease,
    TooLarge,
    TooManyWatchers,
    Unauthenticated,
    WatchProtocolError,
)
from lane.client.hooks import Hooks
from lane.client.lane_client import LaneClient
from lane.client.model import (
    Model,
    ModelError,
    ModelRequest,
    PartialSink,
    ScriptedCall,
    ScriptedModel,
    ScriptStep,
)
from lane.client.retry import RetryPolicy
from lane.client.tools import Tool, ToolContext, ToolResult
from lane.client.watch import LaneView, watch_lane
from lane.client.watch_lanes import LanesView, watch_lanes
from lane.v1.reasons_pb2 import Reason

__all__ = [
    "Driver",
    "Hooks",
    "LaneBusy",
    "LaneClient",
    "LaneError",
    "LaneNotFound",
    "LaneView",
    "LanesView",
    "LeaseHeld",
    "Model",
    "ModelError",
    "ModelRequest",
    "NotReplayable",
    "OperationCancelled",
    "OperationNotOpen",
    "PartialSink",
    "Reason",
    "RequestIdReused",
    "RetryPolicy",
    "RevisionOutOfRange",
    "RunResult",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedModel",
    "StaleLease",
    "TooLarge",
    "TooManyWatchers",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Unauthenticated",
    "WatchProtocolError",
    "open_channel",
    "watch_lane",
    "watch_lanes",
]
