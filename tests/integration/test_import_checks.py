"""ImportLane checks a file as a command is checked: input that used to reach INTERNAL, or to
leave a lane that could no longer take commands, and files whose event log does not fold to
their lane record are each refused INVALID_ARGUMENT with their reason, and create nothing
(docs/export-format.md, "What an import refuses"). A file at the edge of the ranges imports,
and its lane takes commands."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.domain.export_format import MAX_COUNTER
from tests.integration.lanes import Probe, error_info, new_lane_id, user
from tests.integration.test_export_import import import_file, rich_lane

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any
Lines = list[dict[str, Any]]
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def exported() -> dict[str, Lines]:
    """The file of one rich lane, as parsed lines (filled by the first test that needs it)."""
    return {}


async def exported_lines(stub: Stub, cache: dict[str, Lines]) -> Lines:
    if "lines" not in cache:
        lane_id = new_lane_id("checked-src")
        await rich_lane(stub, lane_id)
        pieces = stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))
        data = b"".join([piece.data async for piece in pieces])
        cache["lines"] = [json.loads(line) for line in data.splitlines()]
    copied: Lines = json.loads(json.dumps(cache["lines"]))  # a copy to edit
    return copied


def file_of(lines: Lines) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def first(lines: Lines, kind: str) -> dict[str, Any]:
    return next(line[kind] for line in lines if kind in line)


def set_revision(lines: Lines, revision: int, floor: int | None = None) -> None:
    """Set the header's and the lane record's revision (and the header's floor)."""
    lines[0]["revision"] = str(revision)
    if floor is not None:
        lines[0]["retentionFloor"] = str(floor)
    lines[1]["lane"]["revision"] = str(revision)


def with_group(*events: dict[str, Any]) -> Callable[[Lines], None]:
    """Append a commit of ``events`` (revisions after the lane's, naming its lane)."""

    def change(lines: Lines) -> None:
        revision = int(lines[0]["revision"])
        group = []
        for offset, event in enumerate(events, 1):
            group.append(
                {
                    "laneId": lines[0]["laneId"],
                    "revision": str(revision + offset),
                    "commitTime": "2026-01-01T00:00:00Z",
                    **event,
                }
            )
        lines.append({"eventGroup": {"events": group}})
        set_revision(lines, revision + len(events))

    return change


def header(**values: Any) -> Callable[[Lines], None]:
    def change(lines: Lines) -> None:
        lines[0].update(values)

    return change


def without_header_key(key: str) -> Callable[[Lines], None]:
    def change(lines: Lines) -> None:
        del lines[0][key]

    return change


def lane_record(change_record: Callable[[dict[str, Any]], None]) -> Callable[[Lines], None]:
    def change(lines: Lines) -> None:
        change_record(lines[1]["lane"])

    return change


def no_events_above(revision: int, floor: int) -> Callable[[Lines], None]:
    """The file's rows with the lane at ``revision``, events removed up to ``floor``."""

    def change(lines: Lines) -> None:
        lines[:] = [line for line in lines if "eventGroup" not in line]
        set_revision(lines, revision, floor)

    return change


def entry_changed(lines: Lines) -> None:
    """The first entry's record is not what its entry_added event carries."""
    first(lines, "entry")["timestamp"] = "2020-01-01T00:00:00Z"


def tip_at_first_entry(lines: Lines) -> None:
    lines[1]["lane"]["tipId"] = first(lines, "entry")["id"]


def extra_entry(lines: Lines) -> None:
    """An entry after the tip that no event added (a later commit makes room for its seq)."""
    revision = int(lines[0]["revision"])
    tip = lines[1]["lane"]["tipId"]
    entry = {"id": "unlogged", "parentId": tip, "seq": str(revision + 1), "custom": {}}
    at = max(n for n, line in enumerate(lines) if "entry" in line) + 1
    lines.insert(at, {"entry": entry})
    with_group({"valueUpdate": {}})(lines)


def deeply_nested(lines: Lines) -> None:
    lines.insert(2, {"entry": "DEEP"})


BAD: dict[str, tuple[Callable[[Lines], None], str, str]] = {
    # R7: each of these used to be answered INTERNAL or to leave a lane that answers INTERNAL.
    "nested too deeply": (deeply_nested, "INVALID_EXPORT", "nested too deeply"),
    "header without laneId": (
        without_header_key("laneId"),
        "INVALID_EXPORT",
        "laneId must be a non-empty string",
    ),
    "revision 2^63-1": (
        no_events_above(INT64_MAX, INT64_MAX),
        "INVALID_EXPORT",
        "revision must be an integer from 0",
    ),
    "retention floor 2^63-1": (
        header(retentionFloor=str(INT64_MAX)),
        "INVALID_EXPORT",
        "retentionFloor must be an integer from 0",
    ),
    "revision just past the headroom": (
        no_events_above(MAX_COUNTER + 1, MAX_COUNTER + 1),
        "INVALID_EXPORT",
        "revision must be an integer",
    ),
    "message count 2^63-1": (
        lane_record(lambda lane: lane["stats"].update(messageCount=str(INT64_MAX))),
        "INVALID_EXPORT",
        "message count must be from 0",
    ),
    # R8: versions are JSON integers, and the log must fold to the lane record.
    "version true": (header(version=True), "INVALID_EXPORT", "version must be a JSON integer"),
    "version 1.0": (header(version=1.0), "INVALID_EXPORT", "version must be a JSON integer"),
    "version 2": (header(version=2), "EXPORT_VERSION_UNSUPPORTED", "version 2"),
    "ghost run_end": (
        with_group({"runEnd": {"runId": "ghost", "status": "OPERATION_RESULT_STATUS_COMPLETED"}}),
        "INVALID_EXPORT",
        "names operation 'ghost', but none is open",
    ),
    "ghost tool_end": (
        with_group({"toolEnd": {"runId": "ghost", "toolCallId": "c1", "toolName": "t"}}),
        "INVALID_EXPORT",
        "names operation 'ghost', but none is open",
    ),
    "a run left open": (
        with_group({"runStart": {"runId": "left-open"}}),
        "INVALID_EXPORT",
        "leaves operation left-open open",
    ),
    "tip contradicting the log": (tip_at_first_entry, "INVALID_EXPORT", "its events end at"),
    "entry unlike its event": (entry_changed, "INVALID_EXPORT", "other content"),
    "entry no event added": (extra_entry, "INVALID_EXPORT", "is added by no event"),
    "usage totals unlike the log": (
        lane_record(lambda lane: lane["stats"]["usage"].update(input="8")),
        "INVALID_EXPORT",
        "usage totals differ",
    ),
    "last result unlike the log": (
        lane_record(lambda lane: lane["lastResult"].update(operationId="another-run")),
        "INVALID_EXPORT",
        "last result differ",
    ),
    "inbox unlike the log": (
        lane_record(lambda lane: lane.update(queues=[])),
        "INVALID_EXPORT",
        "inbox differ",
    ),
}


@pytest.mark.parametrize("label", BAD)
async def test_a_file_checked_like_a_command_is_refused_and_creates_nothing(
    lane_stub: Stub, exported: dict[str, Lines], label: str
) -> None:
    change, reason, problem = BAD[label]
    lines = await exported_lines(lane_stub, exported)
    change(lines)
    data = file_of(lines)
    if label == "nested too deeply":
        data = data.replace(b'"DEEP"', b"[" * 100_000 + b"]" * 100_000)
    lane_id = new_lane_id("checked")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await import_file(lane_stub, lane_id, data, 1 << 16)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert error_info(raised.value).reason == reason, raised.value.details()
    assert problem in (raised.value.details() or ""), raised.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_file_at_the_edge_of_the_ranges_imports_and_its_lane_takes_commands(
    lane_stub: Stub, exported: dict[str, Lines]
) -> None:
    # The rich lane's rows with its revision at the largest a file may hold, its events
    # removed by retention: the lane keeps counting from there.
    lines = await exported_lines(lane_stub, exported)
    no_events_above(MAX_COUNTER, MAX_COUNTER)(lines)
    lane_id = new_lane_id("checked-edge")
    imported = await import_file(lane_stub, lane_id, file_of(lines), 1 << 16)
    assert imported.revision == MAX_COUNTER
    probe = Probe(lane_stub, lane_id)
    await probe.start()
    started = await lane_stub.StartRun(pb.StartRunRequest(lane_id=lane_id, prompt=[user("go")]))
    await lane_stub.EnqueueMessage(
        pb.EnqueueMessageRequest(
            lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user("later")
        )
    )
    await lane_stub.AbortOperation(
        pb.AbortOperationRequest(lane_id=lane_id, operation_id=started.operation_id)
    )
    await probe.check()
    assert probe.snapshot.revision > MAX_COUNTER


async def test_an_import_refused_at_once_is_answered_so_while_its_client_still_sends(
    lane_stub: Stub,
) -> None:
    """An import refused at its first message (it names no lane), with more of the file still
    coming: the client must read that refusal. Ending the call while the client was still
    writing made gRPC's Python client report INTERNAL ("Internal error from Core") now and
    then (2 of 300 here), so the refusal is many times over, with up to six more pieces."""
    header = b'{"format":"lane.v1.export","version":1}\n'
    answers: dict[tuple[grpc.StatusCode, str], int] = {}
    for n in range(300):

        async def pieces(more: int = n % 7) -> Any:
            yield pb.ImportLaneRequest(data=header)
            for _ in range(more):
                yield pb.ImportLaneRequest(data=b"x" * 100)

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await lane_stub.ImportLane(pieces())
        code = raised.value.code()
        reason = error_info(raised.value).reason if code != grpc.StatusCode.INTERNAL else ""
        answers[code, reason] = answers.get((code, reason), 0) + 1
    assert answers == {(grpc.StatusCode.INVALID_ARGUMENT, "MISSING_FIELD"): 300}
