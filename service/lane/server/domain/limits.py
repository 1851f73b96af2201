"""Size limits: everything the service sends must fit one gRPC message (4 MiB).

Events are encoded once and streamed as they are, and an event group is never split: one
commit's events travel in one WatchLane message. The lane's live state (a snapshot without its
transcript) travels in one message too, and so does a run's durable state (GetOperation,
AcquireOperation). A commit that broke any of them could never be delivered: every watcher
would fail on it forever. So commands are refused before anything is written:

- **counts** (INVALID_ARGUMENT ``TOO_MANY_*``, checked by ``service/lane/server/api/validation.py``
  before anything walks a request): tool calls per assistant message, content blocks, messages and
  tool names per request. They keep every command's work small, and a whole batch at the
  limit always ends within one message.
- **payloads** (INVALID_ARGUMENT ``PAYLOAD_TOO_LARGE``, also
  ``service/lane/server/api/validation.py``): each message, tool result, argument text, entry and
  deferred handle a request carries is at most :data:`MAX_PAYLOAD_BYTES` encoded (an operation error
  :data:`MAX_ERROR_BYTES`). A tool batch of one call with every payload at its limit always fits:
  its largest commit puts a result in five events (tool_end, message_start, message_end,
  entry_added, turn_end) beside the assistant message.
- **commits** (RESOURCE_EXHAUSTED ``COMMIT_TOO_LARGE``, :func:`check_commit`): payloads add up
  (many calls in one batch, a full inbox, several prompts), so every commit is measured: its
  event group, the lane's live state and the run's durable state after it, and the largest
  commits the service may later *have* to make with what the lane now holds — ending the run
  (every unfinished call of the batch settled and placed, turn and run ended, in one group) and
  starting a run that captures the whole inbox.

Those two future commits are never built to be measured:
``service/lane/server/domain/future_commits.py`` bounds them in closed form (:func:`run_end_bytes`,
:func:`run_start_bytes`), from each call's and inbox item's own sizes, and says what each bound
counts and why it holds. This module says what is refused and why.

The transcript is the one thing that grows past a message over many commits: WatchLane sends
it in chunks (``service/lane/server/api/watch.py``), each entry having fit its own event group, and
GetLaneSnapshot refuses a snapshot over one message (RESOURCE_EXHAUSTED ``SNAPSHOT_TOO_LARGE``)
rather than let gRPC fail the send.
"""

from __future__ import annotations

from collections.abc import Sequence

# Re-exported: the layers above read every limit from this module.
from lane.limits import MAX_ERROR_BYTES as MAX_ERROR_BYTES
from lane.limits import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from lane.limits import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from lane.v1 import events_pb2, lane_service_pb2, snapshot_pb2

from lane.server.domain.capture import capture
from lane.server.domain.errors import LaneError, ResourceExhausted
from lane.server.domain.future_commits import inbox_bytes, run_end_bytes, run_start_bytes
from lane.server.domain.state import LaneState, Operation, evolve
from lane.server.domain.transition import Transition
from lane.server.domain.wire import (
    HEAD_FOLLOWING_CHUNKS_FIELD,
    HEAD_SNAPSHOT_FIELD,
    MAX_LENGTH_VARINT_BYTES,
    SNAPSHOT_HEAD_FIELD,
    TRANSCRIPT_FIELD,
    delimited,
    event_field_bytes,
    event_group_bytes,
    number_tag_bytes,
    tag_bytes,
)

# MAX_MESSAGE_BYTES (the largest message sent or received), MAX_PAYLOAD_BYTES (one payload of
# a request) and MAX_ERROR_BYTES (an operation error: it stays in every snapshot as the lane's
# last result) are the contract's, shared with the clients: lane/limits.py.
#: The lane's live state: its snapshot without transcript and last result, as the WatchLane
#: head message. The rest of a message is kept for the last result (at most an error and ids).
MAX_LIVE_STATE_BYTES = MAX_MESSAGE_BYTES - 512 * 1024
#: A commit the service may have to make later is bounded now; this much of a message is kept
#: besides, for what the bound does not see (a later lease's ids, a longer clock).
FUTURE_MARGIN_BYTES = 4 * 1024
#: Ending the run and starting one that captures the inbox are each at most this many times
#: :func:`content_bound` (each holds a payload at most five times, its tags a little longer,
#: and an envelope per event well within the bound's allowance per call and item;
#: tests/unit/domain/test_domain_limit_bounds.py checks it on randomized lanes). So the rule
#: bounds them in closed form only when this many content bounds would not fit a message:
#: for nearly every lane they are not computed at all.
FUTURE_COMMITS_WITHIN_BOUND = 2

