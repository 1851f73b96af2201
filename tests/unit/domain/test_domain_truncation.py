"""The service decides truncation from the settled assistant message (docs/contract.md, Tool
calls): the calls of a message that stopped for length get the truncated outcome, whoever
settles them; a message that stopped for TOOL_USE without a tool call is no answer to finish on.

The refusals are in the refusal matrix (tests/support/refusal_matrix.py: states trunc,
a_trunc, no_calls); these are the accepted paths.
"""

from __future__ import annotations

from typing import TypeAlias

import pytest
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.domain import results, runs
from lane.server.domain.state import Continuation
from tests.unit.domain.support import (
    ABORTED,
    COMPLETED,
    DOCUMENTED_REFUSALS,
    FAILED,
    LENGTH,
    TOOL_USE,
    Cause,
    Lane,
    assistant,
    kinds,
    lane_with_batch,
    of_kind,
    placed_tool_result_ids,
    synthetic,
    text,
    user,
)

# The second call's arguments were cut off mid-value.
Status: TypeAlias = snapshot_pb2.OperationResultStatus.ValueType
CALLS = (("c-0", "read", '{"path":"a"}'), ("c-1", "a_rather_long_tool_name", '{"pa'))


def truncated_text(name: str) -> str:
    return results.TRUNCATED_TEXT.format(name=name)


def test_a_driver_stages_every_call_of_a_length_stop_as_truncated() -> None:
    lane = lane_with_batch(*CALLS, stop_reason=LENGTH)
    first = lane.stage("c-0", synthetic(Cause.SYNTHETIC_CAUSE_TRUNCATED))
    assert kinds(first) == ["tool_start", "tool_end"]
    assert first.events[1].tool_end.result.content[0].text.text == truncated_text("read")
    lane.place()
    lane.stage("c-1", synthetic(Cause.SYNTHETIC_CAUSE_TRUNCATED))
    placed = lane.place()
    assert "turn_end" in kinds(placed)
    assert placed_tool_result_ids(lane.transcript) == ["c-0", "c-1"]
    # The results are errors that do not terminate: the model is asked again.
    operation = lane.state.operation
    assert operation is not None and operation.continuation == Continuation.NEED_ASSISTANT


@pytest.mark.parametrize(
    ("status", "abort", "ended"),
    [(FAILED, False, FAILED), (ABORTED, False, ABORTED), (COMPLETED, True, ABORTED)],
    ids=["failed", "aborted", "after-abort"],
)
def test_ending_the_run_stages_the_planned_calls_of_a_length_stop_as_truncated(
    status: Status, abort: bool, ended: int
) -> None:
    lane = lane_with_batch(*CALLS, stop_reason=LENGTH)
    if abort:
        lane.abort()  # an abort does not make them cancelled: they were never to run
    t = lane.end_run(status)
    assert kinds(t) == [
        "tool_start", "tool_end", "message_start", "message_end", "entry_added",
        "tool_start", "tool_end", "message_start", "message_end", "entry_added",
        "turn_end",
        "run_end",
    ]  # fmt: skip
    ends = [e.tool_end for e in of_kind(t, "tool_end")]
    assert [e.result for e in ends] == [
        messages_pb2.ToolResult(content=[text(truncated_text("read"))]),
        messages_pb2.ToolResult(content=[text(truncated_text("a_rather_long_tool_name"))]),
    ]
    assert all(e.is_error and not e.terminate for e in ends)
    assert t.events[-1].run_end.status == ended


def test_the_reconciler_stages_them_as_truncated_too() -> None:
    lane = lane_with_batch(*CALLS, stop_reason=LENGTH)
    now, run_id = lane.tick(), lane.operation_id
    # The service ending an orphan: no lease token, every event tagged recovery.
    t = lane.commit(
        lambda s: runs.end_run(
            s, run_id, ABORTED, None, now, lane.ids, recovery=True, lease_token=None
        )
    )
    ends = of_kind(t, "tool_end")
    assert [e.tool_end.result.content[0].text.text for e in ends] == [
        truncated_text("read"),
        truncated_text("a_rather_long_tool_name"),
    ]
    assert all(e.recovery for e in t.events)


def test_a_tool_use_stop_without_calls_ends_the_turn_but_the_run_cannot_complete() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.start_turn("turn-1")
    t = lane.settle("turn-1", assistant(text("I will read it."), stop_reason=TOOL_USE))
    assert kinds(t) == ["message_end", "entry_added", "turn_end"]
    now, run_id = lane.tick(), lane.operation_id
    lane.refuse(
        lambda s: runs.end_run(s, run_id, COMPLETED, None, now, lane.ids),
        "RUN_NEEDS_ASSISTANT",
        DOCUMENTED_REFUSALS["RUN_NEEDS_ASSISTANT"],
    )
    lane.start_turn("turn-2")  # the driver may ask the model again …
    lane.settle("turn-2", assistant(text("Done."), stop_reason=messages_pb2.STOP_REASON_STOP))
    assert lane.end_run(COMPLETED).events[-1].run_end.status == COMPLETED  # … and finish


def test_a_length_stop_without_calls_may_finish() -> None:
    lane = Lane()
    lane.start_run(user("go"))
    lane.start_turn("turn-1")
    lane.settle("turn-1", assistant(text("A long answer, cut"), stop_reason=LENGTH))
    assert lane.end_run(COMPLETED).events[-1].run_end.status == COMPLETED
