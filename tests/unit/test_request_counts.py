"""Request counting and walking (service/lane/server/api/validation.py).

:func:`check_counts` runs on every decoded request before anything walks it: it reads the
lengths of repeated fields and visits messages only, so a request over a count is refused
however many blocks it holds. :func:`check_message` walks only the fields that can fail; it
refuses exactly what the plain walk over every field did (kept here as the reference).
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.limits import (
    MAX_CONTENT_BLOCKS,
    MAX_PAYLOAD_BYTES,
    MAX_REQUEST_MESSAGES,
    MAX_TOOL_CALLS,
    MAX_TOOL_NAMES,
)


def text(value: str = "") -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def call(call_id: str, arguments: str = "{}") -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(
        tool_call=messages_pb2.ToolCallContent(id=call_id, name="t", arguments_json=arguments)
    )


def refusal(check: object, *args: object, **kwargs: object) -> InvalidArgument | None:
    try:
        check(*args, **kwargs)  # type: ignore[operator]
    except InvalidArgument as error:
        return error
    return None


# -- counts ------------------------------------------------------------------------------------


def test_every_repeated_field_of_a_request_is_counted_as_what_it_holds() -> None:
    # A new repeated field must be given a count (and a limit) on purpose.
    found: dict[str, str] = {}
    seen: set[str] = set()

    def walk(descriptor: object) -> None:
        name = descriptor.full_name  # type: ignore[attr-defined]
        if name in seen:
            return
        seen.add(name)
        for field in descriptor.fields:  # type: ignore[attr-defined]
            if field.full_name == "lane.v1.DriveLaneRequest.batch":
                continue  # not one request's: each request of a batch is counted alone
            if field.is_repeated:
                found[field.full_name] = v._counted_as(field)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                walk(field.message_type)

    for method in pb.DESCRIPTOR.services_by_name["LaneService"].methods:
        walk(method.input_type)
    assert found == {
        "lane.v1.AssistantMessage.content": "blocks",
        "lane.v1.UserMessage.content": "blocks",
        "lane.v1.ToolResultMessage.content": "blocks",
        "lane.v1.ToolResult.content": "blocks",
        "lane.v1.StartRunRequest.prompt": "messages",
        "lane.v1.AppendAssistantStreamRequest.partials": "messages",
        "lane.v1.CompactionEntry.retained_tail": "messages",
        "lane.v1.LaneConfiguration.active_tool_names": "names",
        "lane.v1.ToolNames.names": "names",
        "lane.v1.ToolResult.added_tool_names": "names",
        "lane.v1.ToolResultMessage.added_tool_names": "names",
        "lane.v1.ListLanesRequest.statuses": "filters",
        "lane.v1.WatchLanesRequest.statuses": "filters",
        "lane.v1.WatchLanesRequest.lane_ids": "filters",
    }


def test_a_drive_batch_is_neither_counted_nor_walked_as_one_request() -> None:
    # The service splits a DriveLane message's batch and counts each request alone
    # (api/drive.py), so the count walk never nests a request in itself.
    plan = v.count_plan(pb.DriveLaneRequest.DESCRIPTOR)
    names = {field.name for field, _ in plan.repeated} | {field.name for field in plan.descend}
    assert "batch" not in names
    assert "settle_assistant_message" in names  # the commands are walked as before


def settle(*blocks: messages_pb2.ContentBlock) -> pb.SettleAssistantMessageRequest:
    request = pb.SettleAssistantMessageRequest(lane_id="l", operation_id="o", turn_id="t")
    request.message.content.extend(blocks)
    return request


def test_tool_calls_are_counted_per_assistant_message() -> None:
    v.check_counts(settle(*(call(f"c{i}") for i in range(MAX_TOOL_CALLS))))
    error = refusal(v.check_counts, settle(*(call(f"c{i}") for i in range(MAX_TOOL_CALLS + 1))))
    assert error is not None and error.reason == "TOO_MANY_TOOL_CALLS"
    assert error.metadata == {
        "field": "message.content",
        "count": str(MAX_TOOL_CALLS + 1),
        "limit": str(MAX_TOOL_CALLS),
    }
    # In streamed partials too, each partial on its own.
    partials = pb.AppendAssistantStreamRequest(
        partials=[
            pb.StreamedPartial(message=messages_pb2.AssistantMessage(content=[call("a")] * n))
            for n in (MAX_TOOL_CALLS, MAX_TOOL_CALLS + 1)
        ]
    )
    error = refusal(v.check_counts, partials)
    assert error is not None and error.reason == "TOO_MANY_TOOL_CALLS"
    assert error.metadata["field"] == "partials[1].message.content"


def test_content_blocks_are_counted_over_the_whole_request_before_any_walk() -> None:
    v.check_counts(settle(*[text()] * MAX_CONTENT_BLOCKS))
    error = refusal(v.check_counts, settle(*[text()] * 1_000_000))
    assert error is not None and error.reason == "TOO_MANY_CONTENT_BLOCKS"
    assert error.metadata == {
        "field": "message.content",
        "count": "1000000",
        "limit": str(MAX_CONTENT_BLOCKS),
    }
    half = messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(content=[text()] * (MAX_CONTENT_BLOCKS // 2))
    )
    v.check_counts(pb.StartRunRequest(prompt=[half, half]))
    error = refusal(v.check_counts, pb.StartRunRequest(prompt=[half, half, user_message()]))
    assert error is not None and error.reason == "TOO_MANY_CONTENT_BLOCKS"
    assert error.metadata["field"] == "prompt[2].user.content"


def user_message() -> messages_pb2.AgentMessage:
    return messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text("x")]))


def test_messages_and_tool_names_are_counted() -> None:
    prompt = [user_message()] * MAX_REQUEST_MESSAGES
    v.check_counts(pb.StartRunRequest(prompt=prompt))
    error = refusal(v.check_counts, pb.StartRunRequest(prompt=[*prompt, user_message()]))
    assert error is not None and error.reason == "TOO_MANY_MESSAGES"
    tail = entries_pb2.CompactionEntry(summary="s", retained_tail=[*prompt, user_message()])
    error = refusal(v.check_counts, pb.CompactRunRequest(entry=tail))
    assert error is not None and error.metadata["field"] == "entry.retained_tail"
    names = [f"t{i}" for i in range(MAX_TOOL_NAMES + 1)]
    outcome = pb.StageToolOutcomeRequest(
        executed=pb.ExecutedOutcome(result=messages_pb2.ToolResult(added_tool_names=names))
    )
    error = refusal(v.check_counts, outcome)
    assert error is not None and error.reason == "TOO_MANY_TOOL_NAMES"
    assert error.metadata["field"] == "executed.result.added_tool_names"
    configuration = pb.CreateLaneRequest(
        configuration=snapshot_pb2.LaneConfiguration(active_tool_names=names[:-1])
    )
    v.check_counts(configuration)


# -- the walk refuses what the plain walk refused ---------------------------------------------


def reference_check_message(
    message: Message, path: str, *, skip_json: frozenset[str] = frozenset()
) -> None:
    """The walk over every field that check_message replaced (before the count limits)."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        values = value if field.is_repeated else [value]
        for index, item in enumerate(values):
            at = f"{where}[{index}]" if field.is_repeated else where
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                reference_check_message(item, at, skip_json=skip_json)
                kind = field.message_type
                limit = v.PAYLOAD_LIMITS.get(kind.full_name) if kind is not None else None
                if limit is not None and (size := item.ByteSize()) > limit:
                    raise v.payload_too_large(at, size, limit)
            elif field.type == FieldDescriptor.TYPE_ENUM:
                enum = field.enum_type
                if enum is None or enum.values_by_number.get(item) is None:
                    raise InvalidArgument(
                        "UNKNOWN_ENUM_VALUE", f"{at} has unknown value {item}", field=at
                    )
            else:
                if field.full_name in v.TEXT_PAYLOAD_FIELDS and (
                    (size := len(item.encode())) > MAX_PAYLOAD_BYTES
                ):
                    raise v.payload_too_large(at, size, MAX_PAYLOAD_BYTES)
                if field.name.endswith("_json") and field.name not in skip_json:
                    v.parse_json(item, at)


