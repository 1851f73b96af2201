"""The service's own SQL for one lifecycle run, as a pgbench script (``--replay`` of
:mod:`bench.commit_throughput`).

:func:`record` runs the domain functions in this process, as the commands do, on a lane
state kept in memory, and turns each transition into its commit statement with the store's
own :func:`~lane.server.store.lane_writes.commit_statement` (the optimistic path: one statement per
commit, the version check of the lane row included). The run is the drivers' run: StartRun;
per turn StartTurn, SettleAssistantMessage with C tool calls, and per call StartToolCall,
UpdateToolCall, UpdateToolCall (checkpoint), StageToolOutcome (staging, then placement); a
final StartTurn and text-only SettleAssistantMessage; EndRun. The requests are built by the
same functions the drivers use (:func:`prompt_message`, :func:`assistant_message`, ...).

Statements recorded are those of the lane's **second** run (the steady state: the lane has a
tip and a last operation, as every run after a driver's first). pgbench replays them with no
Python in the loop. Each pgbench transaction (one run of the script) creates a lane of its own
in a namespace of its own and then runs the 114 statements on it, each in autocommit, as the
optimistic path does. That keeps every key unique without changing a single value but the
namespace: revisions, versions, entry ids and operation ids are those of the recorded run, and
only the namespace (``:ns``, a number per client and run) differs between runs.

:func:`replay_script` makes each parameter a pgbench variable (``-D`` for the recorded values,
``\\set`` for the namespace; a null is written ``NULL``), and pgbench runs in ``-M prepared``
mode, so PostgreSQL parses and plans each statement once per connection and then executes it
with parameters, as it does for the service (psycopg prepares a statement on a connection
after its first few executions: ``prepare_threshold``, 5 by default).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.domain import lanes, placement, runs, tools
from lane.server.domain.ids import new_id
from lane.server.domain.run_inputs import Executed, RunSettings
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store.lane_ref import LaneRef
from lane.server.store.lane_writes import CommitStatement, commit_statement, insert_lane

# -- the drivers' requests (bench.commit_throughput.Driver sends exactly these) ---------------

#: StartToolCall's effective arguments.
START_ARGUMENTS = '{"cmd": "ls", "n": 1, "cwd": "/tmp"}'
#: The arguments each tool call block of the assistant message carries.
CALL_ARGUMENTS = '{"cmd": "ls", "n": 1}'


def text_block(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def tool_result(value: str) -> messages_pb2.ToolResult:
    return messages_pb2.ToolResult(content=[text_block(value)])


def prompt_message(run_no: int) -> messages_pb2.AgentMessage:
    """StartRun's prompt of run ``run_no``."""
    return messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(content=[text_block(f"run {run_no}: go")])
    )


def call_ids(run_no: int, turn_no: int, calls: int) -> list[str]:
    """The tool call ids of a tool turn."""
    return [f"r{run_no}t{turn_no}c{i}" for i in range(calls)]


def assistant_message(calls: Sequence[str]) -> messages_pb2.AssistantMessage:
    """The settled assistant message of a turn: text and the tool calls, or text only."""
    blocks = [text_block("calling tools" if calls else "all done")]
    blocks += [
        messages_pb2.ContentBlock(
            tool_call=messages_pb2.ToolCallContent(
                id=call, name="shell", arguments_json=CALL_ARGUMENTS
            )
        )
        for call in calls
    ]
    return messages_pb2.AssistantMessage(
        content=blocks,
        api="bench",
        provider="scripted",
        model="m1",
        stop_reason=messages_pb2.STOP_REASON_TOOL_USE if calls else messages_pb2.STOP_REASON_STOP,
    )


def partial_result(n: int) -> messages_pb2.ToolResult:
    """UpdateToolCall ``n``'s partial result (1, then 2 with checkpoint)."""
    return tool_result(f"line {n}")


def outcome_result(call: str) -> messages_pb2.ToolResult:
    """StageToolOutcome's executed result."""
    return tool_result(f"{call} done")


