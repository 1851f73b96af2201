"""Every command in every state, on the pure state machine: accepted (and checked), or
refused with the documented class and reason while the input state stays unchanged
(docs/contract.md, invariant 5).

The expected outcomes are ``tests/support/refusal_matrix.py``'s, the table the integration
test checks against the real service too; this module only builds the states in memory and
poses the commands to the domain's functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from lane.v1 import snapshot_pb2

from lane.server.domain import lanes, placement, runs, tools
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.run_inputs import Outcome, RunSettings, Synthetic
from lane.server.domain.state import LaneState, Operation
from lane.server.domain.transition import Transition
from tests.support import refusal_matrix
from tests.support.refusal_matrix import Expected, cells, params
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

#: The matrix's states this module builds in memory (no_lane, may_finish, blocked and ended
#: only the integration test builds).
STATES = (
    "no_op",
    "idle",
    "turn",
    "planned",
    "pending",
    "ready",
    "completed",
    "a_idle",
    "a_turn",
    "a_planned",
    "a_pending",
    "a_ready",
    "compaction",
    "trunc",
    "a_trunc",
    "no_calls",
)
# The call every tool command targets; in the tools states the batch is [X, Y] and X has the
# status the state is named after (Y is planned, so the batch stays open). In ``trunc`` the
# batch's assistant message stopped for length (X and Y planned); in ``no_calls`` the run is
# idle after a message that stopped for TOOL_USE without any tool call.
X = "call-x"


def build(name: str) -> Lane:
    """A lane in state ``name`` (``a_`` = its run's abort was requested)."""
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
                settings=RunSettings(),
            ),
        )
        return lane
    cancelled = name.startswith("a_")
    base = name.removeprefix("a_")
    if base in ("idle", "turn", "no_calls"):
        lane.start_run(user("go"))
        if base != "idle":
            lane.start_turn("turn-1")
        if base == "no_calls":
            lane.settle("turn-1", assistant(text("let me look"), stop_reason=TOOL_USE))
    elif base == "trunc":
        lane = lane_with_batch(
            (X, "read", '{"p":1}'), ("call-y", "bash", '{"p":'), stop_reason=LENGTH
        )
    else:
        lane = lane_with_batch((X, "read", '{"p":1}'), ("call-y", "bash", '{"p":2}'))
        if base != "planned":
            lane.start_tool(X)
        if base in ("ready", "completed"):
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

    def stage(outcome: Outcome) -> Command:
        return lambda s: tools.stage_tool_outcome(s, run_id, X, outcome, now)

    return {
        "start_run": lambda s: runs.start_run(s, "run-2", prompt, run_settings(), now, ids),
        "abort": lambda s: runs.abort_operation(s, run_id, now),
        "start_turn": lambda s: runs.start_turn(s, run_id, "turn-9", now),
        "settle": lambda s: runs.settle_assistant(s, run_id, "turn-1", message, now, ids),
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
        "stage_no_outcome": stage(Synthetic()),
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


#: The matrix's commands of another operation id, each the command of this module it varies.
WRONG_OPERATION = {
    "abort_wrong_operation": "abort",
    "end_wrong_operation": "end_failed",
    "start_turn_wrong_operation": "start_turn",
    "settle_wrong_operation": "settle",
    "start_tool_wrong_operation": "start_tool",
    "update_tool_wrong_operation": "update_tool",
    "stage_wrong_operation": "stage_cancelled",
}


def command(lane: Lane, name: str) -> Command:
    """The matrix's command ``name``, aimed at ``lane``."""
    if name in WRONG_OPERATION:
        return commands(lane, "run-other")[WRONG_OPERATION[name]]
    return commands(lane)[name]


COMMANDS = {*commands(Lane()), *WRONG_OPERATION}


def test_the_matrix_has_every_command_and_state_built_here() -> None:
    assert set(refusal_matrix.COMMANDS) >= COMMANDS
    assert set(STATES) <= set(refusal_matrix.STATES)


def test_every_cell_checked_here_is_exact() -> None:
    # The state machine decides one reason: a cell naming alternatives would hide a change.
    for name, state, expected in cells(COMMANDS, set(STATES)):
        assert len(expected.refusals) <= 1, f"{name}@{state}"


@pytest.mark.parametrize(("name", "state", "expected"), params(COMMANDS, set(STATES)))
def test_command_in_state(name: str, state: str, expected: Expected) -> None:
    lane = build(state)
    run = command(lane, name)
    if expected.ok:
        lane.commit(run)  # checked: consecutive revisions, untouched input, fold == capture
        return
    code, reason = expected.exact()
    error = lane.refuse(run, reason, DOCUMENTED_REFUSALS[reason])
    assert error.code.value == code


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
