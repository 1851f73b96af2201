"""Kept for the tests that import it: the helpers live in :mod:`tests.support.lanes`."""

from tests.support.lanes import (
    Probe,
    Stub,
    assistant,
    error_info,
    error_reason,
    events_between,
    hand_edit,
    kinds,
    leased_batch,
    new_lane_id,
    presentation_check,
    result,
    text,
    tool_call,
    user,
)

__all__ = [
    "Probe",
    "Stub",
    "assistant",
    "error_info",
    "error_reason",
    "events_between",
    "hand_edit",
    "kinds",
    "leased_batch",
    "new_lane_id",
    "presentation_check",
    "result",
    "text",
    "tool_call",
    "user",
]
