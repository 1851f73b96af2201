"""The closed-form bounds of the commits the service may later *have* to make.

The commit rule (``service/lane/server/domain/limits.py``) refuses a commit after which the lane
would hold what it could not deliver: besides the commit's own event group, the largest commits the
service may later have to make with what the lane then holds must fit one message too. Those
are ending the run (every unfinished call of the batch settled and placed, turn and run ended,
in one group: :func:`run_end_bytes`) and starting a run that captures the whole inbox
(:func:`run_start_bytes`).

Those two future commits are never built to be measured: building them costs a commit's CPU
time per command (and, done naively, time quadratic in the batch). They are bounded in closed
form instead: each call or inbox item adds the encoded sizes of the events it will cause,
computed from its own payload sizes (their ``ByteSize``), the lengths of its ids and the fixed
envelope sizes, with every field's tag size taken from the generated descriptors
(``service/lane/server/domain/wire.py``). Whatever varies and is not known yet is counted at its
largest: revisions and sequence numbers as 9-byte varints, timestamps with 5-byte seconds and nanos,
new ids of 36 bytes, the capturing run's id of 128 bytes, every length prefix that may grow as 4
bytes, every optional flag set. So each is an upper bound of the real commit
(tests/unit/domain/test_domain_limits.py and test_domain_limit_bounds.py check it against real
encodings, the latter of randomized batches), and the cost is linear in the batch or inbox
with a small constant: a few ``ByteSize`` calls and additions per call or item.

A bound adds, per event, the event's field in the EventGroup around the HarnessEvent envelope
around the kind's body.
"""

from __future__ import annotations

import functools

from lane.v1 import entries_pb2, events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from lane.server.domain.integrity import corrupt
from lane.server.domain.results import synthetic_result
from lane.server.domain.state import CallStatus, LaneState, ToolBatch, ToolCall
from lane.server.domain.wire import (
    EVENTS_FIELD,
    MAX_INT64_VARINT_BYTES,
    MAX_LENGTH_VARINT_BYTES,
    MAX_TIMESTAMP_BYTES,
    delimited,
    event_field_bytes,
    event_group_bytes,
    max_fixed_message_bytes,
    number_tag_bytes,
    tag_bytes,
    tag_growth,
    varint_bytes,
)

# What the future commits hold that is not known yet, at its largest: the ids the service
# mints (UUIDs), a capturing run's caller-chosen id (ids are at most 128 bytes).
_NEW_ID_BYTES = 36
_SIM_OPERATION_ID = "o" * 128
_SIM_PROMPT = messages_pb2.AgentMessage(
    user=messages_pb2.UserMessage(
        content=[messages_pb2.ContentBlock(text=messages_pb2.TextContent(text="."))]
    )
)

# Tag sizes, all from the generated descriptors, and the largest revision, time and length.

_Event = events_pb2.HarnessEvent
_KIND = {
    item.name: tag_bytes(_Event, item.name)
    for item in _Event.DESCRIPTOR.oneofs_by_name["kind"].fields
}
_TS = MAX_TIMESTAMP_BYTES
_REVISION = MAX_INT64_VARINT_BYTES
_LENGTH = MAX_LENGTH_VARINT_BYTES
_BOOL = 1
#: A usage event's running totals: any Usage at its largest encoding.
_MAX_USAGE_BYTES = max_fixed_message_bytes(messages_pb2.Usage)

_TRM = messages_pb2.ToolResultMessage
_TR = messages_pb2.ToolResult
_AGENT_TOOL_RESULT = tag_bytes(messages_pb2.AgentMessage, "tool_result")
_RESULT_FIELDS = ("content", "details_json", "usage", "added_tool_names")
#: ToolResult ↔ ToolResultMessage carry the same fields under other numbers: per value copied,
#: a tag at most this much longer.
_TO_RESULT = tag_growth(_TRM, _TR, _RESULT_FIELDS)
_TO_MESSAGE = tag_growth(_TR, _TRM, _RESULT_FIELDS)
_ACTIVE_VALUE = max(
    tag_bytes(events_pb2.ActiveToolsChange, "value"),
    tag_bytes(events_pb2.ActiveToolsChange, "previous"),
)
_CONFIG_NAME_GROWTH = max(
    0, _ACTIVE_VALUE - tag_bytes(snapshot_pb2.LaneConfiguration, "active_tool_names")
)
_ADDED_NAME_GROWTH = max(0, _ACTIVE_VALUE - tag_bytes(_TRM, "added_tool_names"))
#: Added tool names measured one by one up to this many per result; past it, bounded by the
#: result message's size (so the work per call stays constant).
_NAMES_MEASURED = 16


