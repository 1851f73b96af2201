"""Counts read from a large JSON request's text before it is parsed
(service/lane/server/api/json_counts.py): the same refusals as counting the parsed request,
without parsing a request that holds too many values."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from lane.client.testing import user
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.json_counts import (
    CHECKED_FROM_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    check_json_counts,
)
from lane.server.api.validation import check_counts
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.limits import MAX_CONTENT_BLOCKS
from tests.unit.counted_requests import BLOCKS, KINDS, MESSAGES, NAMES, near_the_limits, reason

PADDING = "x" * CHECKED_FROM_BYTES


def as_json(request: Message, *, proto_names: bool = False) -> bytes:
    return json_format.MessageToJson(
        request, indent=None, preserving_proto_field_name=proto_names
    ).encode()


@settings(max_examples=40, deadline=None)
@given(
    blocks=BLOCKS,
    messages=MESSAGES,
    names=NAMES,
    kind=st.sampled_from(KINDS),
    proto_names=st.booleans(),
)
def test_a_large_json_request_is_refused_from_its_text_exactly_when_its_parsed_counts_are(
    blocks: int, messages: int, names: int, kind: str, proto_names: bool
) -> None:
    request = near_the_limits(kind, PADDING, blocks, messages, names)
    data = as_json(request, proto_names=proto_names)
    assert len(data) > CHECKED_FROM_BYTES
    parsed = json_format.Parse(data, type(request)())
    assert reason(check_json_counts, data, type(request)) == reason(check_counts, parsed)


def test_a_million_empty_blocks_are_refused_after_counting_one_past_the_limit() -> None:
    body = b'{"laneId":"l","message":{"content":[' + b",".join([b"{}"] * 1_000_000) + b"]}}"
    with pytest.raises(InvalidArgument) as refused:
        check_json_counts(body, pb.SettleAssistantMessageRequest)
    assert refused.value.reason == "TOO_MANY_CONTENT_BLOCKS"
    assert refused.value.metadata["count"] == str(MAX_CONTENT_BLOCKS + 1)
    assert refused.value.metadata["field"] == "message.content"


def test_a_request_padded_with_values_the_plan_does_not_count_is_refused() -> None:
    # An unknown field (protobuf's reader skips it) or a list of numbers costs to parse all
    # the same: a few are fine, a flood is not.
    few = json.dumps({"laneId": "l", "padding": PADDING, "extra": [0] * 100}).encode()
    check_json_counts(few, pb.ListLanesRequest)
    flood = json.dumps({"laneId": "l", "extra": [[]] * MAX_JSON_VALUES}).encode()
    with pytest.raises(InvalidArgument) as refused:
        check_json_counts(flood, pb.ListLanesRequest)
    assert refused.value.reason == "MALFORMED_REQUEST"
    assert refused.value.metadata["limit"] == str(MAX_JSON_VALUES)


def test_deep_nesting_is_refused() -> None:
    body = b'{"pad":"' + PADDING.encode() + b'","x":' + b"[" * (MAX_JSON_DEPTH + 1)
    assert reason(check_json_counts, body, pb.ListLanesRequest) == "MALFORMED_REQUEST"


def test_strings_are_one_value_whatever_they_hold() -> None:
    # Brackets, commas and escaped quotes inside a string are text, not structure.
    tricky = '[{},{}],"\\"{' * 20_000
    request = pb.EnqueueMessageRequest(lane_id="l", message=user(tricky))
    check_json_counts(as_json(request), pb.EnqueueMessageRequest)
    keys = (
        b'{"lane\\u0049d":"l","message":{"user":{"content":['
        + b",".join(
            [b'{"text":{"text":"' + PADDING.encode() + b'"}}'] + [b"{}"] * MAX_CONTENT_BLOCKS
        )
        + b"]}}}"
    )
    assert reason(check_json_counts, keys, pb.EnqueueMessageRequest) == ("TOO_MANY_CONTENT_BLOCKS")


def test_small_requests_and_text_that_is_not_json_are_left_to_the_parser() -> None:
    small = b'{"message":{"content":[' + b",".join([b"{}"] * 300) + b"]}}"
    assert len(small) <= CHECKED_FROM_BYTES
    check_json_counts(small, pb.SettleAssistantMessageRequest)
    for garbage in [b"]]]}}}" + PADDING.encode(), b'{"a":' + PADDING.encode(), b"\xff" * 2000]:
        check_json_counts(garbage, pb.SettleAssistantMessageRequest)
