"""What must hold for a lane after any number of kill -9s (docs/contract.md: invariant 4, Targets).

:func:`check_lane` reads the lane's whole event log and its ``crash_executions`` rows from the
database, its capture through GetLaneSnapshot, and returns :class:`LaneFindings`: the recovery
paths that happened and every violation found:

(a) no staged result lost: every call that emitted tool_end has exactly one toolResult entry in
    the transcript, whose content is the staged result;
(b) nothing placed twice: entry ids unique, each assistant message's calls followed by exactly
    their results in source order, one tool_end per call;
(c) no unsafe replay: a NEVER call executed at most once and started once; a SAFE call started
    again only by a recovery-tagged ReplayToolCall with the persisted arguments;
(d) every operation ended, with its result recorded;
(e) a watcher's fold equals the capture (when the caller hands one in);
(f) docs/recovery.md's cases: a call staged before a takeover is placed and never executed
    again; an effect_pending call at a takeover is either replayed (SAFE) or interrupted — a
    recovery-tagged tool_end with no new tool_start, carrying its latest checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import grpc
import psycopg
from lane.v1 import events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from lane.server.domain.leases import grants
from tests.crash.recording import replay_of

SAFE = lane_service_pb2.REPLAY_POLICY_SAFE
#: The marker the service appends to an interruption result (service/lane/server/domain/results.py).
INTERRUPTED_MARKER = "[interrupted]"
#: Failures a checker's read retries: a service being killed or restarted (its channel may
#: still be backing off), and INTERNAL — a service bug, reported from the service's log.
RETRIED = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}
)


@dataclass
class RecoveryCounts:
    """Counts of the runs and the recovery paths seen: on one lane (:class:`LaneFindings`), or
    summed over a harness run (its report)."""

    runs_ended: int = 0
    runs_completed: int = 0
    runs_aborted: int = 0
    parallel_runs: int = 0
    sequential_runs: int = 0
    #: Acquisitions after a run's first lease (from the fencing tokens).
    takeovers: int = 0
    #: Takeovers of a run in the middle of a tool batch (turn_start tagged recovery).
    batch_takeovers: int = 0
    #: Re-executions started by ReplayToolCall.
    replays: int = 0
    #: Interruption results (driver-staged after a takeover, or written by EndRun/reconcile).
    interruptions: int = 0
    #: Runs the service ended by itself (run_end tagged recovery).
    reconciliations: int = 0
    #: Calls outcome_ready at a takeover (placed later, never executed again).
    staged_at_takeover: int = 0
    #: effect_pending NEVER (or unreplayed SAFE) calls at a takeover that got an interruption.
    unsafe_recoveries: int = 0
    calls: int = 0
    executions: int = 0

    def add_counts(self, other: RecoveryCounts) -> None:
        """Add every count of ``other`` to this one's."""
        for counter in fields(RecoveryCounts):
            setattr(self, counter.name, getattr(self, counter.name) + getattr(other, counter.name))


@dataclass
class LaneFindings(RecoveryCounts):
    """Counts of the recovery paths seen on one lane, and the violations."""

    # Keyword-only: a field without a default may not follow the counts' defaulted ones.
    lane_id: str = field(kw_only=True)
    violations: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.violations.append(f"{self.lane_id}: {problem}")


@dataclass
class CallTrace:
    """Everything the event log says about one tool call."""

    call_id: str
    tool_name: str = ""
    run_id: str = ""
    turn_id: str = ""
    starts: list[events_pb2.HarnessEvent] = field(default_factory=list)
    updates: list[events_pb2.HarnessEvent] = field(default_factory=list)
    ends: list[events_pb2.HarnessEvent] = field(default_factory=list)
    placed: list[events_pb2.HarnessEvent] = field(default_factory=list)


@dataclass
class Loaded:
    events: list[events_pb2.HarnessEvent]
    group_end: dict[int, int]
    commit_time: dict[int, datetime]
    operations: list[tuple[str, str, bool, int]]
    sequential: list[bool]
    executions: dict[str, list[tuple[int, datetime, bool]]]
    lane_revision: int


