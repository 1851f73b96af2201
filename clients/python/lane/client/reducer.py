"""Fold lane events into a lane snapshot: the client-side mirror of snapshot capture.

A watcher receives one ``LaneSnapshot`` at revision R and then every ``HarnessEvent`` committed
after it. Folding those events with this reducer gives exactly what a fresh snapshot at the
last folded revision would show (docs/contract.md, invariant 2 "fold equals capture").

API (an immutable fold)::

    apply(snapshot, event) -> Reduction      # one event
    fold(snapshot, events) -> Reduction      # many events, in order
    is_rebase(event) -> bool                 # does this event ask the client to re-snapshot?
    fold_into(snapshot, event) -> bool       # one event, changing ``snapshot`` itself

``Reduction`` is a frozen dataclass ``(snapshot, rebase)``. ``apply`` and ``fold`` never mutate
the snapshot or the events they are given: they copy the snapshot once, change the copy and
return it (``fold`` copies once for the whole sequence, not once per event). The returned
snapshot is the caller's own and shares nothing with the inputs. ``rebase`` is true when the
event (for ``fold``: any folded event) was ``navigation_end``: the lane's history moved under the
client, which must fetch a fresh snapshot (or re-watch). The fold keeps going after a rebase
signal; what it returns is then only a best effort until the client has re-snapshotted.
``fold_into`` is the same fold without the copy, for a caller that owns the snapshot and folds a
long log event by event (the service checks an imported lane's log with it).

Rules (docs/contract.md: Tool calls, Commits and their events):

Envelope
    * An event with a non-empty ``lane_id`` different from ``snapshot.lane_id`` is ignored
      entirely and never moves the revision. (The reference model accepts ``usage`` from any
      lane because its totals are session-wide; the service's totals are per lane.)
    * An event of the snapshot's lane sets ``snapshot.revision`` to ``event.revision`` whatever
      its kind, including no-op kinds and kinds this client does not know (an empty ``kind``),
      so a fold equals a capture at that revision.
    * A lane-less event (empty ``lane_id``: ``fault``, ``value_update``, global
      ``config_update``) applies without touching the revision.

"Matching operation" means ``snapshot.operation`` is present and its ``id`` equals the event's
run id (``operation_abort``: its ``operation_id``). An event that needs a matching operation and
finds none changes nothing but the revision.

Per kind
    * ``run_start``: the operation becomes a new open RUN operation (unconditional replace), its
      ``from_tip_id`` the snapshot's current tip and no running tools.
    * ``compaction_start``: a new open COMPACTION operation, only when none is open (an in-run
      compaction bracket changes nothing).
    * ``navigation_start``: a new open NAVIGATION operation (unconditional replace).
    * ``operation_abort``: matching operation's status becomes ABORTING.
    * ``run_resume``: matching operation loses ``deferred``.
    * ``run_suspend``: matching operation loses ``streaming_message`` and gets the event's
      ``deferred`` (present, possibly empty, even if the event left it unset).
    * ``retry_scheduled``: matching operation's ``retry`` becomes
      ``{attempt, max_attempts, next_attempt_time = not_before_time, error_message}``.
    * ``retry_start``, ``retry_end``: matching operation loses ``retry``.
    * ``message_start``: only with a run id and an assistant message whose stop reason is
      PENDING: matching operation's ``streaming_message`` becomes that message.
    * ``message_update``: matching operation's ``streaming_message`` becomes the message.
    * ``message_end``: with a run id, matching operation loses ``streaming_message``.
    * ``tool_start``: matching operation upserts, by ``tool_call_id``, a fresh running row
      ``{tool_call_id, tool_name, arguments_json}``: an existing row is replaced wholesale in
      its position (dropping any stale result), otherwise the row is appended.
    * ``tool_update``: matching operation, existing row, row running: the row's ``result``
      becomes ``partial_result``. A wrong run id, a missing row or a settled row: ignored.
    * ``tool_end``: matching operation, existing row: the row becomes settled
      ``{tool_call_id, tool_name (event), arguments_json (row), result (event, always
      present), is_error}``. ``tool_end`` never creates a row.
    * ``entry_added``: when the entry is a tool-result message and an operation is open, the
      row with that ``tool_call_id`` (and only it) is removed. Then a compaction entry replaces
      the transcript, any other entry is appended; ``tip_id`` becomes the entry id; a message
      entry adds one to ``stats.message_count``. An ``entry_added`` without an entry is
      ignored.
    * ``queue_update``: ``queues`` becomes the event's queues.
    * ``usage``: ``stats.usage`` becomes the event's totals.
    * ``config_update`` (lane-scoped only): each present change among ``model``,
      ``thinking_level`` and ``active_tools`` replaces that part of the configuration;
      ``settings`` and lane-less updates change nothing.
    * ``run_end``: matching RUN operation: ``last_result`` records the run (``error`` only when
      FAILED; from/to tip from the event; start time from the operation), the operation is
      cleared and ``tip_id`` becomes the event's ``tip_id``.
    * ``compaction_end``: matching COMPACTION operation: ``last_result`` records it with
      ``from_tip_id`` from the operation and ``tip_id`` the snapshot's current tip; the
      operation is cleared. (An in-run ``compaction_end`` matches a RUN operation: ignored.)
    * ``navigation_end``: rebase signal; nothing else changes.
    * ``fault``: ``faulted`` becomes true.
    * ``handler_error``, ``turn_start``, ``turn_end``, ``value_update``, ``lane_created``: no
      change. ``turn_end`` in particular never removes tool rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from lane.v1 import events_pb2, messages_pb2, snapshot_pb2

__all__ = ["EVENT_KINDS", "Reduction", "apply", "fold", "fold_into", "is_rebase"]

LaneSnapshot = snapshot_pb2.LaneSnapshot
HarnessEvent = events_pb2.HarnessEvent
SnapshotOperation = snapshot_pb2.SnapshotOperation


@dataclass(frozen=True, slots=True)
class Reduction:
    """The result of folding: a new snapshot, and whether the client must re-snapshot."""

    snapshot: snapshot_pb2.LaneSnapshot
    rebase: bool


def apply(snapshot: snapshot_pb2.LaneSnapshot, event: events_pb2.HarnessEvent) -> Reduction:
    """Fold one event into a copy of ``snapshot``; the inputs are left unchanged."""
    result = _copy(snapshot)
    rebase = fold_into(result, event)
    return Reduction(snapshot=result, rebase=rebase)


def fold(
    snapshot: snapshot_pb2.LaneSnapshot, events: Iterable[events_pb2.HarnessEvent]
) -> Reduction:
    """Fold ``events`` in order into a copy of ``snapshot``.

    ``rebase`` is true if any folded event signalled a rebase. The inputs are left unchanged.
    """
    result = _copy(snapshot)
    rebase = False
    for event in events:
        rebase = fold_into(result, event) or rebase
    return Reduction(snapshot=result, rebase=rebase)


def is_rebase(event: events_pb2.HarnessEvent) -> bool:
    """Whether ``event`` tells a client folding it to fetch a fresh snapshot."""
    return event.WhichOneof("kind") == "navigation_end"


def _copy(snapshot: snapshot_pb2.LaneSnapshot) -> snapshot_pb2.LaneSnapshot:
    copy = snapshot_pb2.LaneSnapshot()
    copy.CopyFrom(snapshot)
    return copy


def fold_into(snap: snapshot_pb2.LaneSnapshot, event: events_pb2.HarnessEvent) -> bool:
    """Fold ``event`` into ``snap`` itself (the caller owns it); return the rebase signal."""
    kind = event.WhichOneof("kind")
    if event.lane_id and event.lane_id != snap.lane_id:
        return False
    if event.lane_id:
        snap.revision = event.revision
    if kind is None:
        # A kind this client does not know: only the envelope applies.
        return False
    _HANDLERS[kind](snap, event)
    return kind == "navigation_end"


def _matching(snap: snapshot_pb2.LaneSnapshot, operation_id: str) -> SnapshotOperation | None:
    if snap.HasField("operation") and snap.operation.id == operation_id:
        return snap.operation
    return None


def _tool_index(op: SnapshotOperation, tool_call_id: str) -> int | None:
    for index, row in enumerate(op.running_tools):
        if _row_id(row) == tool_call_id:
            return index
    return None


def _row_id(row: snapshot_pb2.SnapshotTool) -> str | None:
    state = row.WhichOneof("state")
    if state == "running":
        return row.running.tool_call_id
    if state == "settled":
        return row.settled.tool_call_id
    return None


def _open_operation(
    snap: snapshot_pb2.LaneSnapshot,
    operation_id: str,
    kind: snapshot_pb2.OperationKind.ValueType,
    started_time_source: events_pb2.RunStartEvent
    | events_pb2.CompactionStartEvent
    | events_pb2.NavigationStartEvent,
) -> None:
    op = SnapshotOperation(
        id=operation_id,
        kind=kind,
        from_tip_id=snap.tip_id,
        status=snapshot_pb2.OPERATION_STATUS_OPEN,
    )
    if started_time_source.HasField("started_time"):
        op.started_time.CopyFrom(started_time_source.started_time)
    snap.operation.CopyFrom(op)


# --- operations -----------------------------------------------------------------------------


def _run_start(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.run_start
    _open_operation(snap, body.run_id, snapshot_pb2.OPERATION_KIND_RUN, body)


def _compaction_start(snap: LaneSnapshot, event: HarnessEvent) -> None:
    if snap.HasField("operation"):
        return
    body = event.compaction_start
    _open_operation(snap, body.run_id, snapshot_pb2.OPERATION_KIND_COMPACTION, body)


def _navigation_start(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.navigation_start
    _open_operation(snap, body.run_id, snapshot_pb2.OPERATION_KIND_NAVIGATION, body)


def _operation_abort(snap: LaneSnapshot, event: HarnessEvent) -> None:
    op = _matching(snap, event.operation_abort.operation_id)
    if op is not None:
        op.status = snapshot_pb2.OPERATION_STATUS_ABORTING


def _run_resume(snap: LaneSnapshot, event: HarnessEvent) -> None:
    op = _matching(snap, event.run_resume.run_id)
    if op is not None:
        op.ClearField("deferred")


def _run_suspend(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.run_suspend
    op = _matching(snap, body.run_id)
    if op is not None:
        op.ClearField("streaming_message")
        op.deferred.CopyFrom(body.deferred)


def _close_operation(
    snap: LaneSnapshot,
    op: SnapshotOperation,
    body: events_pb2.RunEndEvent | events_pb2.CompactionEndEvent,
    *,
    from_tip_id: str,
    tip_id: str,
) -> None:
    """Record the ended operation as the lane's last result and close it."""
    result = snapshot_pb2.OperationResult(
        operation_id=body.run_id,
        kind=op.kind,
        status=body.status,
        from_tip_id=from_tip_id,
        tip_id=tip_id,
    )
    if body.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED and body.HasField("error"):
        result.error.CopyFrom(body.error)
    if op.HasField("started_time"):
        result.started_time.CopyFrom(op.started_time)
    if body.HasField("ended_time"):
        result.ended_time.CopyFrom(body.ended_time)
    snap.last_result.CopyFrom(result)
    snap.ClearField("operation")


