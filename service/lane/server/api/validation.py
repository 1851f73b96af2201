"""Request validation: malformed input is refused with INVALID_ARGUMENT before any I/O.

Every decoded request is first counted (:func:`check_counts`, run by the servicer before any
handler): its content blocks, messages, tool names and each assistant message's tool calls,
read with ``len`` of the repeated fields, never by walking blocks. Only a request within those
counts is walked: besides the per-RPC checks, :func:`check_message` refuses unknown enum
values, ``*_json`` fields that are not JSON and payloads over their size limit (see
``service/lane/server/domain/limits.py``), wherever they are nested. It descends only where such a
field can be (a plan per message type, from the descriptors): text blocks and tool-name lists are
never visited one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from lane.limits import (
    DEFAULT_PAGE_SIZE,
    MAX_LANE_FILTERS,
    MAX_LEASE_SECONDS,
    MAX_PAGE_SIZE,
)
from lane.v1 import entries_pb2, lane_service_pb2, messages_pb2

from lane.server.domain.errors import InvalidArgument
from lane.server.domain.jsontext import parse_json, require_json_object
from lane.server.domain.limits import (
    MAX_CONTENT_BLOCKS,
    MAX_ERROR_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_REQUEST_MESSAGES,
    MAX_TOOL_CALLS,
    MAX_TOOL_NAMES,
)

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_LEASE_SECONDS",
    "MAX_PAGE_SIZE",
    "parse_json",
    "require_json_object",
]

MAX_ID_BYTES = 128

#: Request messages whose encoding is one payload, with its limit (INVALID_ARGUMENT
#: ``PAYLOAD_TOO_LARGE``): a prompt or queued message, an assistant message (settled, streamed
#: partial, failed), a tool result (progress, outcome), a synthetic outcome, an entry, a
#: deferred handle, an operation error. Wherever they are nested in a request.
PAYLOAD_LIMITS: dict[str, int] = {
    "lane.v1.AgentMessage": MAX_PAYLOAD_BYTES,
    "lane.v1.AssistantMessage": MAX_PAYLOAD_BYTES,
    "lane.v1.ToolResult": MAX_PAYLOAD_BYTES,
    "lane.v1.SyntheticOutcome": MAX_PAYLOAD_BYTES,
    "lane.v1.CustomEntry": MAX_PAYLOAD_BYTES,
    "lane.v1.CompactionEntry": MAX_PAYLOAD_BYTES,
    "lane.v1.BranchSummaryEntry": MAX_PAYLOAD_BYTES,
    "lane.v1.DeferredState": MAX_PAYLOAD_BYTES,
    "lane.v1.OperationError": MAX_ERROR_BYTES,
}
#: Text fields that are one payload (UTF-8 bytes): a tool call's effective arguments.
TEXT_PAYLOAD_FIELDS = frozenset({"lane.v1.StartToolCallRequest.arguments_json"})


def payload_too_large(field: str, size: int, limit: int) -> InvalidArgument:
    """The refusal of one payload over its limit."""
    return InvalidArgument(
        "PAYLOAD_TOO_LARGE",
        f"{field} is {size} bytes encoded; the limit is {limit}",
        field=field,
        bytes=size,
        limit=limit,
    )


def require_id(value: str, field: str, *, optional: bool = False) -> None:
    """Refuse an empty (unless ``optional``), oversized or non-printable identifier."""
    if not value:
        if optional:
            return
        raise InvalidArgument("MISSING_FIELD", f"{field} is required", field=field)
    if len(value.encode()) > MAX_ID_BYTES or not value.isprintable() or value.strip() != value:
        raise InvalidArgument(
            "INVALID_ID",
            f"{field} must be 1-{MAX_ID_BYTES} bytes of printable text without surrounding spaces",
            field=field,
        )


def require_ids(request: Message, *fields: str) -> None:
    """:func:`require_id` on each of the request's ``fields``, in order (all required)."""
    for field in fields:
        require_id(getattr(request, field), field)


def ids(*fields: str) -> Callable[[Message], None]:
    """The check of a request whose only rule is :func:`require_ids` on ``fields``."""
    return lambda request: require_ids(request, *fields)


def require(condition: bool, reason: str, message: str, field: str) -> None:
    """Refuse with INVALID_ARGUMENT unless ``condition``."""
    if not condition:
        raise InvalidArgument(reason, message, field=field)


# -- counts ------------------------------------------------------------------------------------

