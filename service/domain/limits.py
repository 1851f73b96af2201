"""Size limits: everything the service sends must fit one gRPC message (4 MiB).

Events are encoded once and streamed as they are, and an event group is never split: one
commit's events travel in one WatchLane message. The lane's live state (a snapshot without its
transcript) travels in one message too, and so does a run's durable state (GetOperation,
AcquireOperation). A commit that broke any of them could never be delivered: every watcher
would fail on it forever. So commands are refused before anything is written:

- **payloads** (INVALID_ARGUMENT ``PAYLOAD_TOO_LARGE``, checked by
  ``service/api/validation.py``): each message, tool result, argument text, entry and
  deferred handle a request carries is at most :data:`MAX_PAYLOAD_BYTES` encoded (an
  operation error :data:`MAX_ERROR_BYTES`). A tool batch of one call with every payload at its
  limit always fits: its largest commit puts a result in five events (tool_end,
  message_start, message_end, entry_added, turn_end) beside the assistant message.
- **commits** (RESOURCE_EXHAUSTED ``COMMIT_TOO_LARGE``, :func:`check_commit`): payloads add up
  (many calls in one batch, a full inbox, several prompts), so every commit is measured: its
  event group, the lane's live state and the run's durable state after it, and the largest
  commits the service may later *have* to make with what the lane now holds — ending the run
  (every unfinished call of the batch settled and placed, turn and run ended, in one group) and
  starting a run that captures the whole inbox. Those are simulated with the domain's own
  functions at their largest encodings, so a lane never holds what it could not deliver.

The transcript is the one thing that grows past a message over many commits: WatchLane sends
it in chunks (``service/api/watch.py``), each entry having fit its own event group, and
GetLaneSnapshot refuses a snapshot over one message (RESOURCE_EXHAUSTED ``SNAPSHOT_TOO_LARGE``)
rather than let gRPC fail the send.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from lane.v1 import events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from service.domain.capture import capture
from service.domain.errors import LaneError, ResourceExhausted
from service.domain.runs import end_run, start_run
from service.domain.state import LaneState, Operation
from service.domain.transition import Transition

#: The largest message sent or received: gRPC's default receive limit, so any client with
#: default settings receives everything (service/app/server.py MAX_*_MESSAGE_BYTES).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: One payload of a request (a message, a tool result, arguments, an entry), encoded.
MAX_PAYLOAD_BYTES = 512 * 1024
#: An operation error (EndRun, EndCompaction), encoded: it stays in every snapshot as the
#: lane's last result.
MAX_ERROR_BYTES = 64 * 1024
#: The lane's live state: its snapshot without transcript and last result, as the WatchLane
#: head message. The rest of a message is kept for the last result (at most an error and ids).
MAX_LIVE_STATE_BYTES = MAX_MESSAGE_BYTES - 512 * 1024
#: A commit the service may have to make later is simulated now; the real one may differ by
#: ids and timestamps of other lengths. This much of a message is kept for that.
FUTURE_MARGIN_BYTES = 4 * 1024

# Simulated commits use the largest encodings of what varies: a timestamp with 5-byte seconds
# and 5-byte nanos, revisions of 9-byte varints, 36-character ids, 128-byte operation ids.
_SIM_NOW = datetime(2999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
_SIM_REVISION = 1 << 56
_SIM_OPERATION_ID = "o" * 128
_SIM_PROMPT = messages_pb2.AgentMessage(
    user=messages_pb2.UserMessage(
        content=[messages_pb2.ContentBlock(text=messages_pb2.TextContent(text="."))]
    )
)
_SIM_SETTINGS = lane_service_pb2.RunSettings(
    steering_mode=lane_service_pb2.DELIVERY_MODE_ALL,
    follow_up_mode=lane_service_pb2.DELIVERY_MODE_ALL,
)


def _sim_id() -> str:
    return "0" * 36  # a UUID's length


def varint_bytes(value: int) -> int:
    """The length of ``value`` as a protobuf varint."""
    return max(1, (value.bit_length() + 6) // 7)


def field_bytes(payload: int) -> int:
    """The length of a length-delimited field (number below 16) with ``payload`` bytes."""
    return 1 + varint_bytes(payload) + payload


def group_frame_bytes(events: Sequence[events_pb2.HarnessEvent]) -> int:
    """The length of the WatchLaneResponse carrying ``events`` as one event group."""
    return field_bytes(sum(field_bytes(event.ByteSize()) for event in events))


def head_frame_bytes(snapshot_bytes: int) -> int:
    """The length of the WatchLaneResponse whose SnapshotHead holds a ``snapshot_bytes``-byte
    snapshot (following_chunks counted at its largest)."""
    return field_bytes(field_bytes(snapshot_bytes) + 6)


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
    snapshot = capture(replace(state, last_result=None), ())
    return head_frame_bytes(snapshot.ByteSize())


def operation_state_bytes(operation: Operation) -> int:
    """An upper bound of the AcquireOperationResponse (and GetOperationResponse) of
    ``operation``: its assistant message, settings, each call's arguments and checkpoint, and
    a fixed allowance for ids, enums, the lease and the framing (ids are at most 128 bytes)."""
    size = 1024 + operation.settings.ByteSize()
    batch = operation.batch
    if batch is not None:
        size += field_bytes(batch.assistant.ByteSize())
        for call in batch.calls:
            size += 512
            if call.arguments_json is not None:
                size += len(call.arguments_json.encode())
            if call.checkpoint is not None:
                size += call.checkpoint.ByteSize()
    return size


def run_end_bytes(state: LaneState) -> int:
    """The event group of ending ``state``'s open run now, at its largest encoding."""
    operation = state.operation
    assert operation is not None
    simulated = replace(state, revision=max(state.revision, _SIM_REVISION))
    transition = end_run(
        simulated,
        operation.operation_id,
        snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
        None,
        _SIM_NOW,
        _sim_id,
        recovery=True,
        lease_token=None,
    )
    return group_frame_bytes(transition.events)