# -- recording a run's statements -------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """One commit of the run: the command (its RPC's name, ``/place`` for the placement) and
    its statement."""

    command: str
    statement: CommitStatement


@dataclass
class _Lane:
    """The lane as the store keeps it in memory: its state and its version."""

    ref: LaneRef
    state: LaneState
    version: int
    recorded: list[Recorded] = field(default_factory=list)

    def commit(self, command: str, step: Callable[[LaneState, datetime], Transition]) -> Transition:
        """Run ``step`` as the optimistic path does: decide on the kept state, write the
        difference with one statement checking the version."""
        transition = step(self.state, datetime.now(UTC))
        statement = commit_statement(self.ref, self.state, transition, self.version)
        if statement is None:
            raise RuntimeError(f"{command} wrote nothing: the bench's run must commit every time")
        self.recorded.append(Recorded(command, statement))
        self.state, self.version = transition.state, self.version + 1
        return transition


class _Captured:
    """Stands in for a connection: records the one ``execute`` of :func:`insert_lane`."""

    def __init__(self) -> None:
        self.statement: CommitStatement | None = None

    async def execute(self, query: str, params: dict[str, Any]) -> _Captured:
        self.statement = CommitStatement(query, dict(params))
        return self

    @property
    def rowcount(self) -> int:
        return 1


def _insert_statement(ref: LaneRef, state: LaneState) -> CommitStatement:
    """CreateLane's INSERT of the lane row, as :func:`insert_lane` sends it."""
    captured = _Captured()
    coroutine = insert_lane(cast(Any, captured), ref, state)
    try:
        coroutine.send(None)  # it awaits nothing but our execute: it finishes at once
    except StopIteration:
        pass
    else:
        coroutine.close()
        raise RuntimeError("insert_lane awaited something: cannot record its statement")
    assert captured.statement is not None
    return captured.statement


def _record_run(lane: _Lane, run_no: int, calls: int, turns: int) -> None:
    """One run of the drivers' lifecycle on ``lane``, every commit recorded."""
    operation_id = new_id()  # the service mints it (StartRun without operation_id)
    lane.commit(
        "StartRun",
        lambda s, now: runs.start_run(
            s, operation_id, [prompt_message(run_no)], RunSettings(), now, new_id, None
        ),
    )

    def tool_call(call: str) -> None:
        lane.commit(
            "StartToolCall",
            lambda s, now: tools.start_tool_call(
                s, operation_id, call, START_ARGUMENTS, pb.REPLAY_POLICY_NEVER, now, 0
            ),
        )

        def update(n: int, checkpoint: bool) -> None:
            lane.commit(
                "UpdateToolCall",
                lambda s, now: tools.update_tool_call(
                    s, operation_id, call, partial_result(n), checkpoint, now, 0
                ),
            )

        for n, checkpoint in ((1, False), (2, True)):
            update(n, checkpoint)
        outcome = Executed(result=outcome_result(call))
        lane.commit(
            "StageToolOutcome",
            lambda s, now: tools.stage_tool_outcome(s, operation_id, call, outcome, now, 0),
        )
        placed = lane.commit(
            "StageToolOutcome/place", lambda s, now: placement.place_ready(s, now, new_id)
        )
        if list(getattr(placed, "placed_tool_call_ids", ())) != [call]:
            raise RuntimeError(f"{call} was not placed at once")

    def turn(turn_calls: list[str]) -> None:
        turn_id = new_id()
        lane.commit("StartTurn", lambda s, now: runs.start_turn(s, operation_id, turn_id, now, 0))
        message = assistant_message(turn_calls)
        lane.commit(
            "SettleAssistantMessage",
            lambda s, now: runs.settle_assistant(s, operation_id, turn_id, message, now, new_id, 0),
        )
        for call in turn_calls:
            tool_call(call)

    for turn_no in range(turns):
        turn(call_ids(run_no, turn_no, calls))
    turn([])
    lane.commit(
        "EndRun",
        lambda s, now: runs.end_run(
            s,
            operation_id,
            snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
            None,
            now,
            new_id,
            lease_token=0,
        ),
    )


@dataclass(frozen=True)
class RecordedRun:
    """A lane's creation and one steady-state run, as statements."""

    #: CreateLane: the lane row's INSERT, then its first commit (one transaction).
    create: tuple[CommitStatement, CommitStatement]
    #: The run's commits, in order.
    run: tuple[Recorded, ...]
    #: The lane's revision after the run (its statements set the revisions the second run had).
    revision_after: int


#: The namespace every recorded statement names; pgbench puts ``:ns`` in its place.
_NAMESPACE = "bench-replay-namespace"


def record(lane_id: str, calls: int, turns: int) -> RecordedRun:
    """Record the creation of ``lane_id`` and its second run (see the module docstring)."""
    ref = LaneRef(_NAMESPACE, lane_id)
    created = lanes.create_lane(lane_id, snapshot_pb2.LaneConfiguration(), datetime.now(UTC))
    # The store inserts the row (revision 0, version 0), loads it, and commits lane_created.
    empty = replace(created.state, revision=0)
    create = (
        _insert_statement(ref, created.state),
        commit_statement(ref, empty, created, 0),
    )
    assert create[1] is not None
    lane = _Lane(ref, created.state, 1)
    _record_run(lane, 1, calls, turns)
    lane.recorded.clear()
    _record_run(lane, 2, calls, turns)
    # On the replay's lane the run starts at version 1, right after the creation.
    run = []
    for n, recorded in enumerate(lane.recorded):
        params = {**recorded.statement.params, "version": 1 + n}
        run.append(replace(recorded, statement=CommitStatement(recorded.statement.sql, params)))
    return RecordedRun(
        create=(create[0], create[1]),
        run=tuple(run),
        revision_after=lane.state.revision,
    )


