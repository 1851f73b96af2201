"""Free-form JSON (tool arguments, details, custom data) travels as JSON text in string fields
(``*_json``), never as ``google.protobuf.Struct``: a Struct holds numbers as doubles, so 1
comes back 1.0 and integers beyond 2^53 lose precision, while docs/contract.md promises these
values round-trip unchanged. This pins the schema to that choice; that the service keeps the
texts byte for byte is tests/integration/test_json_round_trip.py.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from lane.v1 import (
    entries_pb2,
    events_pb2,
    lane_service_pb2,
    messages_pb2,
    snapshot_pb2,
)

FILES = (entries_pb2, events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2)
#: Numbers as doubles: never for free-form JSON.
LOSSY = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def messages() -> Iterator[Descriptor]:
    """Every message of the contract, nested ones included."""

    def walk(descriptor: Descriptor) -> Iterator[Descriptor]:
        yield descriptor
        for nested in descriptor.nested_types:
            yield from walk(nested)

    for module in FILES:
        for descriptor in module.DESCRIPTOR.message_types_by_name.values():
            yield from walk(descriptor)


def test_every_json_field_is_text() -> None:
    json_fields = [
        (message.full_name, field)
        for message in messages()
        for field in message.fields
        if field.name.endswith("_json")
    ]
    # The fields the contract names (a rename or a new one shows up here).
    names = {f"{owner}.{field.name}" for owner, field in json_fields}
    assert {
        "lane.v1.ToolCallContent.arguments_json",
        "lane.v1.ToolResult.details_json",
        "lane.v1.ToolResultMessage.details_json",
        "lane.v1.CustomEntry.data_json",
        "lane.v1.CustomMessage.data_json",
        "lane.v1.StartToolCallRequest.arguments_json",
    } <= names
    wrong = [
        f"{owner}.{field.name}"
        for owner, field in json_fields
        if field.type != FieldDescriptor.TYPE_STRING
    ]
    assert wrong == []


def test_no_message_carries_json_as_a_struct() -> None:
    lossy = [
        f"{message.full_name}.{field.name}"
        for message in messages()
        for field in message.fields
        if field.message_type is not None and field.message_type.full_name in LOSSY
    ]
    assert lossy == []