async def load(conn: psycopg.AsyncConnection[Any], lane_id: str) -> Loaded:
    """The lane's events, operations and executions as stored."""
    cur = await conn.execute(
        "SELECT revision, group_end, body, commit_time FROM events WHERE lane_id = %s"
        " ORDER BY revision",
        (lane_id,),
    )
    events: list[events_pb2.HarnessEvent] = []
    group_end: dict[int, int] = {}
    commit_time: dict[int, datetime] = {}
    for revision, end, body, at in await cur.fetchall():
        events.append(events_pb2.HarnessEvent.FromString(bytes(body)))
        group_end[revision] = end
        commit_time[revision] = at
    cur = await conn.execute(
        "SELECT operation_id, phase, result IS NOT NULL, lease_token, settings FROM operations"
        " WHERE lane_id = %s ORDER BY started_time",
        (lane_id,),
    )
    rows = await cur.fetchall()
    operations = [(str(a), str(b), bool(c), int(d)) for a, b, c, d, _ in rows]
    sequential = [
        lane_service_pb2.RunSettings.FromString(bytes(e)).tool_execution
        == lane_service_pb2.TOOL_EXECUTION_SEQUENTIAL
        for *_, e in rows
    ]
    executions: dict[str, list[tuple[int, datetime, bool]]] = defaultdict(list)
    # The driver creates the table; a lane on which no tool ever ran may precede it.
    with contextlib.suppress(psycopg.errors.UndefinedTable):
        cur = await conn.execute(
            "SELECT tool_call_id, attempt_no, started_at, replayed FROM crash_executions"
            " WHERE lane_id = %s ORDER BY started_at",
            (lane_id,),
        )
        for call_id, attempt, started, replayed in await cur.fetchall():
            executions[call_id].append((attempt, started, replayed))
    cur = await conn.execute("SELECT revision FROM lanes WHERE lane_id = %s", (lane_id,))
    row = await cur.fetchone()
    return Loaded(
        events,
        group_end,
        commit_time,
        operations,
        sequential,
        dict(executions),
        row[0] if row else -1,
    )


async def snapshot_of(stub: Any, lane_id: str, *, within: float = 60) -> snapshot_pb2.LaneSnapshot:
    """GetLaneSnapshot, retried while the service is down or restarting (or answers INTERNAL,
    a service bug the harness reports from the service's log instead)."""
    stubs = list(stub) if isinstance(stub, list | tuple) else [stub]
    deadline = time.monotonic() + within
    attempt = 0
    request = lane_service_pb2.GetLaneSnapshotRequest(lane_id=lane_id)
    while True:
        try:
            answer = await stubs[attempt % len(stubs)].GetLaneSnapshot(request, timeout=10)
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRIED or time.monotonic() > deadline:
                raise
            attempt += 1
            await asyncio.sleep(0.1)
            continue
        snapshot: snapshot_pb2.LaneSnapshot = answer.snapshot
        return snapshot


def _text_of(content: Any) -> list[str]:
    return [block.text.text for block in content]


def _is_interruption(result: messages_pb2.ToolResult) -> bool:
    return bool(result.content) and result.content[-1].text.text.startswith(INTERRUPTED_MARKER)


def traces(events: list[events_pb2.HarnessEvent]) -> dict[str, CallTrace]:
    """Per tool call id (ids are unique across the lane), its lifecycle events."""
    found: dict[str, CallTrace] = {}

    def trace(call_id: str) -> CallTrace:
        return found.setdefault(call_id, CallTrace(call_id))

    for event in events:
        kind = event.WhichOneof("kind")
        if kind in ("tool_start", "tool_update", "tool_end"):
            body = getattr(event, kind)
            t = trace(body.tool_call_id)
            t.tool_name, t.run_id, t.turn_id = body.tool_name, body.run_id, body.turn_id
            {"tool_start": t.starts, "tool_update": t.updates, "tool_end": t.ends}[kind].append(
                event
            )
        elif kind == "entry_added":
            message = event.entry_added.entry.message.message
            if message.WhichOneof("message") == "tool_result":
                trace(message.tool_result.tool_call_id).placed.append(event)
    return found


