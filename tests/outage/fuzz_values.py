"""Hypothesis building blocks of the fuzzer: field values, ids of the world, random messages.

Hypothesis checks that the same choices lead to the same draws. The world grows as a run goes,
so no draw here has bounds that depend on it (see :func:`any_index`), and every helper draws the
same number of times whatever the world holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.server import MAX_RECEIVE_MESSAGE_BYTES
from tests.outage.fuzz_world import LaneRef, World

T = TypeVar("T")
Draw = Callable[[st.SearchStrategy[Any]], Any]

SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
#: The RPCs fuzzed, each sent as raw bytes: every one but DriveLane, whose commands are these
#: RPCs' own requests served by the same handlers (tests/integration/test_drive_lane.py checks
#: that a session answers them as the unary calls do). ImportLane's cases are files sent in
#: pieces (fuzz_transfer.py); ExportLane's are read to their end.
METHODS: tuple[str, ...] = tuple(m.name for m in SERVICE.methods if m.name != "DriveLane")
REQUEST_TYPES: dict[str, type[Message]] = {
    m.name: message_factory.GetMessageClass(m.input_type) for m in SERVICE.methods
}
RESPONSE_TYPES: dict[str, type[Message]] = {
    m.name: message_factory.GetMessageClass(m.output_type) for m in SERVICE.methods
}
MAX_MESSAGE = MAX_RECEIVE_MESSAGE_BYTES


INT32_EDGES = (0, 1, -1, 2, 3, 30, 100, 1000, 1001, 3600, 3601, 2**31 - 1, -(2**31))
INT64_EDGES = (
    *INT32_EDGES,
    2**31,
    2**32,
    86_400_000,
    86_400_001,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**63),
)
SPECIAL_TEXT = (
    "",
    " ",
    "x",
    "t",
    "a\x00b",
    "\x00",
    "é",
    "𝄞",
    "\u202e",
    "\ufeff",
    " padded ",
    "line\nbreak",
    "\t",
    "\x7f",
    "\u200b",
    "NaN",
    "null",
    "{}",
    "' OR 1=1 --",
    "%s%n",
    "x" * 128,
    "é" * 64,
    "x" * 129,
    "é" * 65,
)
#: Sizes of "huge" strings: around the 128-byte id limit, large, and around the 4 MiB message
#: limit (a request that big is RESOURCE_EXHAUSTED before the service sees it).
HUGE_SIZES = (129, 4096, 65_536, 1 << 20, (3 << 20) + 512, MAX_MESSAGE - 512, MAX_MESSAGE + 1)
VALID_JSON_TEXT = (
    "{}",
    "[]",
    "0",
    "null",
    '"s"',
    '{"n": 18446744073709551623}',
    '{"f": 1.0, "e": 1e308, "neg": -0}',
    "1e999",
    '{"a": "\\u0000"}',
    '{"\\u0000": 1}',
    '"\\ud800"',
    '{"a": 1, "a": 2}',
    '{"s": "\\u00e9\\ud834\\udd1e"}',
    " \t\n{} \n",
    '{"deep": ' + "[" * 900 + "]" * 900 + "}",
    "[" * 5000 + "]" * 5000,
)
INVALID_JSON_TEXT = (
    "",
    " ",
    "NaN",
    '{"a": NaN}',
    "Infinity",
    "-Infinity",
    "{",
    "{'a': 1}",
    "[1,]",
    '{"a": 1} x',
    "{} {}",
    '"\x01"',
    "\x00",
    "undefined",
    '{"a": 1 /* c */}',
    "[" * 100_000,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=4), json_values, max_size=3).map(json.dumps)
json_texts = st.one_of(
    json_values.map(json.dumps),
    json_objects,
    st.sampled_from(VALID_JSON_TEXT),
    st.sampled_from(INVALID_JSON_TEXT),
)
#: Mostly unremarkable text, sometimes special, rarely (1 in 100) huge.
texts = st.integers(0, 99).flatmap(
    lambda n: (
        st.sampled_from(HUGE_SIZES).map(lambda size: "h" * size)
        if n == 57  # not 0: hypothesis favours the ends of a range
        else st.sampled_from(SPECIAL_TEXT)
        if n < 40
        else st.text(max_size=10)
    )
)
#: Timestamps: ordinary, the representable extremes, and beyond them (seconds and nanos).
TIMESTAMP_SECONDS = (
    0,
    1_700_000_000,
    -62_135_596_800,
    253_402_300_799,
    253_402_300_800,
    -(2**62),
    2**62,
)
TIMESTAMP_NANOS = (0, 999_999_999, 1_000_000_000, -1, 2**31 - 1)


def int_values(fd: Any) -> st.SearchStrategy[int]:
    unsigned = fd.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64)
    wide = fd.type in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
    )
    low, high = (
        (0, 2**64 - 1 if wide else 2**32 - 1)
        if unsigned
        else ((-(2**63), 2**63 - 1) if wide else (-(2**31), 2**31 - 1))
    )
    edges = [v for v in (INT64_EDGES if wide else INT32_EDGES) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(max(low, -5), min(high, 100)))


def _enum_values(fd: Any) -> st.SearchStrategy[int]:
    known = [value.number for value in fd.enum_type.values]
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known),
        st.sampled_from(known),
        st.sampled_from((-1, 99, max(known) + 1, 2**31 - 1, -(2**31))),
    )


# -- ids ------------------------------------------------------------------------------------

UNKNOWN_IDS = ("no-such-id", "op-unknown", "turn-unknown", "c9", "e-unknown", "x" * 128)


def one_in(draw: Draw, n: int) -> bool:
    """True with probability about 1/n. (Hypothesis favours the ends of an integer range, so
    ``draw(st.integers(0, n - 1)) == 0`` would be true far more often.)"""
    return int(draw(st.integers(0, 4095))) % n == n // 2


def any_index(draw: Draw, size: int) -> int:
    """An index into a sequence of ``size`` items whose length depends on the world.

    Hypothesis checks that the same choices lead to the same draws; the world grows as the run
    goes, so a draw's bounds must not depend on it: draw from a fixed range, then reduce.
    """
    return int(draw(st.integers(0, 1023))) % max(size, 1)


def choose(draw: Draw, items: Sequence[T]) -> T:
    """One of ``items``, nearly uniformly (sampled_from favours its first and last items)."""
    return items[any_index(draw, len(items))]


def pick(draw: Draw, pool: Sequence[T], unknown: Sequence[T], newest: bool = True) -> T:
    """Mostly a known value (with ``newest``, the newest more often), sometimes an unknown one
    (always exactly one draw)."""
    choice = int(draw(st.integers(0, 1023)))
    if pool and newest and choice < 500:
        return pool[-1]
    if pool and choice < 900:
        return pool[choice % len(pool)]
    return unknown[choice % len(unknown)]


@dataclass
class Ctx:
    """What one request is aimed at."""

    world: World
    lane: LaneRef

    def op(self, draw: Draw) -> str:
        choice = draw(st.integers(0, 9))
        other = self.world.lanes[any_index(draw, len(self.world.lanes))]
        foreign = pick(draw, other.operation_ids, UNKNOWN_IDS)
        own = pick(draw, self.lane.operation_ids, UNKNOWN_IDS)
        if choice == 0:  # another lane's operation
            return foreign
        if choice <= 6 and self.lane.open_operation:
            return self.lane.open_operation
        return own

    def turn(self, draw: Draw) -> str:
        return pick(draw, self.lane.turn_ids, UNKNOWN_IDS)

    def call(self, draw: Draw) -> str:
        return pick(draw, self.lane.call_ids, UNKNOWN_IDS, newest=False)

    def entry(self, draw: Draw) -> str:
        return pick(draw, self.lane.entry_ids, UNKNOWN_IDS, newest=False)

    def token(self, draw: Draw) -> int:
        """The newest lease token, often; for an unleased run mostly 0 (no token)."""
        value: int = pick(draw, self.lane.lease_tokens, (0, 0, 0, 0, 0, 0, 0, 1, -1, 2**63 - 1))
        return value

    def driver(self, draw: Draw) -> str:
        return pick(draw, self.lane.driver_ids, (self.world.fresh("driver"), "drv"))

    def request_id(self, draw: Draw) -> str:
        choice = draw(st.integers(0, 9))
        reused = pick(draw, self.world.request_ids, ("",))
        if choice == 0:
            return reused
        if choice == 1:
            return ""
        value = self.world.fresh("req")
        self.world.request_ids.append(value)
        del self.world.request_ids[:-200]
        return value


#: Field names whose values are ids of the lane's world (see Ctx).
def _semantic(draw: Draw, ctx: Ctx, fd: Any, parent: Any) -> Any:
    name = fd.name
    if name == "lane_id":
        return _lane_id(draw, ctx.world)
    if name == "operation_id":
        return ctx.op(draw)
    if name == "turn_id":
        return ctx.turn(draw)
    if name == "tool_call_id" or (name == "id" and parent.name == "ToolCallContent"):
        return ctx.call(draw)
    if name in ("entry_id", "target_entry_id", "target_id", "from_id", "parent_id"):
        return ctx.entry(draw)
    if name == "request_id":
        return ctx.request_id(draw)
    if name == "driver_id":
        return ctx.driver(draw)
    if name == "lease_token":
        return ctx.token(draw)
    if name == "page_token":
        return pick(draw, ctx.world.page_tokens, ("%%%", "/w==", "AA=="))
    return None


def _lane_id(draw: Draw, world: World) -> str:
    choice = draw(st.integers(0, 19))
    if choice == 0:
        odd: str = draw(st.sampled_from(("", " ", "a\x00b", "x" * 129, "no-such-lane", "é" * 64)))
        return odd
    if choice == 1 and one_in(draw, 4):
        return world.fresh("new-lane")
    return world.lanes[any_index(draw, len(world.lanes))].lane_id


def _value(draw: Draw, ctx: Ctx, fd: Any, parent: Any, depth: int) -> Any:
    """A random value for one (non-repeated) element of ``fd``."""
    if draw(st.integers(0, 3)) > 0:
        semantic = _semantic(draw, ctx, fd, parent)
        if semantic is not None:
            return semantic
    kind = fd.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        message = message_factory.GetMessageClass(fd.message_type)()
        fill(draw, ctx, message, depth + 1)
        return message
    if kind == FieldDescriptor.TYPE_STRING:
        if fd.name.endswith("_json"):
            return (
                draw(json_objects if fd.name == "arguments_json" else json_texts)
                if draw(st.booleans())
                else draw(json_texts)
            )
        return draw(texts)
    if kind == FieldDescriptor.TYPE_BYTES:
        return draw(st.binary(max_size=16))
    if kind == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if kind == FieldDescriptor.TYPE_ENUM:
        return draw(_enum_values(fd))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return draw(
            st.one_of(
                st.sampled_from((0.0, -0.0, 1.5, float("nan"), float("inf"), -float("inf"), 1e308)),
                st.floats(width=32 if kind == FieldDescriptor.TYPE_FLOAT else 64),
            )
        )
    return draw(int_values(fd))


def _timestamp(draw: Draw, message: Message) -> None:
    message.seconds = draw(st.sampled_from(TIMESTAMP_SECONDS) | st.integers(0, 2_000_000_000))  # type: ignore[attr-defined]
    message.nanos = draw(st.sampled_from(TIMESTAMP_NANOS) | st.just(0))  # type: ignore[attr-defined]


def _set(message: Message, fd: Any, value: Any) -> None:
    """Set (or append to) ``fd`` of ``message``; values protobuf refuses are skipped."""
    try:
        if fd.is_repeated:
            container = getattr(message, fd.name)
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                container.add().CopyFrom(value)
            else:
                container.append(value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(message, fd.name).CopyFrom(value)
        else:
            setattr(message, fd.name, value)
    except (ValueError, TypeError):
        pass  # e.g. a float that does not fit a float field


def fill(draw: Draw, ctx: Ctx, message: Message, depth: int) -> None:
    """Set a random subset of ``message``'s fields, recursively (depth-limited)."""
    descriptor = message.DESCRIPTOR
    if descriptor.full_name == "google.protobuf.Timestamp":
        _timestamp(draw, message)
        return
    chosen_oneofs: dict[str, str] = {}
    for oneof in descriptor.oneofs:
        if len(oneof.fields) > 1 or not oneof.name.startswith("_"):
            index = draw(st.integers(0, len(oneof.fields)))
            if index < len(oneof.fields):
                chosen_oneofs[oneof.name] = oneof.fields[index].name
            else:
                chosen_oneofs[oneof.name] = ""
    presence = max(1, 4 - depth)  # out of 5
    for fd in descriptor.fields:
        member = fd.containing_oneof
        if member is not None and member.name in chosen_oneofs:
            if chosen_oneofs[member.name] != fd.name:
                continue
        elif draw(st.integers(0, 4)) >= presence:
            continue
        if fd.type == FieldDescriptor.TYPE_MESSAGE and depth >= 4:
            continue
        count = draw(st.integers(0, 3)) if fd.is_repeated else 1
        for _ in range(count):
            _set(message, fd, _value(draw, ctx, fd, descriptor, depth))