_CONTENT_BLOCK = messages_pb2.ContentBlock.DESCRIPTOR.full_name
_ASSISTANT = messages_pb2.AssistantMessage.DESCRIPTOR.full_name
_BLOCKS, _MESSAGES, _NAMES, _FILTERS = "blocks", "messages", "names", "filters"
#: The lane filters of ListLanes and WatchLanes requests.
_FILTER_FIELDS = frozenset(
    {
        lane_service_pb2.ListLanesRequest.DESCRIPTOR.fields_by_name["statuses"].full_name,
        lane_service_pb2.WatchLanesRequest.DESCRIPTOR.fields_by_name["statuses"].full_name,
        lane_service_pb2.WatchLanesRequest.DESCRIPTOR.fields_by_name["lane_ids"].full_name,
    }
)
#: Not part of one request: a DriveLane message's batch is split by the service, and each of
#: its requests counted alone, as a message of its own (api/drive.py); so the walk never nests
#: a request in itself.
_BATCHES = frozenset(
    {
        lane_service_pb2.DriveLaneRequest.DESCRIPTOR.fields_by_name["batch"].full_name,
        lane_service_pb2.DriveLaneResponse.DESCRIPTOR.fields_by_name["batch"].full_name,
    }
)
#: What a repeated field's values count as: content blocks; messages (StartRun prompts,
#: AppendAssistantStream partials, a compaction's retained tail); tool names (a
#: configuration's active tools, a result's added tools); lane filters (the lane ids and
#: statuses a lane list asks for). Every repeated field a request can hold is one of them
#: (tests/unit/test_request_counts.py keeps the list).
COUNT_LIMITS = {
    _BLOCKS: ("TOO_MANY_CONTENT_BLOCKS", MAX_CONTENT_BLOCKS, "content blocks"),
    _MESSAGES: ("TOO_MANY_MESSAGES", MAX_REQUEST_MESSAGES, "messages"),
    _NAMES: ("TOO_MANY_TOOL_NAMES", MAX_TOOL_NAMES, "tool names"),
    _FILTERS: ("TOO_MANY_LANE_IDS", MAX_LANE_FILTERS, "lane ids and statuses"),
}


def _counted_as(field: FieldDescriptor) -> str:
    if field.full_name in _FILTER_FIELDS:
        return _FILTERS
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return _NAMES
    assert field.message_type is not None
    return _BLOCKS if field.message_type.full_name == _CONTENT_BLOCK else _MESSAGES


@dataclass(frozen=True)
class _CountPlan:
    """Where a message type's counted fields are: its repeated fields (each counted with
    ``len``), and the message fields to descend into (those that can hold one)."""

    repeated: tuple[tuple[FieldDescriptor, str], ...]
    descend: tuple[FieldDescriptor, ...]


@cache
def count_plan(descriptor: Descriptor) -> _CountPlan:
    """Where a message of this type holds counted values, and which of its fields to visit."""
    repeated: list[tuple[FieldDescriptor, str]] = []
    descend: list[FieldDescriptor] = []
    for field in descriptor.fields:
        if field.full_name in _BATCHES:
            continue
        if field.is_repeated:
            repeated.append((field, _counted_as(field)))
            kind = field.message_type
            if kind is not None and kind.full_name != _CONTENT_BLOCK and _holds_counts(kind):
                descend.append(field)
        elif field.message_type is not None and _holds_counts(field.message_type):
            descend.append(field)
    return _CountPlan(tuple(repeated), tuple(descend))


@cache
def _holds_counts(descriptor: Descriptor, _seen: frozenset[str] = frozenset()) -> bool:
    """Whether a message of this type can hold a repeated field, however deep."""
    if descriptor.full_name in _seen:
        return False
    seen = _seen | {descriptor.full_name}
    for field in descriptor.fields:
        if field.is_repeated:
            return True
        kind = field.message_type
        if kind is not None and _holds_counts(kind, seen):
            return True
    return False


def too_many(what: str, field: str, count: int, *, at_least: bool = False) -> InvalidArgument:
    """The refusal of a request holding ``count`` (``at_least``: counting stopped there)
    values of what ``what`` counts, over its limit; ``field`` is where the limit was passed."""
    reason, limit, label = COUNT_LIMITS[what]
    holds = f"at least {count}" if at_least else f"{count}"
    return InvalidArgument(
        reason,
        f"the request holds {holds} {label} (all its messages together, counted at {field}); "
        f"the limit is {limit}",
        field=field,
        count=count,
        limit=limit,
    )


