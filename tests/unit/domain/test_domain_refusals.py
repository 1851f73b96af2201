"""Every command in every state: accepted (and checked), or refused with the documented class
and reason while the input state stays unchanged (docs/contract.md, invariant 5).

The table is written out by hand from the contract, one row per command and one column per
state, so a change in what the state machine admits shows up as a failing cell.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from lane.v1 import lane_service_pb2, snapshot_pb2

from service.domain import lanes, placement, runs, tools
from service.domain.errors import InvalidArgument
from service.domain.state import LaneState, Operation
from service.domain.transition import Transition
from tests.unit.domain.support import (
    ABORTED,
    COMPLETED,
    DOCUMENTED_REFUSALS,
    FAILED,
    LENGTH,
    NEVER,
    RUN,
    STEER,
    T0,
    TOOL_USE,
    Cause,
    Lane,
    assistant,
    executed,
    lane_with_batch,
    queued_custom,
    queued_message,
    result,
    run_settings,
    synthetic,
    text,
    tool_call,
    usage,
    user,
)

STATES = (
    "no_op",
    "idle",
    "turn_open",
    "planned",
    "effect_pending",
    "outcome_ready",
    "completed",
    "c_idle",
    "c_turn_open",
    "c_planned",
    "c_effect_pending",
    "c_outcome_ready",
    "compaction",
    "truncated",
    "c_truncated",
    "no_calls",
)
# The call every tool command targets; in the tools states the batch is [X, Y] and X has the
# status the state is named after (Y is planned, so the batch stays open). In ``truncated`` the
# batch's assistant message stopped for length (X and Y planned); in ``no_calls`` the run is
# idle after a message that stopped for TOOL_USE without any tool call.
X = "call-x"


def build(name: str) -> Lane:
    """A lane in state ``name`` (``c_`` = its run's abort was requested)."""
    lane = Lane()
    if name == "no_op":
        return lane
    if name == "compaction":
        lane.state = replace(
            lane.state,
            operation=Operation(
                operation_id=RUN,
                kind=snapshot_pb2.OPERATION_KIND_COMPACTION,
                started_time=T0,
                from_tip_id="",
                settings=lane_service_pb2.RunSettings(),
            ),
        )
        return lane
    cancelled = name.startswith("c_")
    base = name.removeprefix("c_")
    if base in ("idle", "turn_open", "no_calls"):
        lane.start_run(user("go"))
        if base != "idle":
            lane.start_turn("turn-1")
        if base == "no_calls":
            lane.settle("turn-1", assistant(text("let me look"), stop_reason=TOOL_USE))
    elif base == "truncated":
        lane = lane_with_batch(
            (X, "read", '{"p":1}'), ("call-y", "bash", '{"p":'), stop_reason=LENGTH
        )
    else:
        lane = lane_with_batch((X, "read", '{"p":1}'), ("call-y", "bash", '{"p":2}'))
        if base != "planned":
            lane.start_tool(X)
        if base in ("outcome_ready", "completed"):
            lane.stage(X, executed(result("x")))
        if base == "completed":
            lane.place()
    if cancelled:
        lane.abort()
    return lane


Command = Callable[[LaneState], Transition]


def commands(lane: Lane, run_id: str = RUN) -> dict[str, Command]:
    """Every command, aimed at operation ``run_id``, turn-1 and call X."""
    now, ids = lane.tick(), lane.ids
    prompt = [user("again")]
    message = assistant(text("x"), tool_call("n-0", "read", "{}"))

    def stage(outcome: tools.Outcome) -> Command:
        return lambda s: tools.stage_tool_outcome(s, run_id, X, outcome, now)

    return {
        "start_run": lambda s: runs.start_run(s, "run-2", prompt, run_settings(), now, ids),
        "abort": lambda s: runs.abort_operation(s, run_id, now),
        "start_turn": lambda s: runs.start_turn(s, run_id, "turn-9", now),
        "settle_assistant": lambda s: runs.settle_assistant(s, run_id, "turn-1", message, now, ids),
        "settle_wrong_turn": lambda s: runs.settle_assistant(
            s, run_id, "turn-0", message, now, ids
        ),
        "start_tool": lambda s: tools.start_tool_call(s, run_id, X, '{"p":1}', NEVER, now),
        "start_unknown_call": lambda s: tools.start_tool_call(
            s, run_id, "call-?", "{}", NEVER, now
        ),
        "update_tool": lambda s: tools.update_tool_call(s, run_id, X, result("~"), True, now),
        "update_unknown_call": lambda s: tools.update_tool_call(
            s, run_id, "call-?", result("~"), False, now
        ),
        "stage_executed": stage(executed(result("final", terminate=True))),
        "stage_unknown_call": lambda s: tools.stage_tool_outcome(
            s, run_id, "call-?", executed(result("final")), now
        ),
        "stage_unknown_tool": stage(synthetic(Cause.SYNTHETIC_CAUSE_UNKNOWN_TOOL)),
        "stage_invalid_arguments": stage(synthetic(Cause.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, "m")),
        "stage_denied": stage(synthetic(Cause.SYNTHETIC_CAUSE_DENIED, "no", terminate=True)),
        "stage_truncated": stage(synthetic(Cause.SYNTHETIC_CAUSE_TRUNCATED)),
        "stage_cancelled": stage(synthetic(Cause.SYNTHETIC_CAUSE_CANCELLED)),
        "stage_interrupted": stage(synthetic(Cause.SYNTHETIC_CAUSE_INTERRUPTED)),
        "stage_unspecified": stage(synthetic(Cause.SYNTHETIC_CAUSE_UNSPECIFIED)),
        "stage_no_outcome": stage(lane_service_pb2.SyntheticOutcome()),
        "end_completed": lambda s: runs.end_run(s, run_id, COMPLETED, None, now, ids),
        "end_failed": lambda s: runs.end_run(
            s, run_id, FAILED, snapshot_pb2.OperationError(code="E", message="m"), now, ids
        ),
        "end_aborted": lambda s: runs.end_run(s, run_id, ABORTED, None, now, ids),
        "place_ready": lambda s: placement.place_ready(s, now, ids),
        "record_usage": lambda s: runs.record_usage(s, "u-x", usage(1), None, False, now),
        "update_config": lambda s: lanes.update_config(s, now, active_tool_names=["grep"]),
        "enqueue": lambda s: lanes.enqueue(s, queued_message("q-x", STEER, "hey"), now),
    }


OK = "ok"
NOP = "OPERATION_NOT_OPEN"
BUSY = "LANE_BUSY"
NAR = "OPERATION_NOT_A_RUN"
PH = "WRONG_RUN_PHASE"
CAN = "OPERATION_CANCELLED"
ST = "TOOL_CALL_WRONG_STATUS"
NF = "TOOL_CALL_NOT_FOUND"
TM = "TURN_MISMATCH"
CAUSE = "INVALID_SYNTHETIC_CAUSE"
NCX = "OPERATION_NOT_CANCELLED"
RNA = "RUN_NEEDS_ASSISTANT"
MT = "MESSAGE_TRUNCATED"
MNT = "MESSAGE_NOT_TRUNCATED"

# Columns, in STATES order: no_op idle turn_open planned effect_pending outcome_ready completed,
# then the c_ (aborting) idle turn_open planned effect_pending outcome_ready, then compaction,
# truncated, c_truncated, no_calls.
# The calls of a message cut off for length take the TRUNCATED outcome and nothing else
# (checked after the call's status and start order, before the cause's own rules).
BEFORE_INTENT = (NOP, PH, PH, OK, ST, ST, ST, PH, PH, OK, ST, ST, NAR, MT, MT, PH)
NEEDS_INTENT = (NOP, PH, PH, ST, OK, ST, ST, PH, PH, ST, OK, ST, NAR, MT, MT, PH)
UNKNOWN_CALL = (NOP, PH, PH, NF, NF, NF, NF, PH, PH, NF, NF, NF, NAR, NF, NF, PH)
NO_CAUSE = (NOP, PH, PH, CAUSE, CAUSE, ST, ST, PH, PH, CAUSE, CAUSE, ST, NAR, MT, MT, PH)
TABLE: dict[str, tuple[str, ...]] = {
    "start_run": (OK,) + (BUSY,) * (len(STATES) - 1),
    "abort": (NOP,) + (OK,) * (len(STATES) - 1),
    "start_turn": (NOP, OK, PH, PH, PH, PH, PH, CAN, PH, PH, PH, PH, NAR, PH, PH, OK),
    "settle_assistant": (NOP, PH, OK, PH, PH, PH, PH, PH, OK, PH, PH, PH, NAR, PH, PH, PH),
    "settle_wrong_turn": (NOP, PH, TM, PH, PH, PH, PH, PH, TM, PH, PH, PH, NAR, PH, PH, PH),
    # A call of a message cut off for length never runs, not even before an abort.
    "start_tool": (NOP, PH, PH, OK, ST, ST, ST, PH, PH, CAN, ST, ST, NAR, MT, MT, PH),
    "start_unknown_call": UNKNOWN_CALL,
    "update_tool": (NOP, PH, PH, ST, OK, ST, ST, PH, PH, ST, OK, ST, NAR, ST, ST, PH),
    "update_unknown_call": UNKNOWN_CALL,
    "stage_executed": NEEDS_INTENT,
    "stage_unknown_call": UNKNOWN_CALL,
    "stage_unknown_tool": BEFORE_INTENT,
    "stage_invalid_arguments": BEFORE_INTENT,
    "stage_denied": BEFORE_INTENT,
    # TRUNCATED is the service's decision: only for calls of a message cut off for length.
    "stage_truncated": (NOP, PH, PH, MNT, MNT, ST, ST, PH, PH, MNT, MNT, ST, NAR, OK, OK, PH),
    # A cancelled outcome needs the abort to be durable first.
    "stage_cancelled": (NOP, PH, PH, NCX, NCX, ST, ST, PH, PH, OK, OK, ST, NAR, MT, MT, PH),
    "stage_interrupted": NEEDS_INTENT,
    "stage_unspecified": NO_CAUSE,
    "stage_no_outcome": NO_CAUSE,
    # Just started, or after a TOOL_USE stop without tool calls, the run awaits an assistant
    # response: it cannot complete (an aborting run always ends, as ABORTED).
    "end_completed": (NOP, RNA, PH, PH, PH, PH, PH, OK, OK, OK, OK, OK, NAR, PH, OK, RNA),
    "end_failed": (NOP,) + (OK,) * 11 + (NAR, OK, OK, OK),
    "end_aborted": (NOP,) + (OK,) * 11 + (NAR, OK, OK, OK),
    "place_ready": (OK,) * len(STATES),
    "record_usage": (OK,) * len(STATES),
    "update_config": (OK,) * len(STATES),
    "enqueue": (OK,) * len(STATES),
}

CASES = [
    pytest.param(command, state, TABLE[command][column], id=f"{command}@{state}")
    for command in TABLE
    for column, state in enumerate(STATES)
]


def test_the_table_covers_every_command() -> None:
    assert set(TABLE) == set(commands(Lane()))
    assert all(len(row) == len(STATES) for row in TABLE.values())


@pytest.mark.parametrize(("command", "state", "expected"), CASES)
def test_command_in_state(command: str, state: str, expected: str) -> None:
    lane = build(state)
    run = commands(lane)[command]
    if expected == OK:
        lane.commit(run)  # checked: consecutive revisions, untouched input, fold == capture
    else:
        lane.refuse(run, expected, DOCUMENTED_REFUSALS[expected])


RUN_COMMANDS = (
    "abort",
    "start_turn",
    "settle_assistant",
    "start_tool",
    "update_tool",
    "stage_cancelled",
    "end_failed",
)


@pytest.mark.parametrize("state", [s for s in STATES if s != "no_op"])
@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_a_stale_operation_id_is_refused_in_every_state(command: str, state: str) -> None:
    lane = build(state)
    lane.refuse(commands(lane, "run-other")[command], NOP, DOCUMENTED_REFUSALS[NOP])


def test_a_run_needs_a_prompt_or_a_captured_message() -> None:
    lane = Lane()
    lane.enqueue(queued_custom("w-1", "note", "{}"))  # a custom write is not conversational
    now = lane.tick()
    lane.refuse(
        lambda s: runs.start_run(s, RUN, [], run_settings(), now, lane.ids),
        "EMPTY_PROMPT",
        InvalidArgument,
    )
    lane.enqueue(queued_message("s-1", STEER, "do this"))
    t = lane.commit(lambda s: runs.start_run(s, RUN, [], run_settings(), now, lane.ids))
    assert [e.id for e in t.entries] == ["w-1", "s-1"]
    assert lane.state.inbox == ()
