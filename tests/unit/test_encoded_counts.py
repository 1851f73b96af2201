"""Counts read from a large request's bytes before it is decoded
(service/lane/server/api/encoded_counts.py): the same refusals as counting the decoded request,
without decoding a request that holds too many elements."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from lane.client.testing import text, tool_call
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

from lane.server.api.encoded_counts import (
    CHECKED_FROM_BYTES,
    MAX_OTHER_FIELDS,
    check_encoded_counts,
)
from lane.server.api.framing import length_delimited, varint
from lane.server.api.validation import check_counts, count_plan
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.limits import MAX_CONTENT_BLOCKS
from tests.unit import counted_requests
from tests.unit.counted_requests import BLOCKS, KINDS, MESSAGES, NAMES, near_the_limits, reason

#: Text that takes a request past the size from which its bytes are counted.
PADDING = "x" * CHECKED_FROM_BYTES


def field_number(message: type[Message], name: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[name].number
    return number


def settle(blocks: list[messages_pb2.ContentBlock]) -> pb.SettleAssistantMessageRequest:
    return counted_requests.settle(PADDING, blocks)


@settings(max_examples=40, deadline=None)
@given(
    blocks=BLOCKS,
    messages=MESSAGES,
    names=NAMES,
    kind=st.sampled_from([*KINDS, "drive"]),
)
def test_a_large_request_is_refused_from_its_bytes_exactly_when_its_decoded_counts_are(
    blocks: int, messages: int, names: int, kind: str
) -> None:
    request: Message
    if kind == "drive":
        inner = settle([text("") for _ in range(blocks - 1)])
        request = pb.DriveLaneRequest(sequence=1, settle_assistant_message=inner)
    else:
        request = near_the_limits(kind, PADDING, blocks, messages, names)
    data = request.SerializeToString()
    assert len(data) > CHECKED_FROM_BYTES
    decoded = type(request).FromString(data)
    assert reason(check_encoded_counts, data, type(request)) == reason(check_counts, decoded)


def test_a_million_empty_blocks_are_refused_after_counting_one_past_the_limit() -> None:
    request = settle([])
    request.message.content.extend([text("")] * 1_000_000)
    with pytest.raises(InvalidArgument) as refused:
        check_encoded_counts(request.SerializeToString(), pb.SettleAssistantMessageRequest)
    assert refused.value.reason == "TOO_MANY_CONTENT_BLOCKS"
    assert refused.value.metadata["count"] == str(MAX_CONTENT_BLOCKS + 1)
    assert refused.value.metadata["field"] == "message.content"
    assert "at least" in str(refused.value)


def test_a_request_padded_with_unknown_fields_is_refused() -> None:
    # Field 1000 is unknown to every request: a newer client's few are fine, a flood is not.
    unknown = varint(1000 << 3) + varint(1)
    base = settle([]).SerializeToString()
    check_encoded_counts(base + unknown * 16, pb.SettleAssistantMessageRequest)
    with pytest.raises(InvalidArgument) as refused:
        check_encoded_counts(
            base + unknown * (MAX_OTHER_FIELDS + 1), pb.SettleAssistantMessageRequest
        )
    assert refused.value.reason == "MALFORMED_REQUEST"


def test_blocks_sent_in_several_occurrences_of_one_message_are_added_up() -> None:
    # Protobuf merges repeated occurrences of a singular message: their blocks add up.
    half = messages_pb2.AssistantMessage(content=[text("")] * (MAX_CONTENT_BLOCKS // 2 + 1))
    number = field_number(pb.SettleAssistantMessageRequest, "message")
    data = settle([]).SerializeToString() + 2 * length_delimited(number, half.SerializeToString())
    assert reason(check_encoded_counts, data, pb.SettleAssistantMessageRequest) == (
        "TOO_MANY_CONTENT_BLOCKS"
    )
    decoded = pb.SettleAssistantMessageRequest.FromString(data)
    assert reason(check_counts, decoded) == "TOO_MANY_CONTENT_BLOCKS"


def test_tool_calls_are_left_to_the_decoded_count() -> None:
    # Tool calls are blocks: within the block limit the request is decoded and counted there.
    request = settle([tool_call(f"c{i}", "t", {}) for i in range(3000)])
    data = request.SerializeToString()
    check_encoded_counts(data, pb.SettleAssistantMessageRequest)
    assert reason(check_counts, request) == "TOO_MANY_TOOL_CALLS"


def test_small_requests_and_invalid_bytes_are_left_to_the_decoder() -> None:
    small = pb.SettleAssistantMessageRequest(
        message=messages_pb2.AssistantMessage(content=[text("")] * (MAX_CONTENT_BLOCKS + 1))
    ).SerializeToString()
    assert len(small) <= CHECKED_FROM_BYTES
    check_encoded_counts(small, pb.SettleAssistantMessageRequest)  # check_counts refuses it
    truncated = settle([]).SerializeToString()[:-1]
    check_encoded_counts(truncated, pb.SettleAssistantMessageRequest)
    group = settle([]).SerializeToString() + varint(1000 << 3 | 3)
    check_encoded_counts(group, pb.SettleAssistantMessageRequest)


def test_no_request_type_that_holds_a_count_holds_itself() -> None:
    # The walk recurses once per nested message: a type that held itself would let a request
    # nest as deep as its bytes allow. A proto change that adds one must bound the walk first.
    def walk(descriptor: Descriptor, seen: tuple[str, ...]) -> None:
        assert descriptor.full_name not in seen, " -> ".join((*seen, descriptor.full_name))
        for field in count_plan(descriptor).descend:
            assert field.message_type is not None
            walk(field.message_type, (*seen, descriptor.full_name))

    for method in pb.DESCRIPTOR.services_by_name["LaneService"].methods:
        walk(method.input_type, ())