# -- the pgbench script -----------------------------------------------------------------------

#: A named parameter, ``%(name)s`` or ``%(name)b`` (arrays go to psycopg in binary; pgbench
#: sends every value as text, which the statement's casts read alike).
_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%%")
#: pgbench's limit of parameters per SQL command (MAX_ARGS, the statement itself included).
PGBENCH_MAX_PARAMETERS = 255


def text_value(value: object) -> str:
    """``value`` in PostgreSQL's text input form (how pgbench sends a parameter: untyped text,
    typed by the server from the statement)."""
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("a naive datetime would be read in the server's time zone")
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "{" + ",".join(_array_element(v) for v in value) + "}"
    raise TypeError(f"no text form for {type(value).__name__}")


def _array_element(value: object) -> str:
    if value is None:
        return "NULL"
    text = text_value(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ReplayScript:
    """The pgbench script of one run and the variables it uses."""

    #: The script's text (``-f``).
    text: str
    #: ``-D`` definitions: variable name -> value (text form).
    variables: dict[str, str]
    #: Lifecycle commits per run of the script (pgbench transaction).
    commits: int
    #: PostgreSQL transactions per run of the script (the lane's creation is one more).
    transactions: int
    #: The lane's version and revision after a complete run of the script.
    version_after: int
    revision_after: int

    @property
    def define_bytes(self) -> int:
        """Bytes the ``-D`` arguments take on pgbench's command line."""
        return sum(len(name) + len(value) + 4 for name, value in self.variables.items())

    def arguments(self) -> list[str]:
        """pgbench's ``-D`` arguments (``it``: the per-client run counter starts at 0)."""
        out = ["-D", "it=0"]
        for name, value in self.variables.items():
            out += ["-D", f"{name}={value}"]
        return out


def replay_script(recorded: RecordedRun, commits_per_transaction: int = 1) -> ReplayScript:
    """Turn ``recorded`` into a pgbench script: each ``%(name)s`` (or ``b``) becomes ``:ns`` for the
    namespace, ``NULL`` for a null, else a variable holding the recorded value (equal values
    share one). ``commits_per_transaction`` > 1 wraps that many consecutive commit statements in
    one transaction: what PostgreSQL would spend if the service committed several commands in
    one transaction (group commit), the statements themselves unchanged."""
    variables: dict[str, str] = {}
    by_value: dict[str, str] = {}

    def render(statement: CommitStatement) -> str:
        used = 0

        def parameter(match: re.Match[str]) -> str:
            nonlocal used
            name = match.group(1)
            if name is None:
                return "%"
            if name == "ns":
                used += 1
                return ":ns"
            value = statement.params[name]
            if value is None:
                return "NULL"
            text = text_value(value)
            variable = by_value.get(text)
            if variable is None:
                variable = by_value[text] = f"p{len(by_value)}"
                variables[variable] = text
            used += 1
            return f":{variable}"

        sql = _PLACEHOLDER.sub(parameter, statement.sql)
        if used > PGBENCH_MAX_PARAMETERS:
            raise RuntimeError(f"a statement has {used} parameters; pgbench takes at most 255")
        if "\n" in sql:
            raise RuntimeError("a statement spans lines; pgbench reads one per line here")
        return sql + ";"

    insert, created = recorded.create
    lines = [
        "-- The service's SQL for one lifecycle run (bench/replay.py): a lane of its own, in a",
        "-- namespace of its own (:ns, per client and run), then one statement per commit.",
        "\\set it :it + 1",
        "\\set ns (:client_id + 1) * 1000000000 + :it",
        "BEGIN;",
        render(insert),
        # A new lane row's versions start in a range of their own (schema 0008); the recorded
        # statements count from 0, as the domain does: start this lane there.
        render(
            CommitStatement(
                "UPDATE lanes SET version = 0 WHERE namespace = %(ns)s AND lane_id = %(lane)s",
                {"ns": insert.params["ns"], "lane": insert.params["lane"]},
            )
        ),
        render(created),
        "COMMIT;",
    ]
    commits = [render(step.statement) for step in recorded.run]
    group = max(1, commits_per_transaction)
    for start in range(0, len(commits), group):
        chunk = commits[start : start + group]
        lines += ["BEGIN;", *chunk, "COMMIT;"] if group > 1 else chunk
    return ReplayScript(
        text="\n".join(lines) + "\n",
        variables=variables,
        commits=len(recorded.run),
        transactions=-(-len(recorded.run) // group) + 1,
        version_after=1 + len(recorded.run),
        revision_after=recorded.revision_after,
    )
