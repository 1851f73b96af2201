"""Requests at the edges of the count limits, for the tests that count a large request before
it is decoded (test_encoded_counts.py) or parsed (test_json_counts.py): both must refuse
exactly what counting the decoded request refuses."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import Message
from hypothesis import strategies as st
from lane.client.testing import text, user
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

from lane.server.domain.errors import InvalidArgument
from lane.server.domain.limits import MAX_CONTENT_BLOCKS, MAX_REQUEST_MESSAGES, MAX_TOOL_NAMES

#: Counts around each limit, for hypothesis.
BLOCKS = st.integers(MAX_CONTENT_BLOCKS - 3, MAX_CONTENT_BLOCKS + 3)
MESSAGES = st.integers(MAX_REQUEST_MESSAGES - 2, MAX_REQUEST_MESSAGES + 2)
NAMES = st.integers(MAX_TOOL_NAMES - 2, MAX_TOOL_NAMES + 2)
#: The requests :func:`near_the_limits` makes.
KINDS = ("settle", "start_run", "config")


def reason(check: Callable[..., object], *args: object) -> str | None:
    """The reason ``check(*args)`` refuses with (None: it accepts)."""
    try:
        check(*args)
    except InvalidArgument as error:
        return error.reason
    return None


def settle(
    padding: str, blocks: list[messages_pb2.ContentBlock]
) -> pb.SettleAssistantMessageRequest:
    """An assistant message of a text block of ``padding`` and ``blocks``."""
    return pb.SettleAssistantMessageRequest(
        lane_id="l", operation_id="o", turn_id="t", message=messages_pb2.AssistantMessage(
            content=[text(padding), *blocks], stop_reason=messages_pb2.STOP_REASON_STOP
        ),
    )  # fmt: skip


def near_the_limits(kind: str, padding: str, blocks: int, messages: int, names: int) -> Message:
    """A ``kind`` request (:data:`KINDS`) holding ``padding`` and ``blocks`` content blocks,
    ``messages`` prompt messages or ``names`` tool names (the padding counts as one)."""
    if kind == "settle":
        return settle(padding, [text("") for _ in range(blocks - 1)])
    if kind == "start_run":
        prompt = [user(padding), *(user("") for _ in range(messages - 1))]
        return pb.StartRunRequest(lane_id="l", prompt=prompt)
    request = pb.UpdateLaneConfigRequest(lane_id="l")
    request.active_tool_names.names.extend([padding, *(f"t{i}" for i in range(names - 1))])
    return request