def _synthetic_block(cause: int) -> int:
    outcome = lane_service_pb2.SyntheticOutcome(cause=cause)  # type: ignore[arg-type]
    return synthetic_result(outcome, "", None).content[-1].ByteSize()


_CANCELLED_BLOCK = _synthetic_block(lane_service_pb2.SYNTHETIC_CAUSE_CANCELLED)
_INTERRUPTED_BLOCK = _synthetic_block(lane_service_pb2.SYNTHETIC_CAUSE_INTERRUPTED)
_ABORTED = varint_bytes(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)


@functools.cache
def _t(message: type, name: str) -> int:
    return tag_bytes(message, name)


class _Events:
    """Adds up the events of one future commit of a lane: each as its field in the group."""

    def __init__(self, envelope: int) -> None:
        self.envelope = envelope  # a HarnessEvent without its kind: :func:`_envelope`
        self.size = 0

    def add(self, kind: str, body: int) -> None:
        self.size += event_field_bytes(self.envelope + delimited(_KIND[kind], body))

    def group(self) -> int:
        return event_group_bytes(self.size)


def _envelope(lane_id: str) -> int:
    """A HarnessEvent of this lane without its kind: revision, commit time and recovery flag
    at their largest."""
    return (
        delimited(_t(_Event, "lane_id"), len(lane_id.encode()))
        + _t(_Event, "revision")
        + _REVISION
        + delimited(_t(_Event, "commit_time"), _TS)
        + _t(_Event, "recovery")
        + _BOOL
    )


def _utf8(text: str) -> int:
    return len(text.encode())


def _entry(entry_id: int, parent_id: int, payload_tag: int, payload: int) -> int:
    """An Entry of these id lengths around a ``payload``-byte payload field (seq, timestamp
    and flags at their largest)."""
    E = entries_pb2.Entry
    return (
        delimited(_t(E, "id"), entry_id)
        + delimited(_t(E, "parent_id"), parent_id)
        + _t(E, "seq")
        + _REVISION
        + delimited(_t(E, "timestamp"), _TS)
        + delimited(payload_tag, payload)
    )


def _message_entry(agent_message: int) -> int:
    """A MessageEntry around an ``agent_message``-byte AgentMessage (terminate set)."""
    ME = entries_pb2.MessageEntry
    return delimited(_t(ME, "message"), agent_message) + _t(ME, "terminate") + _BOOL


def _placed_message(
    events: _Events, run_id: int, agent_message: int, entry_id: int, parent_id: int
) -> None:
    """message_start, message_end and entry_added of one placed message."""
    MS, MEnd = events_pb2.MessageStartEvent, events_pb2.MessageEndEvent
    events.add(
        "message_start",
        delimited(_t(MS, "run_id"), run_id) + delimited(_t(MS, "message"), agent_message),
    )
    events.add(
        "message_end",
        delimited(_t(MEnd, "run_id"), run_id)
        + delimited(_t(MEnd, "message"), agent_message)
        + delimited(_t(MEnd, "entry_id"), entry_id),
    )
    entry = _entry(
        entry_id, parent_id, _t(entries_pb2.Entry, "message"), _message_entry(agent_message)
    )
    events.add("entry_added", delimited(_t(events_pb2.EntryAddedEvent, "entry"), entry))


def _usage_event(events: _Events, usage: int, entry_id: int) -> None:
    Row, UE = events_pb2.UsageRow, events_pb2.UsageEvent
    row = (
        delimited(_t(Row, "id"), _NEW_ID_BYTES)
        + _t(Row, "seq")
        + _REVISION
        + delimited(_t(Row, "entry_id"), entry_id)
        + _t(Row, "adjustment")
        + _BOOL
        + delimited(_t(Row, "usage"), usage)
    )
    events.add(
        "usage", delimited(_t(UE, "row"), row) + delimited(_t(UE, "totals"), _MAX_USAGE_BYTES)
    )


_TOOL_ID_TAGS = tuple(
    # ToolStartEvent and ToolEndEvent number their four ids alike; the larger tag is counted.
    max(tag_bytes(events_pb2.ToolStartEvent, name), tag_bytes(events_pb2.ToolEndEvent, name))
    for name in ("run_id", "turn_id", "tool_call_id", "tool_name")
)