def check_counts(request: Message) -> None:
    """Refuse a request holding more than MAX_CONTENT_BLOCKS content blocks, MAX_REQUEST_MESSAGES
    messages or MAX_TOOL_NAMES tool names in all, or an assistant message with more than
    MAX_TOOL_CALLS tool calls (INVALID_ARGUMENT ``TOO_MANY_*``; metadata ``field``, ``count``,
    ``limit``).

    Runs before anything else looks into the request. Repeated fields are counted with ``len``
    and only messages are visited, never content blocks (each message visited after the
    message count allowed it), so the work is bounded by the limits, not by what was sent.
    Then, the blocks being few enough, each assistant message's tool calls are counted.
    """
    totals = dict.fromkeys(COUNT_LIMITS, 0)
    assistants: list[tuple[messages_pb2.AssistantMessage, str]] = []

    def visit(message: Message, path: str) -> None:
        plan = count_plan(message.DESCRIPTOR)
        for field, what in plan.repeated:
            count = len(getattr(message, field.name))
            if count:
                totals[what] += count
                if totals[what] > COUNT_LIMITS[what][1]:
                    raise too_many(what, _join(path, field.name), totals[what])
        if message.DESCRIPTOR.full_name == _ASSISTANT:
            assistants.append((message, path))  # type: ignore[arg-type]
        for field in plan.descend:
            at = _join(path, field.name)
            if field.is_repeated:
                for index, item in enumerate(getattr(message, field.name)):
                    visit(item, f"{at}[{index}]")
            elif message.HasField(field.name):
                visit(getattr(message, field.name), at)

    visit(request, "")
    for assistant, path in assistants:
        calls = sum(1 for block in assistant.content if block.WhichOneof("block") == "tool_call")
        if calls > MAX_TOOL_CALLS:
            field = _join(path, "content")
            raise InvalidArgument(
                "TOO_MANY_TOOL_CALLS",
                f"{field} holds {calls} tool calls; an assistant message holds at most "
                f"{MAX_TOOL_CALLS}",
                field=field,
                count=calls,
                limit=MAX_TOOL_CALLS,
            )


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- payloads, enums, JSON --------------------------------------------------------------------


#: A field's place in a request, built into a string only for a refusal: (the parent's
#: place, the field's name, its index in a repeated field or None).
_Path = str | tuple["_Path", str, int | None]


def _where(path: _Path) -> str:
    if isinstance(path, str):
        return path
    parent, name, index = path
    at = _where(parent)
    at = f"{at}.{name}" if at else name
    return at if index is None else f"{at}[{index}]"


#: Checks one value of a field: refuses it, or checks inside it.
_Check = Callable[[Any, _Path], None]


@dataclass(frozen=True)
class _Node:
    """The checks of a message type's fields, by field number: only fields that can fail
    (a payload limit, an enum, JSON or argument text, or a message with such a field inside).
    ``oneof``: when every checked field is a member of one oneof (a content block: only a
    tool call's arguments), its name and those members, so a message holding another member
    is passed by at the cost of one ``WhichOneof``."""

    checks: dict[int, _Check]
    oneof: tuple[str, frozenset[str]] | None


@cache
def _check_node(descriptor: Descriptor, skip_json: frozenset[str]) -> _Node | None:
    """The checks of a message type; None when nothing in a message of this type can fail:
    it is not visited at all."""
    checks: dict[int, _Check] = {}
    names: set[str] = set()
    oneofs: set[str | None] = set()
    for field in descriptor.fields:
        check = _field_check(field, skip_json)
        if check is not None:
            checks[field.number] = check
            names.add(field.name)
            oneofs.add(field.containing_oneof.name if field.containing_oneof else None)
    if not checks:
        return None
    only = next(iter(oneofs)) if len(oneofs) == 1 else None
    return _Node(checks, (only, frozenset(names)) if only is not None else None)


def _field_check(field: FieldDescriptor, skip_json: frozenset[str]) -> _Check | None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        kind = field.message_type
        assert kind is not None
        limit = PAYLOAD_LIMITS.get(kind.full_name)
        # Its content first: a malformed payload gets the more specific reason.
        inner = _check_node(kind, skip_json) if _can_fail(kind, skip_json) else None
        if inner is None and limit is None:
            return None

        def check_payload(item: Message, at: _Path) -> None:
            if inner is not None and (
                inner.oneof is None or item.WhichOneof(inner.oneof[0]) in inner.oneof[1]
            ):
                _walk(item, inner, at)
            if limit is not None and (size := item.ByteSize()) > limit:
                raise payload_too_large(_where(at), size, limit)

        return check_payload
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type

        def check_enum(item: int, at: _Path) -> None:
            if enum is None or enum.values_by_number.get(item) is None:
                where = _where(at)
                raise InvalidArgument(
                    "UNKNOWN_ENUM_VALUE", f"{where} has unknown value {item}", field=where
                )

        return check_enum
    text_payload = field.full_name in TEXT_PAYLOAD_FIELDS
    json_text = field.name.endswith("_json") and field.name not in skip_json
    if not (text_payload or json_text):
        return None

    def check_text(item: str, at: _Path) -> None:
        if text_payload and (size := len(item.encode())) > MAX_PAYLOAD_BYTES:
            raise payload_too_large(_where(at), size, MAX_PAYLOAD_BYTES)
        if json_text:
            parse_json(item, _where(at))

    return check_text