jsons = st.sampled_from(['{"a":1}', "[]", "{", "", "NaN", '"s"', "{} x"])
enum_values = st.integers(0, 9)


@st.composite
def blocks(draw: st.DrawFn) -> messages_pb2.ContentBlock:
    kind = draw(st.sampled_from(["text", "thinking", "image", "tool_call"]))
    if kind == "text":
        return text(draw(st.text(max_size=5)))
    if kind == "thinking":
        return messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent(thinking="t"))
    if kind == "image":
        return messages_pb2.ContentBlock(image=messages_pb2.ImageContent(data="d"))
    return call(draw(st.text(max_size=3)), draw(jsons))


@st.composite
def agent_messages(draw: st.DrawFn) -> messages_pb2.AgentMessage:
    content = draw(st.lists(blocks(), max_size=4))
    kind = draw(st.sampled_from(["user", "assistant", "tool_result", "custom"]))
    if kind == "user":
        return messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=content))
    if kind == "assistant":
        message = messages_pb2.AssistantMessage(content=content, stop_reason=draw(enum_values))  # type: ignore[arg-type]
        if draw(st.booleans()):
            message.diagnostics_json = draw(jsons)
        return messages_pb2.AgentMessage(assistant=message)
    if kind == "tool_result":
        result = messages_pb2.ToolResultMessage(content=content, details_json=draw(jsons))
        return messages_pb2.AgentMessage(tool_result=result)
    return messages_pb2.AgentMessage(
        custom=messages_pb2.CustomMessage(role="r", data_json=draw(jsons))
    )