#: Tool calls in one assistant message (INVALID_ARGUMENT ``TOO_MANY_TOOL_CALLS``). Models emit
#: at most tens of parallel calls; 256 leaves an order of magnitude beyond that, keeps every
#: per-command step over a batch (each command loads, checks and writes the whole batch)
#: around a millisecond, and a whole batch at the limit with 128-byte ids and names, ended
#: unfinished, is about 1 MiB of events: well within one message.
MAX_TOOL_CALLS = 256
#: Content blocks in one request, all the messages it carries together
#: (INVALID_ARGUMENT ``TOO_MANY_CONTENT_BLOCKS``). Real messages hold tens of blocks; 4,096
#: bounds the per-block work a request causes (validation, settlement) to a few milliseconds.
MAX_CONTENT_BLOCKS = 4096
#: Messages in one request: StartRun prompts, AppendAssistantStream partials, a compaction's
#: retained tail (INVALID_ARGUMENT ``TOO_MANY_MESSAGES``). Each one placed or streamed is up to
#: three events.
MAX_REQUEST_MESSAGES = 256
#: Tool names in one request (a configuration's active tools, a result's added tools)
#: (INVALID_ARGUMENT ``TOO_MANY_TOOL_NAMES``).
MAX_TOOL_NAMES = 4096

# The snapshot frames' tag sizes, from the field numbers service/lane/server/api/framing.py writes.
_HEAD = number_tag_bytes(SNAPSHOT_HEAD_FIELD)
_HEAD_SNAPSHOT = number_tag_bytes(HEAD_SNAPSHOT_FIELD)
_HEAD_FOLLOWING = number_tag_bytes(HEAD_FOLLOWING_CHUNKS_FIELD)
_TRANSCRIPT = number_tag_bytes(TRANSCRIPT_FIELD)
_ANSWER_SNAPSHOT = tag_bytes(lane_service_pb2.GetLaneSnapshotResponse, "snapshot")


def group_frame_bytes(events: Sequence[events_pb2.HarnessEvent]) -> int:
    """The length of the WatchLaneResponse carrying ``events`` as one event group."""
    return event_group_bytes(sum(event_field_bytes(event.ByteSize()) for event in events))


def head_frame_bytes(snapshot_bytes: int) -> int:
    """The length of the WatchLaneResponse whose SnapshotHead holds a ``snapshot_bytes``-byte
    snapshot (following_chunks counted at its largest)."""
    head = delimited(_HEAD_SNAPSHOT, snapshot_bytes) + _HEAD_FOLLOWING + 5  # int32 ≥ 0: 5 bytes
    return delimited(_HEAD, head)


def transcript_entry_bytes(entry_bytes: int) -> int:
    """The length of one ``entry_bytes``-byte entry in a snapshot's transcript."""
    return delimited(_TRANSCRIPT, entry_bytes)


def snapshot_answer_bytes(snapshot_bytes: int) -> int:
    """The length of the GetLaneSnapshotResponse holding a ``snapshot_bytes``-byte snapshot."""
    return delimited(_ANSWER_SNAPSHOT, snapshot_bytes)


def check_snapshot_message(lane_id: str, size: int) -> None:
    """Refuse (RESOURCE_EXHAUSTED ``SNAPSHOT_TOO_LARGE``) a GetLaneSnapshot answer of ``size``
    bytes that one message cannot carry: a transcript grows past it over many commits, and
    WatchLane sends it in chunks."""
    if size > MAX_MESSAGE_BYTES:
        raise ResourceExhausted(
            "SNAPSHOT_TOO_LARGE",
            f"lane {lane_id}'s snapshot is {size} bytes, more than one message carries "
            f"({MAX_MESSAGE_BYTES}); read it with WatchLane, which sends the transcript in chunks",
            laneId=lane_id,
            bytes=size,
            limit=MAX_MESSAGE_BYTES,
        )


# -- commits ---------------------------------------------------------------------------------

_WHAT = {
    "eventGroup": "its event group (one WatchLane message)",
    "liveState": "the lane's live state after it (the snapshot without transcript)",
    "operationState": "the run's durable state after it (GetOperation, AcquireOperation)",
    "runEnd": "ending the run after it (every unfinished call settled and placed in one commit)",
    "runStart": "a run capturing the lane's whole inbox after it",
}


def _require(part: str, size: int, limit: int, lane_id: str) -> None:
    if size > limit:
        raise ResourceExhausted(
            "COMMIT_TOO_LARGE",
            f"refused: {_WHAT[part]} would take {size} bytes; the limit is {limit}. Send less "
            "(smaller results or messages, fewer at once), or end the run",
            laneId=lane_id,
            part=part,
            bytes=size,
            limit=limit,
        )


