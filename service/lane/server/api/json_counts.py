"""Counts checked on a large JSON request's text, before it is parsed (the HTTP port's JSON).

Parsing JSON into a request costs per value twice: ``json.loads`` builds every value in C,
holding the GIL all along (a thread running it stops the event loop as surely as running it
there), and protobuf's JSON reader then converts each in Python, tens of microseconds per
content block. Four megabytes of ``{},`` are a million blocks: seconds of CPU for a request
that is refused anyway. So, as ``encoded_counts.py`` does for the binary encoding, a JSON
request's tokens are read first, in Python (a thread doing it lets the loop run between
them), and the request is refused as soon as a counted list passes its limit — the same
INVALID_ARGUMENT ``TOO_MANY_*`` as the gRPC port — or it holds more than
:data:`MAX_JSON_VALUES` values in all, or nests deeper than :data:`MAX_JSON_DEPTH`
(``MALFORMED_REQUEST``). Only a request within all of them is parsed: in time bounded by
those numbers, not by what was sent.

The walk follows the request type's count plan (``validation.count_plan``, as
:func:`~lane.server.api.encoded_counts.count_node` keys it by JSON name). It does not check
that the text is JSON: what it cannot read as such it leaves to the parser to refuse.
"""

from __future__ import annotations

import json
import re
from typing import cast

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from lane.server.api.encoded_counts import CountField, CountNode, Tally, count_node
from lane.server.domain.errors import InvalidArgument

#: JSON requests this size or smaller are parsed without the walk (a few milliseconds at most,
#: however they are made); larger ones are walked first.
CHECKED_FROM_BYTES = 1024
#: Values a JSON request may hold in all (objects, arrays, strings, numbers, literals): about
#: three times what a request at every count limit holds.
MAX_JSON_VALUES = 65_536
#: How deep arrays and objects may nest (requests nest about ten deep).
MAX_JSON_DEPTH = 64

# A string (escapes included), one structural character, or a run of anything else (numbers,
# literals). Whitespace between them is skipped by finditer.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]|[^\s{}\[\],:"]+')


def check_json_counts(text: bytes, request_type: type[Message]) -> None:
    """Refuse a JSON request (``text``, of a ``request_type`` message) over a count limit
    (INVALID_ARGUMENT ``TOO_MANY_*``), holding more than :data:`MAX_JSON_VALUES` values or
    nested deeper than :data:`MAX_JSON_DEPTH` (``MALFORMED_REQUEST``), before it is parsed.
    Requests up to :data:`CHECKED_FROM_BYTES` pass unread."""
    if len(text) <= CHECKED_FROM_BYTES:
        return
    _JsonWalk().run(text, count_node(cast(Descriptor, request_type.DESCRIPTOR)))


class _Frame:
    """An open object or array: the count-plan node of an object's message (None: not
    followed), or what an array's elements count as and the node to walk them with."""

    __slots__ = ("element", "is_object", "key", "node", "path")

    def __init__(
        self, is_object: bool, node: CountNode | None, element: CountField | None, path: str
    ) -> None:
        self.is_object = is_object
        self.node = node
        self.element = element
        self.path = path
        self.key = ""


class _JsonWalk(Tally):
    __slots__ = ("values",)

    def __init__(self) -> None:
        super().__init__()
        self.values = 0

    def run(self, text: bytes, root: CountNode) -> None:
        stack: list[_Frame] = []
        expect_key = False
        for match in _TOKEN.finditer(text):
            token = match.group()
            first = token[0]
            if expect_key:
                expect_key = False
                if first == 0x22:  # '"': a member's name
                    stack[-1].key = _name(token)
                    continue
            if first in b",:":
                expect_key = first == 0x2C and bool(stack) and stack[-1].is_object
                continue
            if first in b"}]":
                if stack:
                    stack.pop()
                continue
            # A value starts: count it where it stands.
            field = self._value(stack, root)
            if first == 0x7B:  # '{'
                node = root if not stack else (field[2] if field is not None else None)
                stack.append(_Frame(True, node, None, self._path(stack, field)))
                expect_key = True
            elif first == 0x5B:  # '['
                is_list = field is not None and field[1] is not None and stack[-1].is_object
                element = field if is_list else None
                stack.append(_Frame(False, None, element, self._path(stack, field)))
            if len(stack) > MAX_JSON_DEPTH:
                raise _malformed(f"nests deeper than {MAX_JSON_DEPTH} levels", MAX_JSON_DEPTH)

    def _value(self, stack: list[_Frame], root: CountNode) -> CountField | None:
        """Count a value starting in the innermost open frame; return the plan's field it is
        (a member of a followed object), or the element it is (of a counted array)."""
        self.values += 1
        if self.values > MAX_JSON_VALUES:
            raise _malformed(f"holds more than {MAX_JSON_VALUES} JSON values", MAX_JSON_VALUES)
        if not stack:
            return None
        frame = stack[-1]
        if frame.is_object:
            return None if frame.node is None else frame.node.names.get(frame.key)
        element = frame.element
        if element is not None and element[1] is not None:
            self.count(element[1], frame.path)
            # The element is walked with the field's node: a message of a counted list.
            return (element[0], None, element[2])
        return None

    @staticmethod
    def _path(stack: list[_Frame], field: CountField | None) -> str:
        outer = stack[-1].path if stack else ""
        if field is None or not stack or not stack[-1].is_object:
            return outer
        return f"{outer}.{field[0]}" if outer else field[0]


def _name(token: bytes) -> str:
    if b"\\" not in token:
        return token[1:-1].decode(errors="replace")
    try:
        return str(json.loads(token))
    except ValueError:
        return ""  # not JSON: the parser refuses it


def _malformed(what: str, limit: int) -> InvalidArgument:
    return InvalidArgument("MALFORMED_REQUEST", f"the request {what}", limit=limit)
