"""Request validation: malformed input is refused with INVALID_ARGUMENT before any I/O.

Besides the per-RPC checks, :func:`check_message` walks any message and refuses unknown enum
values, ``*_json`` fields that are not JSON and payloads over their size limit (see
``service/domain/limits.py``), wherever they are nested.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from lane.v1 import entries_pb2, messages_pb2

from service.domain.errors import InvalidArgument
from service.domain.jsontext import parse_json, require_json_object

__all__ = ["parse_json", "require_json_object"]
from service.domain.leases import DEFAULT_LEASE_SECONDS
from service.domain.limits import MAX_ERROR_BYTES, MAX_PAYLOAD_BYTES

MAX_ID_BYTES = 128
MAX_LEASE_SECONDS = 3600
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100

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


def require(condition: bool, reason: str, message: str, field: str) -> None:
    """Refuse with INVALID_ARGUMENT unless ``condition``."""
    if not condition:
        raise InvalidArgument(reason, message, field=field)


def check_message(message: Message, path: str, *, skip_json: frozenset[str] = frozenset()) -> None:
    """Refuse unknown enum values, invalid JSON text and oversized payloads anywhere inside
    ``message``."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        values = value if field.is_repeated else [value]
        for index, item in enumerate(values):
            at = f"{where}[{index}]" if field.is_repeated else where
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                # Its content first: a malformed payload gets the more specific reason.
                check_message(item, at, skip_json=skip_json)
                kind = field.message_type
                limit = PAYLOAD_LIMITS.get(kind.full_name) if kind is not None else None
                if limit is not None and (size := item.ByteSize()) > limit:
                    raise payload_too_large(at, size, limit)
            elif field.type == FieldDescriptor.TYPE_ENUM:
                enum = field.enum_type
                if enum is None or enum.values_by_number.get(item) is None:
                    raise InvalidArgument(
                        "UNKNOWN_ENUM_VALUE", f"{at} has unknown value {item}", field=at
                    )
            else:
                if field.full_name in TEXT_PAYLOAD_FIELDS and (
                    (size := len(item.encode())) > MAX_PAYLOAD_BYTES
                ):
                    raise payload_too_large(at, size, MAX_PAYLOAD_BYTES)
                if field.name.endswith("_json") and field.name not in skip_json:
                    parse_json(item, at)


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


def lease_seconds(value: int) -> int:
    """A requested lease length: 1 to MAX_LEASE_SECONDS, 0 meaning the default."""
    require(
        0 <= value <= MAX_LEASE_SECONDS,
        "INVALID_LEASE",
        f"lease_seconds must be between 1 and {MAX_LEASE_SECONDS} (0 for the default)",
        "lease_seconds",
    )
    return value or DEFAULT_LEASE_SECONDS


def requested_lease(driver_id: str, seconds: int) -> tuple[str, int] | None:
    """The (driver id, seconds) lease a request asks for, or None for an unleased operation."""
    require_id(driver_id, "driver_id", optional=True)
    require(
        bool(driver_id) or not seconds,
        "INVALID_LEASE",
        "lease_seconds needs driver_id",
        "lease_seconds",
    )
    return (driver_id, lease_seconds(seconds)) if driver_id else None


def check_compaction(entry: entries_pb2.CompactionEntry, field: str) -> None:
    """A compaction entry needs its summary."""
    require(
        bool(entry.summary), "MISSING_FIELD", f"{field}.summary is required", f"{field}.summary"
    )
