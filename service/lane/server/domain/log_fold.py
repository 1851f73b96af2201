"""An imported lane's event log, folded and checked against its lane record and its rows.

The service keeps "fold equals capture" (docs/contract.md): folding a lane's events with the
contract's reducer (``lane.client.reducer``, checked by tests/conformance) gives the lane's
snapshot. An imported lane must keep it too, so its log is folded here, event by event, with
that reducer — and more strictly than a client folds, since the log is the file's claim about
a lane the service never ran:

* an event of an operation (run_end, tool_end, operation_abort, ...) must name the operation
  open at that point, and a tool_end or tool_update a call that was started: a client's
  reducer ignores such a ghost, a service never writes one;
* an operation starts only while none is open (an in-run compaction bracket excepted);
* each entry_added carries an entry of the file, at its seq, with the same content, following
  the tip of that point (a navigation's branch summary: its target), once; each usage event one
  usage row of the file, likewise;
* at the end no operation is open, and the tip, inbox, configuration, usage totals, faulted
  flag, message count and last result (if the record has one: an imported lane has none) are
  the lane record's.

A log that starts above a retention floor is folded from a lane the file does not describe:
the fields no kept event sets are taken from the record, the tip is checked from the first
event that sets it, an operation open at the floor is taken from the first event naming it
(its calls are not checked), and the message count may exceed what the kept log adds.

Only the state a capture holds besides its transcript is kept (the transcript is checked
entry by entry as above, not held), so folding costs memory for the lane's live state only.
"""

from __future__ import annotations

from google.protobuf.message import Message
from lane.client.reducer import fold_into
from lane.v1 import events_pb2, snapshot_pb2

from lane.server.domain.export_format import ExportHead, invalid
from lane.server.domain.row_index import RowIndex

_RUN = snapshot_pb2.OPERATION_KIND_RUN
_COMPACTION = snapshot_pb2.OPERATION_KIND_COMPACTION
_NAVIGATION = snapshot_pb2.OPERATION_KIND_NAVIGATION
#: Events of an operation, which must name the open one (operation_abort: ``operation_id``).
_OF_OPERATION = frozenset(
    {
        "run_end",
        "compaction_end",
        "navigation_end",
        "operation_abort",
        "run_suspend",
        "run_resume",
        "retry_scheduled",
        "retry_start",
        "retry_end",
        "message_update",
        "tool_start",
        "tool_update",
        "tool_end",
    }
)
#: The kinds of operation each end event ends (compaction_end of a run: an in-run bracket's).
_ENDS = {
    "run_end": (_RUN,),
    "navigation_end": (_NAVIGATION,),
    "compaction_end": (_COMPACTION, _RUN),
}
#: The kind an operation open at the retention floor has, from the first event naming it.
_KIND_ENDED_BY = {"compaction_end": _COMPACTION, "navigation_end": _NAVIGATION}