def _tool_event_ids(run_id: int, turn_id: int, call_id: int, name: int) -> int:
    run_tag, turn_tag, call_tag, name_tag = _TOOL_ID_TAGS
    return (
        delimited(run_tag, run_id)
        + delimited(turn_tag, turn_id)
        + delimited(call_tag, call_id)
        + delimited(name_tag, name)
    )


def _synthetic_message(call_id: int, name: int, content: int) -> int:
    """A synthetic result message: ids, ``content`` bytes of its fields copied from a
    ToolResult, is_error and a timestamp."""
    return (
        delimited(_t(_TRM, "tool_call_id"), call_id)
        + delimited(_t(_TRM, "tool_name"), name)
        + content
        + _t(_TRM, "is_error")
        + _BOOL
        + delimited(_t(_TRM, "timestamp"), _TS)
    )


class _ResultBound:
    """What a call's result message adds when it is placed."""

    __slots__ = ("added", "blocks", "names", "size", "usage")

    def __init__(self, size: int, blocks: int, added: int, usage: int | None, names: int) -> None:
        self.size = size  # the ToolResultMessage, at most
        self.blocks = blocks  # its content blocks
        self.added = added  # its added tool names
        self.usage = usage  # its usage (None: no usage event)
        self.names = names  # its added tool names in a config_update, at most


def _staged(state: LaneState, call: ToolCall) -> messages_pb2.ToolResultMessage:
    message = call.result_message
    if message is None:
        raise corrupt(state, call, "is outcome_ready without a staged result")
    return message


def _ready_result(message: messages_pb2.ToolResultMessage) -> _ResultBound:
    size = message.ByteSize()
    added = message.added_tool_names
    names = 0
    if added:
        if len(added) <= _NAMES_MEASURED:
            names = sum(delimited(_ACTIVE_VALUE, _utf8(name)) for name in added)
        else:
            names = size + _ADDED_NAME_GROWTH * len(added)
    usage = message.usage.ByteSize() if message.HasField("usage") else None
    return _ResultBound(size, len(message.content), len(added), usage, names)


def _cancelled_result(call_id: int, name: int) -> _ResultBound:
    content = delimited(_t(_TRM, "content"), _CANCELLED_BLOCK)
    return _ResultBound(_synthetic_message(call_id, name, content), 1, 0, None, 0)


def _truncated_result(call_id: int, name: int, tool_name: str) -> _ResultBound:
    # The notice names the tool: measured per call (one small message).
    outcome = lane_service_pb2.SyntheticOutcome(cause=lane_service_pb2.SYNTHETIC_CAUSE_TRUNCATED)
    block = synthetic_result(outcome, tool_name, None).content[-1].ByteSize()
    content = delimited(_t(_TRM, "content"), block)
    return _ResultBound(_synthetic_message(call_id, name, content), 1, 0, None, 0)


def _interrupted_result(
    call_id: int, name: int, checkpoint: messages_pb2.ToolResult | None
) -> _ResultBound:
    # The checkpoint's content, details and usage, then the notice (added names are dropped).
    content = delimited(_t(_TRM, "content"), _INTERRUPTED_BLOCK)
    blocks, usage = 1, None
    if checkpoint is not None:
        blocks += len(checkpoint.content)
        content += checkpoint.ByteSize() + _TO_MESSAGE * (len(checkpoint.content) + 2)
        if checkpoint.HasField("usage"):
            usage = checkpoint.usage.ByteSize()
    return _ResultBound(_synthetic_message(call_id, name, content), blocks, 0, usage, 0)


def _result_in_tool_end(result: _ResultBound) -> int:
    """The ToolResult a tool_end carries for ``result`` (terminate set)."""
    return (
        result.size + _TO_RESULT * (result.blocks + result.added + 2) + _t(_TR, "terminate") + _BOOL
    )


def _source_arguments(state: LaneState, batch: ToolBatch, call: ToolCall) -> int:
    content = batch.assistant.content
    if call.source_index >= len(content):
        raise corrupt(state, call, "has no tool-call block at its source index")
    block = content[call.source_index]
    if block.WhichOneof("block") != "tool_call":
        raise corrupt(state, call, "has no tool-call block at its source index")
    return _utf8(block.tool_call.arguments_json)