async def check_lane(
    conn: psycopg.AsyncConnection[Any],
    stub: Any,
    lane_id: str,
    watcher_snapshot: snapshot_pb2.LaneSnapshot | None = None,
) -> LaneFindings:
    """Check every invariant on ``lane_id``; the lane must be quiet (all runs ended)."""
    findings = LaneFindings(lane_id=lane_id)
    data = await load(conn, lane_id)
    snapshot = await snapshot_of(stub, lane_id)
    events = data.events

    # The log itself: revisions 1..head without a gap, as far as the capture.
    revisions = [e.revision for e in events]
    if revisions != list(range(1, len(events) + 1)):
        findings.fail(f"event revisions are not 1..{len(events)} without gaps")
    if snapshot.revision != data.lane_revision or (events and revisions[-1] != snapshot.revision):
        findings.fail(
            f"capture revision {snapshot.revision}, lane row {data.lane_revision}, "
            f"last event {revisions[-1] if revisions else 0}"
        )
    if snapshot.faulted or any(e.WhichOneof("kind") == "fault" for e in events):
        findings.fail("the lane faulted")

    # (e) the watcher converged.
    if watcher_snapshot is not None and watcher_snapshot != snapshot:
        findings.fail(
            f"watcher fold at revision {watcher_snapshot.revision} != capture at "
            f"{snapshot.revision}"
        )

    # (d) every operation ended.
    if snapshot.HasField("operation"):
        findings.fail(f"operation {snapshot.operation.id} is still open")
    if data.operations and not snapshot.HasField("last_result"):
        findings.fail("no last_result although runs ended")
    for operation_id, phase, has_result, lease_token in data.operations:
        if phase != "ended" or not has_result:
            findings.fail(f"operation {operation_id} not ended (phase {phase})")
        findings.takeovers += max(grants(lease_token) - 1, 0)
    findings.sequential_runs = sum(data.sequential)
    findings.parallel_runs = len(data.sequential) - findings.sequential_runs
    run_ends = [e for e in events if e.WhichOneof("kind") == "run_end"]
    findings.runs_ended = len(run_ends)
    if len(run_ends) != len(data.operations):
        findings.fail(f"{len(run_ends)} run_end events for {len(data.operations)} operations")
    for event in run_ends:
        status = event.run_end.status
        findings.runs_completed += status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
        findings.runs_aborted += status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
        if event.recovery:
            findings.reconciliations += 1
            if status != snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED:
                findings.fail(f"reconciled run {event.run_end.run_id} ended {status}")
            group = [
                e for e in events if data.group_end[e.revision] == data.group_end[event.revision]
            ]
            if not all(e.recovery for e in group):
                findings.fail(f"reconciliation of {event.run_end.run_id}: untagged events")

    calls = traces(events)
    findings.calls = len(calls)
    _check_transcript(findings, snapshot, calls)
    for trace in calls.values():
        _check_call(findings, trace, data, events)
    _check_takeovers(findings, calls, data, events)
    return findings


def _check_transcript(
    findings: LaneFindings, snapshot: snapshot_pb2.LaneSnapshot, calls: dict[str, CallTrace]
) -> None:
    """(a) and (b), from the capture's transcript."""
    transcript = list(snapshot.transcript)
    ids = [entry.id for entry in transcript]
    if len(ids) != len(set(ids)):
        findings.fail("an entry id appears twice in the transcript")
    results: dict[str, list[messages_pb2.ToolResultMessage]] = defaultdict(list)
    for index, entry in enumerate(transcript):
        message = entry.message.message if entry.WhichOneof("payload") == "message" else None
        if message is None:
            continue
        kind = message.WhichOneof("message")
        if kind == "tool_result":
            results[message.tool_result.tool_call_id].append(message.tool_result)
        if kind != "assistant":
            continue
        asked = [
            block.tool_call.id
            for block in message.assistant.content
            if block.WhichOneof("block") == "tool_call"
        ]
        placed = []
        for later in transcript[index + 1 :]:
            inner = later.message.message if later.WhichOneof("payload") == "message" else None
            if inner is None or inner.WhichOneof("message") != "tool_result":
                break
            placed.append(inner.tool_result.tool_call_id)
        if placed != asked:
            findings.fail(f"assistant {entry.id} asked for {asked}, transcript holds {placed}")
    for call_id, trace in calls.items():
        if not trace.ends:
            continue
        placed_results = results.get(call_id, [])
        if len(placed_results) != 1:
            findings.fail(f"{call_id}: {len(placed_results)} toolResult entries (want 1)")
            continue
        staged = trace.ends[-1].tool_end
        placed_result = placed_results[0]
        if _text_of(placed_result.content) != _text_of(staged.result.content) or (
            placed_result.is_error != staged.is_error
        ):
            findings.fail(f"{call_id}: the placed result differs from the staged one")
    for call_id in results:
        if call_id not in calls or not calls[call_id].ends:
            findings.fail(f"{call_id}: a toolResult entry without tool_end")


