"""Kept for the tests that import it: the helpers live in :mod:`tests.support.driver_tools`."""

from tests.support.driver_tools import (
    ANY_OBJECT,
    Recorder,
    by_call,
    open_operation_id,
    operation_state,
    returns,
    rows,
    snapshot,
    step,
    text_of,
    tool,
    tool_results,
    until,
    until_aborted,
    waits_for,
)

__all__ = [
    "ANY_OBJECT",
    "Recorder",
    "by_call",
    "open_operation_id",
    "operation_state",
    "returns",
    "rows",
    "snapshot",
    "step",
    "text_of",
    "tool",
    "tool_results",
    "until",
    "until_aborted",
    "waits_for",
]