def _run_end(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.run_end
    op = _matching(snap, body.run_id)
    if op is None or op.kind != snapshot_pb2.OPERATION_KIND_RUN:
        return
    _close_operation(snap, op, body, from_tip_id=body.from_tip_id, tip_id=body.tip_id)
    snap.tip_id = body.tip_id


def _compaction_end(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.compaction_end
    op = _matching(snap, body.run_id)
    if op is None or op.kind != snapshot_pb2.OPERATION_KIND_COMPACTION:
        return
    _close_operation(snap, op, body, from_tip_id=op.from_tip_id, tip_id=snap.tip_id)


def _navigation_end(snap: LaneSnapshot, event: HarnessEvent) -> None:
    # The rebase signal is returned by fold_into; the snapshot itself does not change.
    return


# --- retries, streaming ---------------------------------------------------------------------


def _retry_scheduled(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.retry_scheduled
    op = _matching(snap, body.run_id)
    if op is None:
        return
    retry = snapshot_pb2.RetryState(
        attempt=body.attempt, max_attempts=body.max_attempts, error_message=body.error_message
    )
    if body.HasField("not_before_time"):
        retry.next_attempt_time.CopyFrom(body.not_before_time)
    op.retry.CopyFrom(retry)


def _retry_start(snap: LaneSnapshot, event: HarnessEvent) -> None:
    op = _matching(snap, event.retry_start.run_id)
    if op is not None:
        op.ClearField("retry")


def _retry_end(snap: LaneSnapshot, event: HarnessEvent) -> None:
    op = _matching(snap, event.retry_end.run_id)
    if op is not None:
        op.ClearField("retry")


def _message_start(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.message_start
    if not body.HasField("run_id") or body.message.WhichOneof("message") != "assistant":
        return
    if body.message.assistant.stop_reason != messages_pb2.STOP_REASON_PENDING:
        return
    op = _matching(snap, body.run_id)
    if op is not None:
        op.streaming_message.CopyFrom(body.message.assistant)


def _message_update(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.message_update
    op = _matching(snap, body.run_id)
    if op is not None:
        op.streaming_message.CopyFrom(body.message)


def _message_end(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.message_end
    if not body.HasField("run_id"):
        return
    op = _matching(snap, body.run_id)
    if op is not None:
        op.ClearField("streaming_message")


# --- tools ----------------------------------------------------------------------------------


def _tool_start(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.tool_start
    op = _matching(snap, body.run_id)
    if op is None:
        return
    row = snapshot_pb2.SnapshotTool(
        running=snapshot_pb2.RunningTool(
            tool_call_id=body.tool_call_id,
            tool_name=body.tool_name,
            arguments_json=body.arguments_json,
        )
    )
    index = _tool_index(op, body.tool_call_id)
    if index is None:
        op.running_tools.add().CopyFrom(row)
    else:
        op.running_tools[index].CopyFrom(row)


def _tool_update(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.tool_update
    op = _matching(snap, body.run_id)
    if op is None:
        return
    index = _tool_index(op, body.tool_call_id)
    if index is None:
        return
    row = op.running_tools[index]
    if row.WhichOneof("state") != "running":
        return
    if body.HasField("partial_result"):
        row.running.result.CopyFrom(body.partial_result)
    else:
        row.running.ClearField("result")


def _tool_end(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.tool_end
    op = _matching(snap, body.run_id)
    if op is None:
        return
    index = _tool_index(op, body.tool_call_id)
    if index is None:
        return
    row = op.running_tools[index]
    if row.WhichOneof("state") == "running":
        arguments_json = row.running.arguments_json
    else:
        arguments_json = row.settled.arguments_json
    settled = snapshot_pb2.SettledTool(
        tool_call_id=body.tool_call_id,
        tool_name=body.tool_name,
        arguments_json=arguments_json,
        is_error=body.is_error,
    )
    settled.result.CopyFrom(body.result)  # a settled row always has a result
    row.settled.CopyFrom(settled)  # switches the oneof from running to settled


# --- transcript, queues, stats, configuration -------------------------------------------------


def _entry_added(snap: LaneSnapshot, event: HarnessEvent) -> None:
    body = event.entry_added
    if not body.HasField("entry"):
        return
    entry = body.entry
    payload = entry.WhichOneof("payload")
    if (
        payload == "message"
        and entry.message.message.WhichOneof("message") == "tool_result"
        and snap.HasField("operation")
    ):
        index = _tool_index(snap.operation, entry.message.message.tool_result.tool_call_id)
        if index is not None:
            del snap.operation.running_tools[index]
    if payload == "compaction":
        del snap.transcript[:]
    snap.transcript.add().CopyFrom(entry)
    snap.tip_id = entry.id
    if payload == "message":
        snap.stats.message_count += 1


def _queue_update(snap: LaneSnapshot, event: HarnessEvent) -> None:
    del snap.queues[:]
    snap.queues.extend(event.queue_update.queues)


def _usage(snap: LaneSnapshot, event: HarnessEvent) -> None:
    snap.stats.usage.CopyFrom(event.usage.totals)


def _config_update(snap: LaneSnapshot, event: HarnessEvent) -> None:
    if not event.lane_id:
        return  # global settings: nothing of a lane snapshot
    body = event.config_update
    config = snap.configuration
    if body.HasField("model"):
        if body.model.HasField("value"):
            config.model.CopyFrom(body.model.value)
        else:
            config.ClearField("model")
    if body.HasField("thinking_level"):
        config.thinking_level = body.thinking_level.value
    if body.HasField("active_tools"):
        del config.active_tool_names[:]
        config.active_tool_names.extend(body.active_tools.value)


def _fault(snap: LaneSnapshot, event: HarnessEvent) -> None:
    snap.faulted = True


def _no_change(snap: LaneSnapshot, event: HarnessEvent) -> None:
    return


_Handler = Callable[[snapshot_pb2.LaneSnapshot, events_pb2.HarnessEvent], None]

_HANDLERS: Final[dict[str, _Handler]] = {
    "run_start": _run_start,
    "run_resume": _run_resume,
    "run_suspend": _run_suspend,
    "operation_abort": _operation_abort,
    "run_end": _run_end,
    "fault": _fault,
    "handler_error": _no_change,
    "turn_start": _no_change,
    "turn_end": _no_change,
    "retry_scheduled": _retry_scheduled,
    "retry_start": _retry_start,
    "retry_end": _retry_end,
    "message_start": _message_start,
    "message_update": _message_update,
    "message_end": _message_end,
    "tool_start": _tool_start,
    "tool_update": _tool_update,
    "tool_end": _tool_end,
    "entry_added": _entry_added,
    "queue_update": _queue_update,
    "value_update": _no_change,
    "config_update": _config_update,
    "compaction_start": _compaction_start,
    "compaction_end": _compaction_end,
    "navigation_start": _navigation_start,
    "navigation_end": _navigation_end,
    "lane_created": _no_change,
    "usage": _usage,
}

#: Every event kind of the ``HarnessEvent.kind`` oneof this reducer knows.
EVENT_KINDS: Final[frozenset[str]] = frozenset(_HANDLERS)