def _check_call(
    findings: LaneFindings,
    trace: CallTrace,
    data: Loaded,
    events: list[events_pb2.HarnessEvent],
) -> None:
    """One tool_end, nothing after it, replays only for SAFE calls, executions bounded."""
    call_id = trace.call_id
    replay = replay_of(trace.tool_name)
    runs = data.executions.get(call_id, [])
    findings.executions += len(runs)
    if len(trace.ends) != 1:
        findings.fail(f"{call_id}: {len(trace.ends)} tool_end events (want exactly 1)")
        return
    end = trace.ends[0]
    if len(trace.placed) != 1 or trace.placed[0].revision <= end.revision:
        findings.fail(f"{call_id}: placed {len(trace.placed)} times (want once, after staging)")
    if not trace.starts or trace.starts[0].revision > end.revision:
        findings.fail(f"{call_id}: tool_end without an earlier tool_start")
        return
    later = [e.revision for e in trace.starts + trace.updates if e.revision > end.revision]
    if later:
        findings.fail(f"{call_id}: tool_start/tool_update at {later} after tool_end {end.revision}")
    first_args = trace.starts[0].tool_start.arguments_json
    for again in trace.starts[1:]:
        findings.replays += 1
        if replay != SAFE:
            findings.fail(f"{call_id} (NEVER) started again at revision {again.revision}")
        if not again.recovery or again.tool_start.arguments_json != first_args:
            findings.fail(f"{call_id}: replay at {again.revision} untagged or with other args")
    # (c) executions.
    if replay != SAFE and len(runs) > 1:
        findings.fail(f"{call_id} (NEVER) executed {len(runs)} times")
    if len(runs) > len(trace.starts):
        findings.fail(f"{call_id}: {len(runs)} executions for {len(trace.starts)} tool_starts")
    staged = end.tool_end
    if not staged.is_error and not runs:
        findings.fail(f"{call_id}: an executed result without any execution")
    if _is_interruption(staged.result):
        findings.interruptions += 1
        # The interruption carries the latest checkpoint since the last (re)start.
        since = trace.starts[-1].revision
        checkpoints = [
            u.tool_update.partial_result
            for u in trace.updates
            if since < u.revision < end.revision and u.tool_update.checkpoint
        ]
        expected = _text_of(checkpoints[-1].content) if checkpoints else []
        if _text_of(staged.result.content)[:-1] != expected:
            findings.fail(
                f"{call_id}: interruption content {_text_of(staged.result.content)[:-1]} is not "
                f"the latest checkpoint {expected}"
            )


def _check_takeovers(
    findings: LaneFindings,
    calls: dict[str, CallTrace],
    data: Loaded,
    events: list[events_pb2.HarnessEvent],
) -> None:
    """(f): what a takeover in the middle of a batch must do to each of its calls."""
    for takeover in events:
        if takeover.WhichOneof("kind") != "turn_start" or not takeover.recovery:
            continue
        findings.batch_takeovers += 1
        at = takeover.revision
        taken_time = data.commit_time[at]
        turn_id = takeover.turn_start.turn_id
        for trace in calls.values():
            if trace.turn_id != turn_id or not trace.ends:
                continue
            end = trace.ends[0]
            started = [s for s in trace.starts if s.revision < at]
            if end.revision < at:
                if trace.placed and trace.placed[0].revision < at:
                    continue  # completed before the takeover
                findings.staged_at_takeover += 1
                again = [
                    row for row in data.executions.get(trace.call_id, []) if row[1] > taken_time
                ]
                if again:
                    findings.fail(
                        f"{trace.call_id}: outcome_ready at the takeover (revision {at}) but "
                        f"executed again {len(again)} times"
                    )
                continue
            if not started:
                continue  # planned at the takeover: an ordinary start follows
            restarts = [s for s in trace.starts if at < s.revision < end.revision]
            end_group = [
                e for e in events if data.group_end[e.revision] == data.group_end[end.revision]
            ]
            driver_end_run = any(
                e.WhichOneof("kind") == "run_end" and not e.recovery for e in end_group
            )
            if not end.recovery and not driver_end_run:
                findings.fail(f"{trace.call_id}: tool_end after the takeover is not tagged")
            if restarts:
                if replay_of(trace.tool_name) != SAFE:
                    findings.fail(f"{trace.call_id} (NEVER) restarted after the takeover {at}")
                continue
            if not _is_interruption(end.tool_end.result):
                findings.fail(
                    f"{trace.call_id}: effect_pending at the takeover {at}, neither replayed "
                    "nor interrupted"
                )
                continue
            findings.unsafe_recoveries += 1