def _config_names(configuration: snapshot_pb2.LaneConfiguration) -> int:
    """The configuration's active tool names as a config_update lists them, at most."""
    return configuration.ByteSize() + _CONFIG_NAME_GROWTH * len(configuration.active_tool_names)


_NOT_STAGED, _STAGED, _STARTED_AND_STAGED = 0, 1, 2


@functools.lru_cache(maxsize=4096)
def _call_events(
    envelope: int,
    run_id: int,
    turn_id: int,
    call_id: int,
    name: int,
    entry_id: int,
    parent_id: int,
    staging: int,
    arguments: int,
    size: int,
    blocks: int,
    added: int,
    usage: int,
) -> int:
    """The events ending the run adds for one call, from its sizes: [tool_start] [tool_end]
    (as ``staging`` says), message_start, message_end, entry_added, [usage] (``usage`` -1:
    none). Memoized: the calls of a batch mostly share their sizes, and a cached lane's
    calls keep theirs from command to command."""
    events = _Events(envelope)
    if staging != _NOT_STAGED:
        ids = _tool_event_ids(run_id, turn_id, call_id, name)
        if staging == _STARTED_AND_STAGED:
            tag = _t(events_pb2.ToolStartEvent, "arguments_json")
            events.add("tool_start", ids + delimited(tag, arguments))
        TE = events_pb2.ToolEndEvent
        result = _ResultBound(size, blocks, added, None, 0)
        events.add(
            "tool_end",
            ids
            + delimited(_t(TE, "result"), _result_in_tool_end(result))
            + _t(TE, "is_error")
            + _BOOL
            + _t(TE, "terminate")
            + _BOOL,
        )
    _placed_message(events, run_id, delimited(_AGENT_TOOL_RESULT, size), entry_id, parent_id)
    if usage >= 0:
        _usage_event(events, usage, entry_id)
    return events.size


def run_end_bytes(state: LaneState) -> int:
    """An upper bound of the event group of ending ``state``'s open run now (the ABORTED end a
    reconciler records): every unfinished call settled and placed, turn and run ended.

    The events follow ``runs.end_run``: the ready prefix placed, then each planned call
    (tool_start, tool_end) or effect_pending one (tool_end, its checkpoint kept) given its
    cancellation (or truncation) result and placed with the outcome_ready calls after it
    (message_start, message_end, entry_added, [usage]; [config_update] per step whose results
    add tools);
    turn_end with the assistant message and every result; run_end. Each is summed from the
    call's own sizes, in one pass over the batch.
    """
    operation = state.operation
    assert operation is not None and operation.batch is not None
    batch = operation.batch
    events = _Events(_envelope(state.lane_id))
    run_id, turn_id = _utf8(operation.operation_id), _utf8(batch.turn_id)
    tip = _utf8(state.tip_id)
    results = 0  # turn_end's tool_results
    results_tag = _t(events_pb2.TurnEndEvent, "tool_results")
    names_before: int | None = None  # the active tool names before this step, at most
    step_names = 0
    step_adds = False
    placed = False

    def end_step() -> None:
        nonlocal names_before, step_names, step_adds
        if step_adds:
            assert names_before is not None
            change = delimited(
                _t(events_pb2.ConfigUpdateEvent, "active_tools"), 2 * names_before + step_names
            )
            events.add("config_update", change)
            names_before += step_names
        step_names, step_adds = 0, False

    for call in sorted(batch.calls, key=lambda c: c.source_index):
        if call.status == CallStatus.COMPLETED:
            if call.result_message is not None:
                results += delimited(results_tag, call.result_message.ByteSize())
            continue
        call_id, name, entry_id = (
            _utf8(call.tool_call_id),
            _utf8(call.tool_name),
            _utf8(call.result_entry_id),
        )
        arguments, staging = 0, _NOT_STAGED
        if call.status == CallStatus.OUTCOME_READY:
            result = _ready_result(_staged(state, call))
        else:
            end_step()  # a new step starts with this call
            if call.status == CallStatus.PLANNED:
                arguments, staging = _source_arguments(state, batch, call), _STARTED_AND_STAGED
                result = (
                    _truncated_result(call_id, name, call.tool_name)
                    if batch.cut_for_length
                    else _cancelled_result(call_id, name)
                )
            else:
                staging = _STAGED
                result = _interrupted_result(call_id, name, call.checkpoint)
        events.size += _call_events(
            events.envelope, run_id, turn_id, call_id, name, entry_id, tip,
            staging, arguments, result.size, result.blocks, result.added,
            -1 if result.usage is None else result.usage,
        )  # fmt: skip
        if result.added:
            if names_before is None:
                names_before = _config_names(state.configuration)
            step_names += result.names
            step_adds = True
        results += delimited(results_tag, result.size)
        tip = entry_id
        placed = True
    end_step()
    if placed:
        TEnd = events_pb2.TurnEndEvent
        events.add(
            "turn_end",
            delimited(_t(TEnd, "run_id"), run_id)
            + delimited(_t(TEnd, "turn_id"), turn_id)
            + delimited(_t(TEnd, "message"), batch.assistant.ByteSize())
            + results,
        )
    RE = events_pb2.RunEndEvent
    events.add(
        "run_end",
        delimited(_t(RE, "run_id"), run_id)
        + _t(RE, "status")
        + _ABORTED
        + delimited(_t(RE, "from_tip_id"), _utf8(operation.from_tip_id))
        + delimited(_t(RE, "tip_id"), tip)
        + delimited(_t(RE, "ended_time"), _TS),
    )
    return events.group()