def _field_paths(
    descriptor: Any, prefix: tuple[Any, ...] = (), depth: int = 0
) -> list[tuple[Any, ...]]:
    paths: list[tuple[Any, ...]] = []
    for fd in descriptor.fields:
        path = (*prefix, fd)
        paths.append(path)
        if (
            fd.type == FieldDescriptor.TYPE_MESSAGE
            and not fd.is_repeated
            and depth < 2
            and fd.message_type.full_name != "google.protobuf.Timestamp"
        ):
            paths.extend(_field_paths(fd.message_type, path, depth + 1))
    return paths


_PATHS: dict[str, list[tuple[Any, ...]]] = {
    name: _field_paths(REQUEST_TYPES[name].DESCRIPTOR) for name in METHODS
}


def overwrite(draw: Draw, ctx: Ctx, method: str, message: Message) -> None:
    """Overwrite (or clear) one field of ``message``, possibly nested, with a random value."""
    paths = _PATHS[method]
    path = paths[draw(st.integers(0, len(paths) - 1))]
    target: Any = message
    for fd in path[:-1]:
        target = getattr(target, fd.name)
    fd = path[-1]
    if one_in(draw, 5):
        target.ClearField(fd.name)
        return
    if fd.is_repeated:
        getattr(target, fd.name).__delitem__(slice(None))
        for _ in range(draw(st.integers(0, 3))):
            _set(target, fd, _value(draw, ctx, fd, target.DESCRIPTOR, 2))
        return
    _set(target, fd, _value(draw, ctx, fd, target.DESCRIPTOR, 2))