@cache
def _can_fail(
    descriptor: Descriptor, skip_json: frozenset[str], _seen: frozenset[str] = frozenset()
) -> bool:
    """Whether :func:`check_message` can refuse anything inside a message of this type."""
    if descriptor.full_name in _seen:
        return False
    seen = _seen | {descriptor.full_name}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            kind = field.message_type
            assert kind is not None
            if kind.full_name in PAYLOAD_LIMITS or _can_fail(kind, skip_json, seen):
                return True
        elif field.type == FieldDescriptor.TYPE_ENUM or _checked_text(field, skip_json):
            return True
    return False


def _checked_text(field: FieldDescriptor, skip_json: frozenset[str]) -> bool:
    return field.full_name in TEXT_PAYLOAD_FIELDS or (
        field.name.endswith("_json") and field.name not in skip_json
    )


def _walk(message: Message, node: _Node, path: _Path) -> None:
    checks = node.checks
    for field, value in message.ListFields():
        check = checks.get(field.number)
        if check is None:
            continue
        if field.is_repeated:
            for index, item in enumerate(value):
                check(item, (path, field.name, index))
        else:
            check(value, (path, field.name, None))


def check_message(message: Message, path: str, *, skip_json: frozenset[str] = frozenset()) -> None:
    """Refuse unknown enum values, invalid JSON text and oversized payloads anywhere inside
    ``message`` (the first one in field order, a payload's content before its size). Only the
    fields that can fail are visited (:func:`_check_node`)."""
    node = _check_node(message.DESCRIPTOR, skip_json)
    if node is not None:
        _walk(message, node, path)


def check_tool_calls(message: messages_pb2.AssistantMessage, path: str) -> None:
    """Tool-call blocks need an id and a name, unique ids, and JSON-object arguments (unless the
    response was cut for length: then the arguments may be cut too, and a truncated result
    follows)."""
    seen: set[str] = set()
    for index, block in enumerate(message.content):
        if block.WhichOneof("block") != "tool_call":
            continue
        at = f"{path}.content[{index}].tool_call"
        call = block.tool_call
        require_id(call.id, f"{at}.id")
        require_id(call.name, f"{at}.name")
        if call.id in seen:
            raise InvalidArgument(
                "DUPLICATE_TOOL_CALL_ID",
                f"tool call id {call.id} appears twice in one assistant message",
                field=f"{at}.id",
                toolCallId=call.id,
            )
        seen.add(call.id)
        if message.stop_reason != messages_pb2.STOP_REASON_LENGTH:
            require_json_object(call.arguments_json, f"{at}.arguments_json")


def require_kind(message: messages_pb2.AgentMessage, field: str, *allowed: str) -> None:
    """Refuse a message whose kind is unset or not one of ``allowed``."""
    kind = message.WhichOneof("message")
    require(
        kind in allowed,
        "INVALID_MESSAGE",
        f"{field} must be a {' or '.join(allowed)} message (got {kind or 'nothing'})",
        field,
    )


def check_lease_seconds(value: int) -> None:
    """A requested lease length: 1 to MAX_LEASE_SECONDS, 0 meaning the default."""
    require(
        0 <= value <= MAX_LEASE_SECONDS,
        "INVALID_LEASE",
        f"lease_seconds must be between 1 and {MAX_LEASE_SECONDS} (0 for the default)",
        "lease_seconds",
    )


def check_lease(driver_id: str, seconds: int) -> None:
    """The lease a request asks for: a driver id and its seconds, or neither (an unleased
    operation)."""
    require_id(driver_id, "driver_id", optional=True)
    require(
        bool(driver_id) or not seconds,
        "INVALID_LEASE",
        "lease_seconds needs driver_id",
        "lease_seconds",
    )
    check_lease_seconds(seconds)


def check_compaction(entry: entries_pb2.CompactionEntry, field: str) -> None:
    """A compaction entry needs its summary."""
    require(
        bool(entry.summary), "MISSING_FIELD", f"{field}.summary is required", f"{field}.summary"
    )
