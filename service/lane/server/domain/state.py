"""The durable state a command sees: a lane, its open operation, and that operation's tool batch.

These are plain immutable values. The store loads them under the lane row lock, a transition
function returns the next values, and the store writes the difference. Protobuf messages held
here are never mutated after construction; transitions build new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, TypeVar

from lane.v1 import events_pb2, messages_pb2, snapshot_pb2

from lane.server.domain.run_inputs import Replay, RunSettings

V = TypeVar("V")

#: Each value class's field names (what :func:`evolve` copies).
_FIELDS: dict[type, frozenset[str]] = {}


def evolve(value: V, **changes: Any) -> V:
    """``value`` with ``changes``: ``dataclasses.replace`` for these frozen values, at a
    fifth of its cost. A command's step makes a few such copies (the call, its batch, the
    operation, the lane), and ``replace`` runs the whole ``__init__`` of each, a frozen
    ``__setattr__`` per field. None of them checks anything in ``__init__`` (no
    ``__post_init__``), so the copy is the fields' dictionary with the changes; a cached
    property (:meth:`ToolBatch.call`'s index) is not carried over."""
    cls = type(value)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(field.name for field in fields(cls))  # type: ignore[arg-type]
    if not changes.keys() <= names:
        raise TypeError(f"{cls.__name__} has no field {', '.join(changes.keys() - names)}")
    values = value.__dict__.copy()
    if len(values) != len(names):
        values = {name: v for name, v in values.items() if name in names}
    values.update(changes)
    copied: V = object.__new__(cls)
    object.__setattr__(copied, "__dict__", values)
    return copied


class CallStatus(StrEnum):
    """A tool call's durable status (docs/contract.md, Tool calls)."""

    PLANNED = "planned"
    EFFECT_PENDING = "effect_pending"
    OUTCOME_READY = "outcome_ready"
    COMPLETED = "completed"


class Phase(StrEnum):
    """Where an open run stands."""

    IDLE = "idle"  # between turns: a turn may start, or the run may end
    TURN_OPEN = "turn_open"  # a turn started; its assistant message is not settled yet
    TOOLS = "tools"  # the turn's tool batch is not fully placed yet


class Continuation(StrEnum):
    """What an idle run needs next."""

    NEED_ASSISTANT = "need_assistant"
    MAY_FINISH = "may_finish"


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool batch, located durably by its source index."""

    source_index: int
    tool_call_id: str
    tool_name: str
    result_entry_id: str
    status: CallStatus = CallStatus.PLANNED
    replay: int = Replay.NEVER
    # Effective arguments, written by the intent commit.
    arguments_json: str | None = None
    # The latest tool_update, and the latest one marked checkpoint.
    progress: messages_pb2.ToolResult | None = None
    checkpoint: messages_pb2.ToolResult | None = None
    # The staged (outcome_ready) or placed (completed) result message.
    result_message: messages_pb2.ToolResultMessage | None = None
    terminate: bool = False


@dataclass(frozen=True)
class ToolBatch:
    """The tool calls of one settled assistant message."""

    turn_id: str
    assistant_entry_id: str
    assistant: messages_pb2.AssistantMessage
    calls: tuple[ToolCall, ...]

    @property
    def cut_for_length(self) -> bool:
        """Whether the assistant message stopped for length: its calls' arguments may be cut
        short, so every call gets the truncated outcome and none runs."""
        return self.assistant.stop_reason == messages_pb2.STOP_REASON_LENGTH

    def call(self, tool_call_id: str) -> ToolCall | None:
        """The call with this batch-local id, if any (a dictionary lookup: commands that look
        calls up in a loop stay linear in the batch)."""
        return self._by_id.get(tool_call_id)

    @cached_property
    def _by_id(self) -> dict[str, ToolCall]:
        # Built once per batch value (batches are immutable). Ids are unique within a batch
        # (validation refuses duplicates); should a corrupt one repeat, the first wins, as the
        # linear search this replaces did.
        index: dict[str, ToolCall] = {}
        for call in self.calls:
            index.setdefault(call.tool_call_id, call)
        return index


@dataclass(frozen=True)
class Operation:
    """A lane's open operation."""

    operation_id: str
    kind: snapshot_pb2.OperationKind.ValueType
    started_time: datetime
    from_tip_id: str
    settings: RunSettings
    cancel_requested: bool = False
    phase: Phase = Phase.IDLE
    continuation: Continuation = Continuation.NEED_ASSISTANT
    turn_id: str | None = None
    batch: ToolBatch | None = None
    #: The highest fencing token issued for this run (0: never leased).
    lease_token: int = 0
    #: The driver holding the lease, and until when; None once released (or never leased).
    lease_holder: str | None = None
    lease_expires: datetime | None = None
    #: A driver took the run over mid-batch: the batch's events are tagged recovery.
    recovering: bool = False
    #: The assistant response streaming in the open turn (the latest complete partial).
    streaming: messages_pb2.AssistantMessage | None = None
    #: The scheduled retry of the open turn's model call, and the attempt under way.
    retry: snapshot_pb2.RetryState | None = None
    attempt: int = 1
    #: The deferred response the run is suspended on.
    deferred: snapshot_pb2.DeferredState | None = None
    #: Why a compaction operation runs.
    reason: events_pb2.CompactionReason.ValueType = events_pb2.COMPACTION_REASON_UNSPECIFIED

    def lease_live(self, now: datetime) -> bool:
        """Whether a driver holds an unexpired lease."""
        return self.lease_holder is not None and (
            self.lease_expires is None or self.lease_expires > now
        )


@dataclass(frozen=True)
class LaneState:
    """A lane as one command sees it."""

    lane_id: str
    revision: int
    tip_id: str
    configuration: snapshot_pb2.LaneConfiguration
    message_count: int
    usage_totals: messages_pb2.Usage
    inbox: tuple[snapshot_pb2.QueuedItem, ...] = ()
    operation: Operation | None = None
    #: The lane's last ended operation; its result record is loaded only for capture.
    last_operation_id: str | None = None
    last_result: snapshot_pb2.OperationResult | None = None
    faulted: bool = False
    #: Which incarnation of the lane id this is: a number the store gives each lane it creates
    #: or imports, higher for a later one (0 until the lane's row exists).
    incarnation: int = 0