def run_start_bytes(state: LaneState) -> int:
    """The event group of a run started now that captures the whole inbox (a one-character
    prompt, a 128-byte operation id), at its largest encoding."""
    simulated = replace(state, operation=None, revision=max(state.revision, _SIM_REVISION))
    transition = start_run(
        simulated, _SIM_OPERATION_ID, [_SIM_PROMPT], _SIM_SETTINGS, _SIM_NOW, _sim_id
    )
    return group_frame_bytes(transition.events)


def content_bound(state: LaneState) -> int:
    """An upper bound of every message derived from ``state`` (its live state, its run's
    durable state, ending its run, a run capturing its inbox), computed without building any.

    Each of those holds a payload of the lane at most five times (a result: tool_end,
    message_start, message_end, entry_added, turn_end; an inbox item: three times and in a
    queue_update; the assistant message: tool_start arguments and turn_end) besides envelopes:
    at most 11 KiB per call (six events of at most 1 KiB with ids of 128 bytes, and the 1 KiB a
    synthetic result adds, five times), three events per inbox item (of at most 512 bytes each
    besides the lane id), and 16 KiB for the rest.
    """
    lane_id = len(state.lane_id.encode())
    size = state.configuration.ByteSize() + state.usage_totals.ByteSize()
    size += sum(item.ByteSize() for item in state.inbox)
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

    The event group is measured exactly; the rest only when :func:`content_bound` says the lane
    holds enough to come near a limit (the simulations cost about a commit's own CPU time).
    """
    if not transition.events:
        return
    after = transition.state
    lane_id = after.lane_id
    _require("eventGroup", group_frame_bytes(transition.events), MAX_MESSAGE_BYTES, lane_id)
    if content_bound(after) <= MAX_LIVE_STATE_BYTES:
        return
    future_limit = MAX_MESSAGE_BYTES - FUTURE_MARGIN_BYTES
    try:
        _require("liveState", live_state_bytes(after), MAX_LIVE_STATE_BYTES, lane_id)
        operation = after.operation
        if operation is not None:
            _require("operationState", operation_state_bytes(operation), MAX_MESSAGE_BYTES, lane_id)
            if operation.batch is not None and operation.kind == snapshot_pb2.OPERATION_KIND_RUN:
                _require("runEnd", run_end_bytes(after), future_limit, lane_id)
        if after.inbox and (before is None or len(after.inbox) > len(before.inbox)):
            _require("runStart", run_start_bytes(after), future_limit, lane_id)
    except ResourceExhausted:
        raise
    except LaneError:
        return  # corrupt durable state: capture refuses it loudly on its own