def live_state_bytes(state: LaneState) -> int:
    """The WatchLane head message of ``state`` without transcript and last result."""
    snapshot = capture(evolve(state, last_result=None), ())
    return head_frame_bytes(snapshot.ByteSize())


def operation_state_bytes(operation: Operation) -> int:
    """An upper bound of the AcquireOperationResponse (and GetOperationResponse) of
    ``operation``: its assistant message, settings, each call's arguments and checkpoint, and
    a fixed allowance for ids, enums, the lease and the framing (ids are at most 128 bytes)."""
    size = 1024 + operation.settings.ByteSize()
    batch = operation.batch
    if batch is not None:
        size += batch.assistant.ByteSize() + 2 * MAX_LENGTH_VARINT_BYTES  # its tag, length
        for call in batch.calls:
            size += 512
            if call.arguments_json is not None:
                size += len(call.arguments_json.encode())
            if call.checkpoint is not None:
                size += call.checkpoint.ByteSize()
    return size


def content_bound(state: LaneState) -> int:
    """An upper bound of the lane's live state and its run's durable state, computed without
    building either (the shortcut of :func:`check_commit`).

    Each holds a payload of the lane at most twice (a running call's arguments and progress;
    a settled one's arguments and result; an inbox item; the assistant message) besides
    envelopes: counted five times here, with at most 11 KiB per call and 1.5 KiB per inbox
    item (ids of 128 bytes) and 16 KiB for the rest.
    """
    lane_id = len(state.lane_id.encode())
    size = state.configuration.ByteSize() + state.usage_totals.ByteSize()
    size += inbox_bytes(state)
    overhead = len(state.inbox) * (3 * lane_id + 1536) + 16 * 1024 + 8 * lane_id
    operation = state.operation
    if operation is not None:
        size += operation.settings.ByteSize()
        for part in (operation.streaming, operation.deferred, operation.retry):
            size += part.ByteSize() if part is not None else 0
        batch = operation.batch
        if batch is not None:
            size += batch.assistant.ByteSize()
            overhead += len(batch.calls) * 11 * 1024
            for call in batch.calls:
                size += len(call.arguments_json.encode()) if call.arguments_json else 0
                for message in (call.progress, call.checkpoint, call.result_message):
                    size += message.ByteSize() if message is not None else 0
    return 5 * size + overhead


def check_commit(before: LaneState | None, transition: Transition) -> None:
    """Refuse (RESOURCE_EXHAUSTED ``COMMIT_TOO_LARGE``) ``transition`` from ``before`` (None: a
    new lane) when anything it leaves to deliver would not fit one message. A commit without
    events changes nothing anyone is sent.

    The event group is measured exactly. The rest only when :func:`content_bound` says the lane
    holds enough to come near a limit: the live state is then captured and measured, the run's
    durable state and (past :data:`FUTURE_COMMITS_WITHIN_BOUND` content bounds) ending the run
    and a run capturing the inbox are bounded in closed form (the latter two in
    ``future_commits.py``). All of it is linear in the lane's batch and inbox, with a few
    ``ByteSize`` calls per call or item.
    """
    if not transition.events:
        return
    after = transition.state
    lane_id = after.lane_id
    _require("eventGroup", group_frame_bytes(transition.events), MAX_MESSAGE_BYTES, lane_id)
    future_limit = MAX_MESSAGE_BYTES - FUTURE_MARGIN_BYTES
    operation = after.operation
    try:
        bound = content_bound(after)
        if bound > MAX_LIVE_STATE_BYTES:
            _require("liveState", live_state_bytes(after), MAX_LIVE_STATE_BYTES, lane_id)
            if operation is not None:
                size = operation_state_bytes(operation)
                _require("operationState", size, MAX_MESSAGE_BYTES, lane_id)
        if FUTURE_COMMITS_WITHIN_BOUND * bound <= future_limit:
            return  # neither future commit can come near a message: not worth bounding
        if (
            operation is not None
            and operation.batch is not None
            and operation.kind == snapshot_pb2.OPERATION_KIND_RUN
        ):
            _require("runEnd", run_end_bytes(after), future_limit, lane_id)
        if after.inbox and (before is None or len(after.inbox) > len(before.inbox)):
            _require("runStart", run_start_bytes(after), future_limit, lane_id)
    except ResourceExhausted:
        raise
    except LaneError:
        return  # corrupt durable state: capture refuses it loudly on its own
