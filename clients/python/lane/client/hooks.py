"""Hooks around each tool call (docs/contract.md, Tool calls).

``before_tool`` runs for a fresh call after its arguments were validated, before its intent is
committed. It returns None (go ahead), :class:`ReplaceArguments` (run with these arguments
instead; they are validated against the tool's schema again, and invalid ones give the call an
INVALID_ARGUMENTS result) or :class:`Deny` (the call gets a DENIED result with the reason; with
``terminate`` the run stops after the batch, if every call of the batch asks so). A hook that
raises denies the call (it fails closed). Several hooks form a pipeline: each sees the
arguments the previous one chose; the first deny wins.

``after_tool`` runs after a real execution (fresh or safely replayed), never for a synthetic
result, and not once an abort of the run has begun. It returns None or an
:class:`AfterToolPatch` that replaces any of content, details, is_error, usage and terminate.
Several hooks apply in order, each seeing the result patched so far. A hook that raises turns
the call's result into an error result naming the failure.

Hooks may be plain functions or coroutines::

    async def no_rm(event: BeforeToolEvent) -> BeforeToolDecision:
        if event.tool_name == "shell" and "rm " in event.args.get("command", ""):
            return Deny("rm is not allowed here")
        return None

    Driver(stub, lane, tools, hooks=Hooks(before_tool=[no_rm]))
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lane.v1 import messages_pb2

__all__ = [
    "KEEP",
    "AfterToolEvent",
    "AfterToolHook",
    "AfterToolPatch",
    "BeforeToolDecision",
    "BeforeToolEvent",
    "BeforeToolHook",
    "Deny",
    "Hooks",
    "Keep",
    "ReplaceArguments",
]


class Keep(enum.Enum):
    """Marks a patch field that leaves the result's value as it is."""

    KEEP = "keep"


#: The default of every :class:`AfterToolPatch` field: no change.
KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class BeforeToolEvent:
    """A fresh call about to start, with its validated arguments."""

    lane_id: str
    operation_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReplaceArguments:
    """Run the call with these arguments instead (revalidated against the tool's schema)."""

    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Deny:
    """Do not run the call: it gets an error result whose text is ``reason``."""

    reason: str
    terminate: bool = False


BeforeToolDecision = ReplaceArguments | Deny | None
BeforeToolHook = Callable[[BeforeToolEvent], BeforeToolDecision | Awaitable[BeforeToolDecision]]


@dataclass(frozen=True, slots=True)
class AfterToolEvent:
    """A call's result after its execution, before it is staged."""

    lane_id: str
    operation_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    content: tuple[messages_pb2.ContentBlock, ...]
    #: The details as a JSON value; None when absent.
    details: Any
    is_error: bool
    usage: messages_pb2.Usage | None
    terminate: bool
    #: The execution was a safe replay after a takeover.
    replayed: bool


@dataclass(frozen=True, slots=True)
class AfterToolPatch:
    """Field-by-field replacement of a result; :data:`KEEP` leaves a field alone.

    ``details=None`` and ``usage=None`` remove them; ``content`` may be a string (one text
    block) or a sequence of strings and content blocks.
    """

    content: str | Sequence[str | messages_pb2.ContentBlock] | Keep = KEEP
    details: Any = KEEP
    is_error: bool | Keep = KEEP
    usage: messages_pb2.Usage | Keep | None = KEEP
    terminate: bool | Keep = KEEP


AfterToolHook = Callable[[AfterToolEvent], AfterToolPatch | Awaitable[AfterToolPatch | None] | None]


@dataclass(frozen=True)
class Hooks:
    """The hook pipelines of a driver."""

    before_tool: Sequence[BeforeToolHook] = ()
    after_tool: Sequence[AfterToolHook] = ()