def _inbox_item_overhead(events: _Events) -> int:
    """What placing one queued item adds beyond three times its encoding: three events (a
    custom entry has one) with their envelopes, the run id twice, and each length prefix and
    tag of the message (three times) and its entry id (message_end, entry id, the next item's
    parent), at their largest."""
    MEnd, E = events_pb2.MessageEndEvent, entries_pb2.Entry
    ME, EA = entries_pb2.MessageEntry, events_pb2.EntryAddedEvent
    run_id = _utf8(_SIM_OPERATION_ID)

    def prefix(tag: int) -> int:
        return tag + _LENGTH

    def carrying(kind: str, event: type) -> int:
        """message_start or message_end: its kind, the run id and the message."""
        return (
            prefix(_KIND[kind])
            + prefix(_t(event, "run_id"))
            + run_id
            + prefix(_t(event, "message"))
        )

    per_event = prefix(number_tag_bytes(EVENTS_FIELD)) + events.envelope
    start = carrying("message_start", events_pb2.MessageStartEvent)
    end = carrying("message_end", MEnd) + prefix(_t(MEnd, "entry_id"))
    added = (
        prefix(_KIND["entry_added"])
        + prefix(_t(EA, "entry"))
        + prefix(_t(E, "id"))
        + prefix(_t(E, "parent_id"))
        + _t(E, "seq")
        + _REVISION
        + prefix(_t(E, "timestamp"))
        + _TS
        + prefix(max(_t(E, "message"), _t(E, "custom")))
        + prefix(_t(ME, "message"))
        + _t(ME, "terminate")
        + _BOOL
    )
    return 3 * per_event + start + end + added


def inbox_bytes(state: LaneState) -> int:
    """The lane's inbox, encoded (the sum of its items)."""
    return sum(item.ByteSize() for item in state.inbox)


def run_start_bytes(state: LaneState, inbox: int | None = None) -> int:
    """An upper bound of the event group of a run started now that captures the whole inbox
    (a one-character prompt, a 128-byte operation id): run_start, each item placed
    (message_start, message_end, entry_added; a custom entry only entry_added), the prompt
    placed, queue_update. An item's message appears three times, its entry id three times
    (message_end, the entry, the next entry's parent): at most three times the item's own
    encoding, plus a fixed overhead per item (an item left queued costs less). ``inbox`` is
    :func:`inbox_bytes` when the caller has it."""
    events = _Events(_envelope(state.lane_id))
    run_id = _utf8(_SIM_OPERATION_ID)
    RS = events_pb2.RunStartEvent
    events.add(
        "run_start", delimited(_t(RS, "run_id"), run_id) + delimited(_t(RS, "started_time"), _TS)
    )
    if inbox is None:
        inbox = inbox_bytes(state)
    events.size += 3 * inbox + len(state.inbox) * _inbox_item_overhead(events)
    # The first item's parent is the tip; every later parent (the prompt's too) is an item's
    # entry id, counted with that item.
    events.size += _utf8(state.tip_id) + _LENGTH
    _placed_message(events, run_id, _SIM_PROMPT.ByteSize(), _NEW_ID_BYTES, 0)
    # queue_update: the items left queued are counted with the items; its own envelope and
    # the prefix of its list.
    events.add("queue_update", _LENGTH)
    return events.group()
