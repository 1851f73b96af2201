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
* :class:`Hooks` with :class:`ReplaceArguments`, :class:`Deny` and :class:`AfterToolPatch`
  (what hooks return), :class:`RunSettings` and its ``TOOL_EXECUTION_*`` and
  ``DELIVERY_MODE_*`` values: a driver's tool hooks and run settings.
* :class:`LaneError` and its subclasses, one per reason a caller acts on, derived from
  :data:`Reason`, the contract's enum of refusal reasons (shared with the TypeScript client);
  :class:`Unreachable` when the service cannot be reached (the target, the cause, the fix).

The submodules (``lane.client.session``, ``lane.client.reducer``, ...) are the building blocks
underneath; the generated contract is ``lane.v1``.

The names are imported when first used, so the ``lane`` command's own modules load without
gRPC (``lane --help`` is quick, and the command sets gRPC's log level before gRPC starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from lane.client.hooks import AfterToolPatch, Deny, Hooks, ReplaceArguments
    from lane.client.lane_client import LaneClient
    from lane.client.lane_list import LanesView, watch_lanes
    from lane.client.model import (
        Model,
        ModelError,
        ModelRequest,
        PartialSink,
        ScriptedCall,
        ScriptedModel,
        ScriptStep,
    )
    from lane.client.reach import Unreachable
    from lane.client.retry import RetryPolicy
    from lane.client.tools import Tool, ToolContext, ToolResult
    from lane.client.watch import LaneView, watch_lane
    from lane.v1.lane_service_pb2 import (
        DELIVERY_MODE_ALL,
        DELIVERY_MODE_ONE_AT_A_TIME,
        TOOL_EXECUTION_PARALLEL,
        TOOL_EXECUTION_SEQUENTIAL,
        RunSettings,
    )
    from lane.v1.reasons_pb2 import Reason

#: Each public name → the module it comes from.
_SOURCES: dict[str, str] = {
    "AfterToolPatch": "lane.client.hooks",
    "DELIVERY_MODE_ALL": "lane.v1.lane_service_pb2",
    "DELIVERY_MODE_ONE_AT_A_TIME": "lane.v1.lane_service_pb2",
    "Deny": "lane.client.hooks",
    "Driver": "lane.client.driver",
    "Hooks": "lane.client.hooks",
    "LaneBusy": "lane.client.errors",
    "LaneClient": "lane.client.lane_client",
    "LaneError": "lane.client.errors",
    "LaneNotFound": "lane.client.errors",
    "LaneView": "lane.client.watch",
    "LanesView": "lane.client.lane_list",
    "LeaseHeld": "lane.client.errors",
    "Model": "lane.client.model",
    "ModelError": "lane.client.model",
    "ModelRequest": "lane.client.model",
    "NotReplayable": "lane.client.errors",
    "OperationCancelled": "lane.client.errors",
    "OperationNotOpen": "lane.client.errors",
    "PartialSink": "lane.client.model",
    "Reason": "lane.v1.reasons_pb2",
    "ReplaceArguments": "lane.client.hooks",
    "RequestIdReused": "lane.client.errors",
    "RetryPolicy": "lane.client.retry",
    "RevisionOutOfRange": "lane.client.errors",
    "RunResult": "lane.client.driver",
    "RunSettings": "lane.v1.lane_service_pb2",
    "ScriptStep": "lane.client.model",
    "ScriptedCall": "lane.client.model",
    "ScriptedModel": "lane.client.model",
    "StaleLease": "lane.client.errors",
    "TOOL_EXECUTION_PARALLEL": "lane.v1.lane_service_pb2",
    "TOOL_EXECUTION_SEQUENTIAL": "lane.v1.lane_service_pb2",
    "TooLarge": "lane.client.errors",
    "TooManyWatchers": "lane.client.errors",
    "Tool": "lane.client.tools",
    "ToolContext": "lane.client.tools",
    "ToolResult": "lane.client.tools",
    "Unauthenticated": "lane.client.errors",
    "Unreachable": "lane.client.reach",
    "WatchProtocolError": "lane.client.errors",
    "open_channel": "lane.client.connect",
    "watch_lane": "lane.client.watch",
    "watch_lanes": "lane.client.lane_list",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DELIVERY_MODE_ALL",
    "DELIVERY_MODE_ONE_AT_A_TIME",
    "TOOL_EXECUTION_PARALLEL",
    "TOOL_EXECUTION_SEQUENTIAL",
    "AfterToolPatch",
    "Deny",
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
    "ReplaceArguments",
    "RequestIdReused",
    "RetryPolicy",
    "RevisionOutOfRange",
    "RunResult",
    "RunSettings",
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
    "Unreachable",
    "WatchProtocolError",
    "open_channel",
    "watch_lane",
    "watch_lanes",
]
