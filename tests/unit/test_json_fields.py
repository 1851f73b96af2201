"""Free-form JSON fields (``*_json`` strings) round-trip unchanged; google.protobuf.Struct does not.

docs/contract.md: tool arguments, details and custom data must round-trip unchanged, integers stay
integers, including beyond 2^53. The protos carry such values as JSON text in string fields
(messages.proto header). These tests pin that down through both protobuf encodings, and record
why ``google.protobuf.Struct`` was not used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2

BIG = 2**53 + 1  # the first integer a double cannot hold
HUGE = 2**64 + 7  # beyond int64 and uint64

# JSON texts as a client might send them; each must come back byte for byte.
JSON_TEXTS = [
    "1",
    '{"n":1}',
    '{"n":1.0}',
    '{"count":0,"neg":-1,"zero_float":0.0}',
    f'{{"big":{BIG}}}',
    f'{{"huge":{HUGE}}}',
    f'{{"neg_big":-{BIG},"neg_huge":-{HUGE}}}',
    '{"ratio":0.1,"third":0.3333333333333333,"exp":1e-7,"large":1.7976931348623157e308}',
    '{"nested":{"list":[1,2.5,"three",null,true,false,{"deep":[[]]}],"empty":{}}}',
    '{"path":"docs/\u00e9t\u00e9.md","snow":"\u2603","emoji":"\U0001f600","cjk":"\u6f22\u5b57"}',
    '{"escaped":"docs/\\u00e9t\\u00e9.md","quote":"\\"","nl":"a\\nb","ctrl":"\\u0001"}',
    '{ "spaced" : [ 1 , 2 ] ,\n  "order": "kept", "a": 0 }',
    '{"z":1,"a":2,"m":3}',
    "[]",
    '"just a string"',
    "null",
]

# (message factory, setter of the field under test, getter) for every free-form JSON field kind.
Field = tuple[
    Callable[[], Message],
    Callable[[Message, str], None],
    Callable[[Message], str],
]


def _tool_call() -> Field:
    def make() -> Message:
        return messages_pb2.ContentBlock(tool_call=messages_pb2.ToolCallContent(id="c", name="n"))

    def put(m: Message, t: str) -> None:
        assert isinstance(m, messages_pb2.ContentBlock)
        m.tool_call.arguments_json = t

    def get(m: Message) -> str:
        assert isinstance(m, messages_pb2.ContentBlock)
        return m.tool_call.arguments_json

    return make, put, get


def _tool_start() -> Field:
    def make() -> Message:
        return events_pb2.HarnessEvent(
            lane_id="l", revision=1, tool_start=events_pb2.ToolStartEvent(tool_call_id="c")
        )

    def put(m: Message, t: str) -> None:
        assert isinstance(m, events_pb2.HarnessEvent)
        m.tool_start.arguments_json = t

    def get(m: Message) -> str:
        assert isinstance(m, events_pb2.HarnessEvent)
        return m.tool_start.arguments_json

    return make, put, get


def _running_row() -> Field:
    def make() -> Message:
        return snapshot_pb2.LaneSnapshot(
            operation=snapshot_pb2.SnapshotOperation(
                running_tools=[
                    snapshot_pb2.SnapshotTool(running=snapshot_pb2.RunningTool(tool_call_id="c"))
                ]
            )
        )

    def put(m: Message, t: str) -> None:
        assert isinstance(m, snapshot_pb2.LaneSnapshot)
        m.operation.running_tools[0].running.arguments_json = t

    def get(m: Message) -> str:
        assert isinstance(m, snapshot_pb2.LaneSnapshot)
        return m.operation.running_tools[0].running.arguments_json

    return make, put, get


def _tool_result_details() -> Field:
    def make() -> Message:
        return events_pb2.ToolEndEvent(result=messages_pb2.ToolResult())

    def put(m: Message, t: str) -> None:
        assert isinstance(m, events_pb2.ToolEndEvent)
        m.result.details_json = t

    def get(m: Message) -> str:
        assert isinstance(m, events_pb2.ToolEndEvent)
        assert m.result.HasField("details_json")
        return m.result.details_json

    return make, put, get


def _tool_result_message_details() -> Field:
    def make() -> Message:
        return messages_pb2.AgentMessage(tool_result=messages_pb2.ToolResultMessage())

    def put(m: Message, t: str) -> None:
        assert isinstance(m, messages_pb2.AgentMessage)
        m.tool_result.details_json = t

    def get(m: Message) -> str:
        assert isinstance(m, messages_pb2.AgentMessage)
        return m.tool_result.details_json

    return make, put, get


def _custom_entry_data() -> Field:
    def make() -> Message:
        return entries_pb2.Entry(id="e", custom=entries_pb2.CustomEntry(custom_type="t"))

    def put(m: Message, t: str) -> None:
        assert isinstance(m, entries_pb2.Entry)
        m.custom.data_json = t

    def get(m: Message) -> str:
        assert isinstance(m, entries_pb2.Entry)
        assert m.custom.HasField("data_json")
        return m.custom.data_json

    return make, put, get


def _custom_message_data() -> Field:
    def make() -> Message:
        return messages_pb2.CustomMessage(role="r")

    def put(m: Message, t: str) -> None:
        assert isinstance(m, messages_pb2.CustomMessage)
        m.data_json = t

    def get(m: Message) -> str:
        assert isinstance(m, messages_pb2.CustomMessage)
        return m.data_json

    return make, put, get


FIELDS = {
    "ToolCallContent.arguments_json": _tool_call(),
    "ToolStartEvent.arguments_json": _tool_start(),
    "RunningTool.arguments_json": _running_row(),
    "ToolResult.details_json": _tool_result_details(),
    "ToolResultMessage.details_json": _tool_result_message_details(),
    "CustomEntry.data_json": _custom_entry_data(),
    "CustomMessage.data_json": _custom_message_data(),
}


def assert_same_json(actual: Any, expected: Any) -> None:
    """Strict JSON equality: unlike ``==``, 1 and 1.0 (and True and 1) differ."""
    assert type(actual) is type(expected), (actual, expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)  # same keys, same order
        for key in expected:
            assert_same_json(actual[key], expected[key])
    elif isinstance(expected, list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same_json(a, e)
    else:
        assert actual == expected


def _via_binary(message: Message) -> Message:
    copy = type(message)()
    copy.ParseFromString(message.SerializeToString())
    return copy


def _via_json_mapping(message: Message) -> Message:
    text = json_format.MessageToJson(message)
    return json_format.Parse(text, type(message)())


def _via_json_mapping_ascii_dict(message: Message) -> Message:
    # Through a dict and the stdlib encoder with ASCII escaping, as another language might.
    text = json.dumps(json_format.MessageToDict(message), ensure_ascii=True)
    return json_format.ParseDict(json.loads(text), type(message)())


ROUND_TRIPS = {
    "binary": _via_binary,
    "json-mapping": _via_json_mapping,
    "json-mapping-ascii": _via_json_mapping_ascii_dict,
}


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("json_text", JSON_TEXTS)
def test_json_text_round_trips_byte_for_byte(json_text: str, field: str, round_trip: str) -> None:
    make, put, get = FIELDS[field]
    message = make()
    put(message, json_text)

    back = ROUND_TRIPS[round_trip](message)

    assert get(back) == json_text
    assert back == message
    assert_same_json(json.loads(get(back)), json.loads(json_text))


def test_integers_stay_integers_through_both_encodings() -> None:
    value = {
        "one": 1,
        "big": BIG,
        "huge": HUGE,
        "neg_big": -BIG,
        "neg_huge": -HUGE,
        "nested": {"list": [1, 2, {"three": 3}]},
        "float": 0.1,
        "one_float": 1.0,
        "text": "\u00e9\u2603\U0001f600",
    }
    call = messages_pb2.ToolCallContent(id="c", name="n", arguments_json=json.dumps(value))
    for back in (_via_binary(call), _via_json_mapping(call)):
        assert isinstance(back, messages_pb2.ToolCallContent)
        decoded = json.loads(back.arguments_json)
        assert_same_json(decoded, value)
        assert decoded["one"] == 1 and type(decoded["one"]) is int
        assert decoded["big"] == 9007199254740993
        assert decoded["huge"] == 18446744073709551623
        assert decoded["neg_huge"] == -18446744073709551623
        assert decoded["float"] == 0.1 and type(decoded["float"]) is float
        assert type(decoded["one_float"]) is float


def test_assert_same_json_tells_int_from_float() -> None:
    # The helper itself must be strict, or the tests above would prove nothing.
    with pytest.raises(AssertionError):
        assert_same_json({"n": 1.0}, {"n": 1})
    with pytest.raises(AssertionError):
        assert_same_json([True], [1])


# --- why not google.protobuf.Struct ------------------------------------------------------------


def _through_struct(value: dict[str, Any]) -> dict[str, Any]:
    struct = json_format.ParseDict(value, struct_pb2.Struct())
    back = _via_binary(struct)
    return json_format.MessageToDict(back)


def test_struct_turns_integer_one_into_float() -> None:
    back = _through_struct({"n": 1, "nested": {"list": [1, 2]}})
    assert back == {"n": 1.0, "nested": {"list": [1.0, 2.0]}}  # equal under Python's ==
    assert type(back["n"]) is float  # but 1 became 1.0
    assert type(back["nested"]["list"][0]) is float
    # Re-encoded, the text says 1.0. (Struct is a map: it does not keep key order either.)
    assert json.dumps(back, sort_keys=True) == '{"n": 1.0, "nested": {"list": [1.0, 2.0]}}'
    with pytest.raises(AssertionError):
        assert_same_json(back, {"n": 1, "nested": {"list": [1, 2]}})


@pytest.mark.parametrize("integer", [BIG, -BIG, HUGE, -HUGE])
def test_struct_loses_integers_beyond_2_to_the_53(integer: int) -> None:
    back = _through_struct({"n": integer})
    assert type(back["n"]) is float
    assert int(back["n"]) != integer  # precision is gone
    # The same value as JSON text survives exactly.
    row = snapshot_pb2.RunningTool(arguments_json=json.dumps({"n": integer}))
    for again in (_via_binary(row), _via_json_mapping(row)):
        assert isinstance(again, snapshot_pb2.RunningTool)
        assert json.loads(again.arguments_json)["n"] == integer