class LogFold:
    """Folds one file's event log (module docstring); :meth:`event` per event in order, then
    :meth:`finish`."""

    def __init__(self, head: ExportHead, entries: RowIndex, usage_rows: RowIndex) -> None:
        record = head.lane
        self._entries = entries
        self._usage_rows = usage_rows
        self._floor = head.retention_floor
        self._whole = head.retention_floor == 0
        snap = snapshot_pb2.LaneSnapshot(
            lane_id=head.lane_id, revision=head.retention_floor, configuration=record.configuration
        )
        if not self._whole:
            # What the events removed by retention set last: unknown, so the record's.
            snap.tip_id = record.tip_id
            snap.queues.extend(record.queues)
            snap.stats.usage.CopyFrom(record.stats.usage)
            snap.faulted = record.faulted
        self.snapshot = snap
        #: Whether the tip is known (from the start of the lane, or an event that set it).
        self._tip_known = self._whole
        #: Whether an operation may be open that no kept event started (above a floor).
        self._open_unknown = not self._whole
        #: The operation open at the floor: its calls are unknown.
        self._from_floor = ""
        #: The open navigation's target: its branch summary follows it, not the tip.
        self._target = ""

    def event(self, event: events_pb2.HarnessEvent, line: int) -> None:
        """Check ``event`` against the fold so far (refusing it, :func:`invalid`), then fold it."""
        kind = event.WhichOneof("kind")
        snap = self.snapshot
        where = f"event {event.revision} ({kind})"
        if kind in ("run_start", "navigation_start", "compaction_start"):
            self._starts(event, kind, line, where)
        elif kind in _OF_OPERATION:
            self._of_operation(event, kind, line, where)
        elif kind == "entry_added":
            self._entry_added(event, line, where)
        elif kind == "usage":
            self._usage(event, line, where)
        if kind == "navigation_end":
            self._navigation_end(event, line, where)
        else:
            fold_into(snap, event)
        # The transcript is checked entry by entry, not kept.
        del snap.transcript[:]

    def _starts(self, event: events_pb2.HarnessEvent, kind: str, line: int, where: str) -> None:
        snap = self.snapshot
        body = getattr(event, kind)
        if snap.HasField("operation"):
            operation = snap.operation
            # CompactRun brackets its entry with compaction_start/_end of the open run.
            in_run = kind == "compaction_start" and operation.kind == _RUN
            if not in_run or body.run_id != operation.id:
                raise invalid(line, f"{where} starts {body.run_id} while {operation.id} is open")
            return
        self._open_unknown = False
        if kind == "navigation_start":
            if body.target_id not in self._entries:
                raise invalid(line, f"{where} goes to {body.target_id!r}, no entry of the file")
            self._target = body.target_id

    def _of_operation(
        self, event: events_pb2.HarnessEvent, kind: str, line: int, where: str
    ) -> None:
        snap = self.snapshot
        body = getattr(event, kind)
        run_id = body.operation_id if kind == "operation_abort" else body.run_id
        if not snap.HasField("operation"):
            if not self._open_unknown:
                raise invalid(line, f"{where} names operation {run_id!r}, but none is open")
            # Above a retention floor: the operation was started before it.
            operation = snapshot_pb2.SnapshotOperation(
                id=run_id,
                kind=_KIND_ENDED_BY.get(kind, _RUN),
                status=snapshot_pb2.OPERATION_STATUS_OPEN,
            )
            snap.operation.CopyFrom(operation)
            self._open_unknown = False
            self._from_floor = run_id
            return
        operation = snap.operation
        if operation.id != run_id:
            raise invalid(line, f"{where} names operation {run_id!r}, but {operation.id} is open")
        ends = _ENDS.get(kind)
        if ends is not None and operation.kind not in ends:
            raise invalid(line, f"{where} cannot end operation {run_id}, which is not of its kind")
        if kind in ("tool_update", "tool_end") and operation.id != self._from_floor:
            state = _tool_state(operation, body.tool_call_id)
            if state is None:
                raise invalid(line, f"{where}: tool call {body.tool_call_id!r} was not started")
            if kind == "tool_update" and state != "running":
                raise invalid(line, f"{where}: tool call {body.tool_call_id!r} has settled")

    def _entry_added(self, event: events_pb2.HarnessEvent, line: int, where: str) -> None:
        body = event.entry_added
        if not body.HasField("entry"):
            raise invalid(line, f"{where} carries no entry")
        entry = body.entry
        _claim(self._entries, "entry", entry.id, entry.seq, entry, event.revision, line, where)
        snap = self.snapshot
        navigating = snap.HasField("operation") and snap.operation.kind == _NAVIGATION
        follows = self._target if navigating else snap.tip_id
        if self._tip_known and entry.parent_id != follows:
            raise invalid(
                line,
                f"{where}: entry {entry.id} follows {entry.parent_id!r}, but the tip is "
                f"{follows!r} then",
            )
        self._tip_known = True

    def _usage(self, event: events_pb2.HarnessEvent, line: int, where: str) -> None:
        row = event.usage.row
        _claim(self._usage_rows, "usage row", row.id, row.seq, row, event.revision, line, where)

    def _navigation_end(self, event: events_pb2.HarnessEvent, line: int, where: str) -> None:
        """What a client gets by re-snapshotting after navigation_end (the reducer leaves the
        lane to that): the navigation's result recorded, the tip moved, no operation."""
        body = event.navigation_end
        if body.tip_id and body.tip_id not in self._entries:
            raise invalid(line, f"{where} moves the tip to {body.tip_id!r}, no entry of the file")
        snap = self.snapshot
        result = snapshot_pb2.OperationResult(
            operation_id=body.run_id,
            kind=_NAVIGATION,
            status=body.status,
            from_tip_id=body.from_tip_id,
            tip_id=body.tip_id,
        )
        if snap.operation.HasField("started_time"):
            result.started_time.CopyFrom(snap.operation.started_time)
        if body.HasField("ended_time"):
            result.ended_time.CopyFrom(body.ended_time)
        if body.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED and body.HasField("error"):
            result.error.CopyFrom(body.error)
        snap.last_result.CopyFrom(result)
        snap.ClearField("operation")
        snap.tip_id = body.tip_id
        if event.lane_id:
            snap.revision = event.revision
        self._tip_known = True

    def finish(self, record: snapshot_pb2.LaneSnapshot) -> None:
        """Refuse a log that does not end in ``record`` (the file's lane record)."""
        snap = self.snapshot
        if snap.HasField("operation"):
            raise invalid(0, f"the event log leaves operation {snap.operation.id} open")
        if snap.tip_id != record.tip_id:
            raise invalid(
                0, f"the lane's tip is {record.tip_id!r}, but its events end at {snap.tip_id!r}"
            )
        differing = [
            name
            for name, folded, recorded in (
                ("inbox", list(snap.queues), list(record.queues)),
                ("configuration", snap.configuration, record.configuration),
                ("usage totals", snap.stats.usage, record.stats.usage),
                ("faulted flag", snap.faulted, record.faulted),
            )
            if folded != recorded
        ]
        folded_count, count = snap.stats.message_count, record.stats.message_count
        if folded_count != count and (self._whole or folded_count > count):
            differing.append("message count")
        # A record without a last result is an imported lane's (its operations kept their ids
        # in the lane it came from), whose log still ends them: its own export imports too.
        recorded_result = _last_result(record)
        if self._whole and recorded_result is not None and _last_result(snap) != recorded_result:
            differing.append("last result")
        if differing:
            raise invalid(0, f"the lane's {', '.join(differing)} differ from what its events make")
        for rows, what in ((self._entries, "entry"), (self._usage_rows, "usage row")):
            at = rows.first_not_added(self._floor)
            if at is not None:
                raise invalid(
                    0, f"{what} {rows.row_id(at)} (seq {rows.seq(at)}) is added by no event"
                )


