"""The refusal matrix: which command is refused in which lane state, with which status code
and ErrorInfo reason (docs/contract.md, invariant 5; docs/errors.md). One table, one
vocabulary, checked twice:

- ``tests/unit/domain/test_domain_refusals.py``: the pure state machine
  (``service/lane/server/domain``), each state built in memory;
- ``tests/integration/test_refusals.py``: the real service over gRPC, each state built by
  commands, the lane's snapshot, rows and event log unchanged after every refusal.

A cell is checked by every layer that can build its state and send its command (the
``*_STATES`` and ``*_COMMANDS`` of each test module); a row or column added here is checked by
both as soon as each layer knows how to build or send it. The expected outcomes are written
out by hand from the contract, not from running the service.

Cells: ``ok`` (accepted), a refusal's name in :data:`OUTCOMES`, ``a|b`` (either: both rules
apply and no order is documented; only in cells the domain does not check, which must be
exact), ``-`` (no layer can pose it: the state or the command exists in neither).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

#: Every lane state, by the name the table uses. The tool states hold one batch of two calls,
#: [X, Y] (X first in source order); "the call" is the one the tool commands aim at: X, but Y in
#: ``blocked``. ``a_`` states are the same with the run's abort requested.
STATES: dict[str, str] = {
    "no_lane": "the lane does not exist",
    "no_op": "the lane exists without an open operation",
    "idle": "a run just started: between turns, awaiting an assistant response",
    "turn": "a turn started, its assistant message not settled",
    "may_finish": "between turns after an assistant message without tool calls",
    "planned": "tools phase: the call planned (Y planned)",
    "pending": "tools phase: the call effect_pending (Y planned)",
    "ready": "tools phase: the call outcome_ready, not placed yet (Y planned)",
    "blocked": "tools phase: the call is Y, outcome_ready, its placement blocked by X running",
    "completed": "tools phase: the call completed (placed), Y still planned",
    "a_idle": "idle, aborting",
    "a_turn": "turn, aborting",
    "a_planned": "planned, aborting",
    "a_pending": "pending, aborting",
    "a_ready": "ready, aborting",
    "ended": "the run ended COMPLETED: its operation id is no longer open",
    "compaction": "a compaction is the open operation",
    "trunc": "tools phase of an assistant message cut off for length (X and Y planned)",
    "a_trunc": "trunc, aborting",
    "no_calls": "between turns after a message that stopped for TOOL_USE without tool calls",
}

#: Every command, by the name the table uses. Unless named otherwise, a command aims at the
#: open run, its open turn and the state's call; "unknown call" is an id the batch lacks.
COMMANDS: dict[str, str] = {
    "start_run": "StartRun with a prompt",
    "abort": "AbortOperation",
    "end_completed": "EndRun COMPLETED",
    "end_failed": "EndRun FAILED with an error",
    "end_aborted": "EndRun ABORTED",
    "start_turn": "StartTurn",
    "settle": "SettleAssistantMessage for the open turn",
    "settle_wrong_turn": "SettleAssistantMessage for another turn id",
    "start_tool": "StartToolCall",
    "start_unknown_call": "StartToolCall of an unknown call",
    "update_tool": "UpdateToolCall",
    "update_unknown_call": "UpdateToolCall of an unknown call",
    "stage_executed": "StageToolOutcome, executed",
    "stage_unknown_call": "StageToolOutcome, executed, of an unknown call",
    "stage_unknown_tool": "StageToolOutcome, synthetic UNKNOWN_TOOL",
    "stage_invalid_arguments": "StageToolOutcome, synthetic INVALID_ARGUMENTS",
    "stage_denied": "StageToolOutcome, synthetic DENIED",
    "stage_truncated": "StageToolOutcome, synthetic TRUNCATED",
    "stage_cancelled": "StageToolOutcome, synthetic CANCELLED",
    "stage_interrupted": "StageToolOutcome, synthetic INTERRUPTED",
    "stage_unspecified": "StageToolOutcome, synthetic without a cause",
    "stage_no_outcome": "StageToolOutcome, an empty synthetic outcome",
    "place_ready": "placing the batch's ready prefix (the service's own step)",
    "record_usage": "RecordUsage",
    "update_config": "UpdateLaneConfig",
    "enqueue": "EnqueueMessage (steer)",
    "abort_wrong_operation": "AbortOperation of another operation id",
    "end_wrong_operation": "EndRun of another operation id",
    "start_turn_wrong_operation": "StartTurn of another operation id",
    "settle_wrong_operation": "SettleAssistantMessage of another operation id",
    "start_tool_wrong_operation": "StartToolCall of another operation id",
    "update_tool_wrong_operation": "UpdateToolCall of another operation id",
    "stage_wrong_operation": "StageToolOutcome of another operation id",
}

#: A refusal: its status code name (as in google.rpc.Code) and ErrorInfo reason.
Refusal = tuple[str, str]

OUTCOMES: dict[str, Refusal | None] = {
    "ok": None,
    "lane": ("NOT_FOUND", "LANE_NOT_FOUND"),
    "open": ("FAILED_PRECONDITION", "OPERATION_NOT_OPEN"),
    "notrun": ("FAILED_PRECONDITION", "OPERATION_NOT_A_RUN"),
    "busy": ("FAILED_PRECONDITION", "LANE_BUSY"),
    "phase": ("FAILED_PRECONDITION", "WRONG_RUN_PHASE"),
    "cancel": ("FAILED_PRECONDITION", "OPERATION_CANCELLED"),
    "notcancelled": ("FAILED_PRECONDITION", "OPERATION_NOT_CANCELLED"),
    "status": ("FAILED_PRECONDITION", "TOOL_CALL_WRONG_STATUS"),
    "call": ("NOT_FOUND", "TOOL_CALL_NOT_FOUND"),
    "turn": ("FAILED_PRECONDITION", "TURN_MISMATCH"),
    "needs": ("FAILED_PRECONDITION", "RUN_NEEDS_ASSISTANT"),
    "trunc": ("FAILED_PRECONDITION", "MESSAGE_TRUNCATED"),
    "nottrunc": ("FAILED_PRECONDITION", "MESSAGE_NOT_TRUNCATED"),
    "cause": ("INVALID_ARGUMENT", "INVALID_SYNTHETIC_CAUSE"),
}

# The rules behind the cells (lane_service.proto, docs/contract.md, docs/recovery.md):
# - a missing lane: NOT_FOUND; an operation id that is not the open one: OPERATION_NOT_OPEN
#   (also once the run ended); a run command on a compaction: OPERATION_NOT_A_RUN.
# - StartRun needs a lane without an open operation (LANE_BUSY otherwise).
# - AbortOperation is accepted while the run is open, again (a no-op) once aborting.
# - EndRun COMPLETED needs a run between turns at a finishing point: after an assistant
#   message without tool calls (or a batch whose calls all terminate), not right after
#   StartRun nor after a TOOL_USE stop without calls (RUN_NEEDS_ASSISTANT). An aborting run
#   always ends, recorded ABORTED; FAILED and ABORTED are always possible.
# - StartTurn needs a run between turns that is not aborting (no new work after abort).
# - SettleAssistantMessage needs the open turn, by id (also while aborting: the response of
#   an admitted request still settles).
# - Tool commands need the run's tool batch (WRONG_RUN_PHASE) and a call of it
#   (TOOL_CALL_NOT_FOUND).
# - StartToolCall: a planned call, not while aborting (no new intent after an abort).
# - UpdateToolCall, executed and INTERRUPTED outcomes: an effect_pending call, also while
#   aborting (admitted work is never erased).
# - UNKNOWN_TOOL, INVALID_ARGUMENTS, DENIED are decided before intent: planned calls only.
# - CANCELLED: a planned or effect_pending call, and only once the abort is durable
#   (OPERATION_NOT_CANCELLED before).
# - A synthetic outcome needs a cause (INVALID_SYNTHETIC_CAUSE).
# - A call already outcome_ready or completed never changes again.
# - The service decides truncation from the settled message: a call of a message cut off for
#   length never starts and takes only the TRUNCATED outcome (checked after the call's status,
#   before the cause's own rules; before an abort too); no other call may take it.
# - Placing, usage, configuration and the inbox are accepted in every state.
TABLE_TEXT = """
command                     no_lane no_op idle  turn  may_finish planned      pending      ready  blocked    completed a_idle a_turn a_planned a_pending a_ready ended compaction trunc  a_trunc no_calls
start_run                   lane    ok    busy  busy  busy       busy         busy         busy   busy       busy      busy   busy   busy      busy      busy    ok    busy       busy   busy    busy
abort                       lane    open  ok    ok    ok         ok           ok           ok     ok         ok        ok     ok     ok        ok        ok      open  ok         ok     ok      ok
end_completed               lane    open  needs phase ok         phase        phase        phase  phase      phase     ok     ok     ok        ok        ok      open  notrun     phase  ok      needs
end_failed                  -       open  ok    ok    -          ok           ok           ok     -          ok        ok     ok     ok        ok        ok      -     notrun     ok     ok      ok
end_aborted                 -       open  ok    ok    -          ok           ok           ok     -          ok        ok     ok     ok        ok        ok      -     notrun     ok     ok      ok
start_turn                  lane    open  ok    phase ok         phase        phase        phase  phase      phase     cancel phase  phase     phase     phase   open  notrun     phase  phase   ok
settle                      lane    open  phase ok    phase|turn phase        phase        phase  phase|turn phase     phase  ok     phase     phase     phase   open  notrun     phase  phase   phase
settle_wrong_turn           lane    open  phase turn  phase|turn phase        phase        phase  phase|turn phase     phase  turn   phase     phase     phase   open  notrun     phase  phase   phase
start_tool                  lane    open  phase phase call|phase ok           status       status status     status    phase  phase  cancel    status    status  open  notrun     trunc  trunc   phase
start_unknown_call          lane    open  phase phase call|phase call         call         call   call       call      phase  phase  call      call      call    open  notrun     call   call    phase
update_tool                 lane    open  phase phase call|phase status       ok           status status     status    phase  phase  status    ok        status  open  notrun     status status  phase
update_unknown_call         lane    open  phase phase call|phase call         call         call   call       call      phase  phase  call      call      call    open  notrun     call   call    phase
stage_executed              lane    open  phase phase call|phase status       ok           status status     status    phase  phase  status    ok        status  open  notrun     trunc  trunc   phase
stage_unknown_call          lane    open  phase phase call|phase call         call         call   call       call      phase  phase  call      call      call    open  notrun     call   call    phase
stage_unknown_tool          lane    open  phase phase call|phase ok           status       status status     status    phase  phase  ok        status    status  open  notrun     trunc  trunc   phase
stage_invalid_arguments     -       open  phase phase -          ok           status       status -          status    phase  phase  ok        status    status  -     notrun     trunc  trunc   phase
stage_denied                -       open  phase phase -          ok           status       status -          status    phase  phase  ok        status    status  -     notrun     trunc  trunc   phase
stage_truncated             lane    open  phase phase call|phase nottrunc     nottrunc     status status     status    phase  phase  nottrunc  nottrunc  status  open  notrun     ok     ok      phase
stage_cancelled             lane    open  phase phase call|phase notcancelled notcancelled status status     status    phase  phase  ok        ok        status  open  notrun     trunc  trunc   phase
stage_interrupted           lane    open  phase phase call|phase status       ok           status status     status    phase  phase  status    ok        status  open  notrun     trunc  trunc   phase
stage_unspecified           -       open  phase phase -          cause        cause        status -          status    phase  phase  cause     cause     status  -     notrun     trunc  trunc   phase
stage_no_outcome            -       open  phase phase -          cause        cause        status -          status    phase  phase  cause     cause     status  -     notrun     trunc  trunc   phase
place_ready                 -       ok    ok    ok    -          ok           ok           ok     -          ok        ok     ok     ok        ok        ok      -     ok         ok     ok      ok
record_usage                -       ok    ok    ok    -          ok           ok           ok     -          ok        ok     ok     ok        ok        ok      -     ok         ok     ok      ok
update_config               -       ok    ok    ok    -          ok           ok           ok     -          ok        ok     ok     ok        ok        ok      -     ok         ok     ok      ok
enqueue                     -       ok    ok    ok    -          ok           ok           ok     -          ok        ok     ok     ok        ok        ok      -     ok         ok     ok      ok
abort_wrong_operation       lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
end_wrong_operation         lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
start_turn_wrong_operation  lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
settle_wrong_operation      lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
start_tool_wrong_operation  lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
update_tool_wrong_operation lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
stage_wrong_operation       lane    open  open  open  open       open         open         open   open       open      open   open   open      open      open    open  open       open   open    open
"""  # noqa: E501


@dataclass(frozen=True)
class Expected:
    """A cell: accepted (``refusals`` empty), or refused with one of ``refusals``."""

    refusals: frozenset[Refusal]

    @property
    def ok(self) -> bool:
        """Whether the command is accepted."""
        return not self.refusals

    def exact(self) -> Refusal:
        """The one refusal of a cell that names exactly one."""
        (refusal,) = self.refusals
        return refusal


def _parse(source: str) -> dict[tuple[str, str], Expected | None]:
    header, *rows = source.strip().splitlines()
    columns = header.split()[1:]
    assert columns == list(STATES), columns
    table: dict[tuple[str, str], Expected | None] = {}
    for row in rows:
        command, *cells = row.split()
        assert command in COMMANDS, command
        assert len(cells) == len(STATES), command
        for state, cell in zip(STATES, cells, strict=True):
            if cell == "-":
                table[command, state] = None
                continue
            outcomes = [OUTCOMES[name] for name in cell.split("|")]
            assert None not in outcomes or outcomes == [None], cell
            table[command, state] = Expected(frozenset(o for o in outcomes if o is not None))
    assert {command for command, _ in table} == set(COMMANDS)
    return table


#: (command, state) → its expected outcome; None where no layer can pose it.
MATRIX = _parse(TABLE_TEXT)


def cells(commands: set[str], states: set[str]) -> list[tuple[str, str, Expected]]:
    """The cells a layer checks: its commands in its states, every one posed."""
    assert commands <= set(COMMANDS), commands - set(COMMANDS)
    assert states <= set(STATES), states - set(STATES)
    found = []
    for command in COMMANDS:
        for state in STATES:
            if command in commands and state in states:
                expected = MATRIX[command, state]
                assert expected is not None, f"{command}@{state} is marked '-' but posed"
                found.append((command, state, expected))
    return found


def params(commands: set[str], states: set[str]) -> list[object]:
    """:func:`cells` as pytest parameters ``(command, state, expected)``, ids ``command@state``."""
    return [
        pytest.param(command, state, expected, id=f"{command}@{state}")
        for command, state, expected in cells(commands, states)
    ]