@st.composite
def requests(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["settle", "start", "stage", "enqueue", "compact", "config"]))
    if kind == "settle":
        message = messages_pb2.AssistantMessage(
            content=draw(st.lists(blocks(), max_size=6)),
            stop_reason=draw(enum_values),  # type: ignore[arg-type]
        )
        return pb.SettleAssistantMessageRequest(message=message)
    if kind == "start":
        return pb.StartRunRequest(prompt=draw(st.lists(agent_messages(), max_size=3)))
    if kind == "stage":
        result = messages_pb2.ToolResult(content=draw(st.lists(blocks(), max_size=3)))
        if draw(st.booleans()):
            result.details_json = draw(jsons)
        return pb.StageToolOutcomeRequest(executed=pb.ExecutedOutcome(result=result))
    if kind == "enqueue":
        return pb.EnqueueMessageRequest(kind=draw(enum_values), message=draw(agent_messages()))  # type: ignore[arg-type]
    if kind == "compact":
        entry = entries_pb2.CompactionEntry(
            summary="s", retained_tail=draw(st.lists(agent_messages(), max_size=3))
        )
        if draw(st.booleans()):
            entry.details_json = draw(jsons)
        return pb.CompactRunRequest(entry=entry)
    configuration = snapshot_pb2.LaneConfiguration(thinking_level=draw(enum_values))  # type: ignore[arg-type]
    return pb.CreateLaneRequest(configuration=configuration)


def outcome(check: object, request: Message, skip_json: frozenset[str]) -> tuple[str, str] | None:
    error = refusal(check, request, "", skip_json=skip_json)
    return None if error is None else (error.reason, error.metadata.get("field", ""))


@given(requests(), st.sampled_from([frozenset(), frozenset({"arguments_json"})]))
@settings(max_examples=400, deadline=None)
def test_check_message_refuses_what_the_plain_walk_refused(
    request: Message, skip_json: frozenset[str]
) -> None:
    expected = outcome(reference_check_message, request, skip_json)
    assert outcome(v.check_message, request, skip_json) == expected


@pytest.mark.parametrize("size", [MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES + 1])
def test_a_payload_nested_anywhere_is_measured(size: int) -> None:
    padded = messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text("x")]))
    for _ in range(5):  # the length prefixes grow with the text: converge on the exact size
        block = padded.user.content[0].text
        block.text = "x" * (len(block.text) + size - padded.ByteSize())
    assert padded.ByteSize() == size
    request = pb.StartRunRequest(prompt=[user_message(), padded])
    expected = outcome(reference_check_message, request, frozenset())
    assert outcome(v.check_message, request, frozenset()) == expected
    assert expected == (None if size == MAX_PAYLOAD_BYTES else ("PAYLOAD_TOO_LARGE", "prompt[1]"))