def _claim(
    rows: RowIndex,
    what: str,
    row_id: str,
    seq: int,
    row: Message,
    revision: int,
    line: int,
    where: str,
) -> None:
    """Mark the file's row ``row_id`` added by the event at ``revision``, which carries it as
    ``row``: refused unless the file holds it, at that seq, with that content, not yet added."""
    at = rows.find(row_id)
    if at is None:
        raise invalid(line, f"{where} adds {what} {row_id!r}, which the file does not hold")
    if rows.seq(at) != revision or seq != revision:
        raise invalid(line, f"{where} adds {what} {row_id} at another seq than its own")
    if not rows.same_content(at, row):
        raise invalid(line, f"{where} adds {what} {row_id} with other content than its record")
    if not rows.mark_added(at):
        raise invalid(line, f"{where} adds {what} {row_id} a second time")


def _tool_state(operation: snapshot_pb2.SnapshotOperation, tool_call_id: str) -> str | None:
    """The state of the operation's row of ``tool_call_id`` (None: it has none)."""
    for row in operation.running_tools:
        state = row.WhichOneof("state")
        if state is not None and getattr(row, state).tool_call_id == tool_call_id:
            return state
    return None


def _last_result(
    snapshot: snapshot_pb2.LaneSnapshot,
) -> snapshot_pb2.OperationResult | None:
    return snapshot.last_result if snapshot.HasField("last_result") else None
