"""ImportLane cases for the fuzzer: export files taken as they are, edited, or generated, sent
in pieces (:func:`import_case`).

The files come from the world: every export the fuzzer's ExportLane requests received
(``World.exports``: lanes in every state the world builds), or, before there is one, the file
of an empty lane. A case is one of:

* ``exported``: such a file as it is, under a new lane id — it must import (an export of any
  lane the service holds is a file the service takes back);
* ``json_edit``: one value of one line replaced (by an edge value: int64 extremes, 2^53,
  floats, booleans, null, strings, empty and deeply nested containers), or deleted;
* ``lines_edit``: a line dropped, repeated, moved, emptied or garbled, the file cut short, or a
  ghost commit appended (a run_end or tool_end of an operation that never started);
* ``bytes_edit``: the file's bytes mutated (fuzz_encoding.mutated);
* ``generated``: a header and records made from random messages (fuzz_values.fill);
* ``pieces``: a file as it is, sent with a later message naming a lane, or one message that
  does not decode.

The new lane's id is mostly fresh (so a refused import must leave no lane behind), sometimes
a lane of the world (``LANE_EXISTS``) or not an id at all. Every draw is made whatever the
world and the file hold (see fuzz_values.any_index).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from google.protobuf import json_format
from hypothesis import strategies as st
from lane.v1 import entries_pb2, events_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.outage.fuzz_encoding import mutated
from tests.outage.fuzz_values import Ctx, Draw, any_index, choose, fill, one_in

IMPORT_MODES = (
    "exported",
    "exported",
    "json_edit",
    "json_edit",
    "json_edit",
    "lines_edit",
    "lines_edit",
    "bytes_edit",
    "generated",
    "pieces",
)
#: The file of an empty lane at revision 0: what is imported before any export was received.
EMPTY_FILE = (
    b'{"format":"lane.v1.export","version":1,"laneId":"empty","revision":"0",'
    b'"retentionFloor":"0"}\n{"lane":{}}\n'
)
#: Values a json_edit puts in place of one value of a line.
EDIT_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1.0,
    0.5,
    2**53,
    2**53 - 1,
    2**63 - 1,
    -(2**63),
    2**64,
    "",
    "x",
    "ghost",
    "9223372036854775807",
    "-1",
    "1e3",
    "NaN",
    "a\x00b",
    [],
    {},
    [[[[[]]]]],
    {"unknownField": 1},
    "DEEP",  # replaced by 100,000 nested arrays once serialized
)
DEEP = b"[" * 100_000 + b"]" * 100_000
PIECE_SIZES = (1, 7, 100, 4096, 1 << 20)
ODD_LANE_IDS = ("", " ", "a\x00b", "x" * 129)


class ImportCase(NamedTuple):
    """An ImportLane call: its mode, the lane id it names, whether that id was minted for it
    (else a lane of the world, or not an id: a refusal then proves nothing about leftovers),
    and its messages, encoded."""

    mode: str
    lane_id: str
    fresh: bool
    messages: list[bytes]


def import_case(draw: Draw, ctx: Ctx) -> ImportCase:
    """An ImportLane call (see :class:`ImportCase`)."""
    world = ctx.world
    mode = choose(draw, IMPORT_MODES)
    files = world.exports or [EMPTY_FILE]
    file = files[any_index(draw, len(files))]
    lane_id, fresh = _target(draw, ctx)
    if mode == "json_edit":
        file = _json_edit(draw, file)
    elif mode == "lines_edit":
        file = _lines_edit(draw, file)
    elif mode == "bytes_edit":
        file = mutated(draw, file)
    elif mode == "generated":
        file = _generated(draw, ctx)
    # At most some 64 messages, whatever the file's size.
    piece = max(draw(st.sampled_from(PIECE_SIZES)), len(file) // 64)
    messages = [
        pb.ImportLaneRequest(
            lane_id=lane_id if start == 0 else "", data=file[start : start + piece]
        )
        for start in range(0, max(len(file), 1), piece)
    ]
    encoded = [message.SerializeToString() for message in messages]
    if mode == "pieces":
        at = any_index(draw, len(encoded))
        if draw(st.booleans()):
            encoded[at] = b"\xff\xff\xff"  # not an ImportLaneRequest
        else:
            encoded.append(pb.ImportLaneRequest(lane_id=lane_id).SerializeToString())
    return ImportCase(mode, lane_id, fresh, encoded)


def _target(draw: Draw, ctx: Ctx) -> tuple[str, bool]:
    """The lane id an import names, and whether it was minted for it. An existing lane may be
    one an earlier import created: its id looks like a minted one."""
    choice = draw(st.integers(0, 19))
    odd = choose(draw, ODD_LANE_IDS)
    existing = ctx.world.lanes[any_index(draw, len(ctx.world.lanes))].lane_id
    if choice == 0:
        return odd, False
    if choice == 1:
        return existing, False
    return ctx.world.fresh("imported"), True


def _lines(file: bytes) -> list[bytes]:
    lines = file.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _json_edit(draw: Draw, file: bytes) -> bytes:
    lines = _lines(file)
    at = any_index(draw, len(lines))
    walk = [any_index(draw, 64) for _ in range(5)]
    delete = one_in(draw, 4)
    value = choose(draw, EDIT_VALUES)
    try:
        line = json.loads(lines[at])
    except ValueError:
        return file
    holder: Any = None
    key: Any = None
    node: Any = line
    for step in walk:
        if isinstance(node, dict) and node:
            holder, key = node, sorted(node)[step % len(node)]
        elif isinstance(node, list) and node:
            holder, key = node, step % len(node)
        else:
            break
        node = holder[key]
        if step % 3 == 0:
            break  # stop at this depth, sometimes
    if holder is None:
        return file
    if delete and isinstance(holder, dict):
        del holder[key]
    else:
        holder[key] = value
    edited = json.dumps(line).encode().replace(b'"DEEP"', DEEP)
    return b"\n".join([*lines[:at], edited, *lines[at + 1 :]]) + b"\n"


def _lines_edit(draw: Draw, file: bytes) -> bytes:
    lines = _lines(file)
    kind = draw(
        st.sampled_from(("drop", "repeat", "move", "empty", "garble", "cut", "ghost_run_end"))
    )
    first, second = any_index(draw, len(lines)), any_index(draw, len(lines))
    ghost_tool = draw(st.booleans())
    cut = draw(st.integers(0, 1 << 16))
    if kind == "drop":
        del lines[first]
    elif kind == "repeat":
        lines.insert(second, lines[first])
    elif kind == "move":
        lines.insert(second, lines.pop(first))
    elif kind == "empty":
        lines.insert(first, b"")
    elif kind == "garble":
        lines[first] = lines[first][: len(lines[first]) // 2]
    elif kind == "cut":
        return file[: cut % max(len(file), 1)]
    else:
        return _with_ghost_commit(lines, ghost_tool)
    return b"\n".join(lines) + b"\n"


def _with_ghost_commit(lines: list[bytes], tool: bool) -> bytes:
    """The file with one more commit: a tool_end or run_end of an operation never started."""
    try:
        header = json.loads(lines[0])
        lane = json.loads(lines[1])
        revision = int(header["revision"]) + 1
    except (ValueError, KeyError, IndexError, TypeError):
        return b"\n".join(lines) + b"\n"
    body = (
        {"toolEnd": {"runId": "ghost", "toolCallId": "c0", "toolName": "t"}}
        if tool
        else {"runEnd": {"runId": "ghost", "status": "OPERATION_RESULT_STATUS_COMPLETED"}}
    )
    event = {"laneId": header.get("laneId"), "revision": str(revision), **body}
    header["revision"] = str(revision)
    if isinstance(lane.get("lane"), dict):
        lane["lane"]["revision"] = str(revision)
    group = {"eventGroup": {"events": [event]}}
    rest = [json.dumps(header).encode(), json.dumps(lane).encode(), *lines[2:]]
    return b"\n".join([*rest, json.dumps(group).encode()]) + b"\n"


def _generated(draw: Draw, ctx: Ctx) -> bytes:
    """A header and records made from random messages."""
    revision = choose(draw, (0, 1, 3, 2**53 - 1, 2**63 - 1))
    header = {
        "format": "lane.v1.export",
        "version": choose(draw, (1, 1, 1, 2, True, 1.0)),
        "laneId": choose(draw, ("gen", "", "a\x00b")),
        "revision": str(revision),
        "retentionFloor": str(choose(draw, (0, 0, 1, revision))),
    }
    lane = snapshot_pb2.LaneSnapshot()
    fill(draw, ctx, lane, 1)
    records: list[Any] = [header, {"lane": _json(lane)}]
    for _ in range(draw(st.integers(0, 2))):
        entry = entries_pb2.Entry()
        fill(draw, ctx, entry, 1)
        records.append({"entry": _json(entry)})
    for _ in range(draw(st.integers(0, 2))):
        event = events_pb2.HarnessEvent()
        fill(draw, ctx, event, 1)
        records.append({"eventGroup": {"events": [_json(event)]}})
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def _json(message: Any) -> Any:
    try:
        return json_format.MessageToDict(message)
    except (ValueError, TypeError, json_format.Error):
        return {}  # a value protobuf JSON cannot hold (a timestamp out of range, ...)
