"""ExportLane and ImportLane, through the `lane export` and `lane import` commands: the round
trip gives a lane whose snapshot and events equal the original's but for the lane id and the
last result; a bad file is refused with INVALID_EXPORT and creates nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from lane.client.testing import LaneScript
from lane.v1 import events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.transfer_rpcs import EXPORT_PIECE_BYTES
from lane.server.app.server import RunningServer
from tests.integration.lanes import (
    Probe,
    assistant,
    error_info,
    events_between,
    leased_batch,
    new_lane_id,
    result,
    text,
    user,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any


async def rich_lane(stub: Stub, lane_id: str) -> None:
    """A lane that went through a run with a tool call, usage, a session name, a config change
    and a queued message, idle again."""
    probe = Probe(stub, lane_id)
    operation, token = await leased_batch(stub, probe, "c1")
    ids: dict[str, Any] = {"lane_id": lane_id, "operation_id": operation, "lease_token": token}
    await stub.StartToolCall(
        pb.StartToolCallRequest(**ids, tool_call_id="c1", arguments_json='{"n": 12345678901234567}')
    )
    await stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            **ids, tool_call_id="c1", executed=pb.ExecutedOutcome(result=result("done"))
        )
    )
    turn = await stub.StartTurn(pb.StartTurnRequest(**ids))
    await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            **ids, turn_id=turn.turn_id, message=assistant(text("all done"), stop=1)
        )
    )
    await stub.RecordUsage(
        pb.RecordUsageRequest(
            lane_id=lane_id, usage=messages_pb2.Usage(input=7, output=3, total_tokens=10)
        )
    )
    await stub.EndRun(
        pb.EndRunRequest(**ids, status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    )
    await stub.SetLaneValue(
        pb.SetLaneValueRequest(lane_id=lane_id, session_name=events_pb2.SessionNameValue(name="s"))
    )
    await stub.UpdateLaneConfig(
        pb.UpdateLaneConfigRequest(lane_id=lane_id, thinking_level=snapshot_pb2.THINKING_LEVEL_LOW)
    )
    await stub.EnqueueMessage(
        pb.EnqueueMessageRequest(
            lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user("next time")
        )
    )


async def lane_cli(server: RunningServer, *args: str, stdin: bytes = b"") -> tuple[int, bytes, str]:
    """Run the `lane` command against ``server``: (exit status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lane.client",
        *args,
        "--target",
        f"127.0.0.1:{server.port}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LANE_TOKEN": ""},
    )
    out, err = await process.communicate(stdin)
    assert process.returncode is not None
    return process.returncode, out, err.decode()


async def snapshot_of(stub: Stub, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    answer = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    snapshot: snapshot_pb2.LaneSnapshot = answer.snapshot
    return snapshot


async def test_export_then_import_gives_the_same_lane(
    lane_stub: Stub, lane_server: RunningServer, tmp_path: Path
) -> None:
    original = new_lane_id("export")
    await rich_lane(lane_stub, original)
    status, exported, err = await lane_cli(lane_server, "export", original)
    assert status == 0, err
    lines = [json.loads(line) for line in exported.splitlines()]
    assert lines[0]["format"] == "lane.v1.export" and lines[0]["version"] == 1
    assert [next(iter(line)) for line in lines[1:3]] == ["lane", "entry"]
    path = tmp_path / "lane.jsonl"
    path.write_bytes(exported)

    copy = new_lane_id("imported")
    status, out, err = await lane_cli(lane_server, "import", str(path), "--lane", copy)
    assert status == 0, err
    assert f"imported lane {copy}" in out.decode()

    before, after = await snapshot_of(lane_stub, original), await snapshot_of(lane_stub, copy)
    assert before.HasField("last_result") and not after.HasField("last_result")
    # The event log too, each event naming the new lane.
    await assert_copy(lane_stub, original, copy)
    # The new lane lives on: a run on it works and is seen by its watchers.
    probe = Probe(lane_stub, copy)
    await probe.start()
    started = await lane_stub.StartRun(pb.StartRunRequest(lane_id=copy, prompt=[user("again")]))
    await probe.check()
    assert started.revision > after.revision
    # Importing under an id in use is refused, and changes nothing.
    status, _, err = await lane_cli(lane_server, "import", str(path), "--lane", original)
    assert status == 1 and "LANE_EXISTS" in err
    assert await snapshot_of(lane_stub, original) == before


async def test_an_imported_lane_exports_and_imports_again(
    lane_stub: Stub, lane_server: RunningServer, tmp_path: Path
) -> None:
    # An imported lane has no last result (its operations keep their ids elsewhere), while its
    # whole log still ends a run: its own export must import too.
    original, copy, again = (new_lane_id(name) for name in ("export", "imported", "again"))
    await rich_lane(lane_stub, original)
    path = tmp_path / "lane.jsonl"
    for source, target in ((original, copy), (copy, again)):
        status, exported, err = await lane_cli(lane_server, "export", source)
        assert status == 0, err
        path.write_bytes(exported)
        status, _, err = await lane_cli(lane_server, "import", str(path), "--lane", target)
        assert status == 0, err
    await assert_copy(lane_stub, original, again)


async def test_a_lane_with_an_open_run_is_not_exported(lane_stub: Stub) -> None:
    lane_id = new_lane_id("export-busy")
    await leased_batch(lane_stub, Probe(lane_stub, lane_id), "c1")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id)):
            pass
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "LANE_BUSY"


async def import_file(stub: Stub, lane_id: str, data: bytes, piece: int = 100) -> Any:
    async def pieces() -> Any:
        yield pb.ImportLaneRequest(lane_id=lane_id, data=data[:piece])
        for start in range(piece, len(data), piece):
            yield pb.ImportLaneRequest(data=data[start : start + piece])

    return await stub.ImportLane(pieces())


def edited(lines: list[bytes], index: int, change: Any) -> bytes:
    value = json.loads(lines[index])
    change(value)
    return b"\n".join([*lines[:index], json.dumps(value).encode(), *lines[index + 1 :]]) + b"\n"


async def test_a_bad_file_is_refused_and_creates_nothing(lane_stub: Stub) -> None:
    original = new_lane_id("export-src")
    await rich_lane(lane_stub, original)
    data = b"".join(
        [p.data async for p in lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=original))]
    )
    lines = data.splitlines()
    # Sanity: the file as exported imports (in pieces of 100 bytes).
    ok = await import_file(lane_stub, new_lane_id("imported-ok"), data)
    assert ok.event_count == len(await events_between(lane_stub, original, 0, ok.revision))

    entry_at = next(i for i, line in enumerate(lines) if line.startswith(b'{"entry"'))
    group_at = next(i for i, line in enumerate(lines) if line.startswith(b'{"eventGroup"'))
    bad: dict[str, tuple[bytes, str]] = {
        "empty": (b"", "INVALID_EXPORT"),
        "not json": (b"{nope\n" + data, "INVALID_EXPORT"),
        "version 2": (
            edited(lines, 0, lambda v: v.update(version=2)),
            "EXPORT_VERSION_UNSUPPORTED",
        ),
        "no header": (b"\n".join(lines[1:]), "INVALID_EXPORT"),
        "unknown field": (
            edited(lines, entry_at, lambda v: v["entry"].update(colour="red")),
            "INVALID_EXPORT",
        ),
        "missing parent": (
            edited(lines, entry_at, lambda v: v["entry"].update(parentId="ghost")),
            "INVALID_EXPORT",
        ),
        "a gap in events": (b"\n".join(lines[:group_at] + lines[group_at + 1 :]), "INVALID_EXPORT"),
        "bad json text": (
            edited(
                lines,
                group_at,
                lambda v: v["eventGroup"]["events"][0].update(laneId="someone-else"),
            ),
            "INVALID_EXPORT",
        ),
        "truncated": (data[: len(data) // 2], "INVALID_EXPORT"),
    }
    for label, (file, reason) in bad.items():
        lane_id = new_lane_id("imported-bad")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await import_file(lane_stub, lane_id, file)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, label
        assert error_info(raised.value).reason == reason, (label, raised.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND, label


async def test_a_long_lane_is_exported_in_pieces_and_imports_back_equal(lane_stub: Stub) -> None:
    original = new_lane_id("export-large")
    lane = await LaneScript.create(lane_stub, original)
    # Runs with a prompt of 400 KiB each: rows of several pages, a file of several pieces.
    for n in range(6):
        run = await lane.start_run(str(n) * (400 << 10))
        await run.turn("done")
        await run.end()
    pieces = [p.data async for p in lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=original))]
    assert len(pieces) >= 4
    assert all(0 < len(piece) <= EXPORT_PIECE_BYTES for piece in pieces)
    file = b"".join(pieces)
    # A piece ends with its last line but when that line is longer than a piece.
    at = 0
    for piece in pieces:
        at += len(piece)
        if file[at - 1 : at] != b"\n":
            line_start = file.rfind(b"\n", 0, at) + 1
            assert file.index(b"\n", at) - line_start > EXPORT_PIECE_BYTES
    imported = await import_file(lane_stub, new_lane_id("imported-large"), file, 1 << 16)
    await assert_copy(lane_stub, original, imported.lane_id)


async def assert_copy(stub: Stub, original_id: str, copy_id: str, floor: int = 0) -> None:
    """The lane ``copy_id`` imported from ``original_id``'s export equals it but for its id,
    last result and incarnation (a lane imported is a lane of its own), and its events after
    ``floor`` are the original's but for the lane they name."""
    original, copy = await snapshot_of(stub, original_id), await snapshot_of(stub, copy_id)
    assert copy.incarnation not in ("", original.incarnation)
    expected = snapshot_pb2.LaneSnapshot()
    expected.CopyFrom(original)
    expected.lane_id = copy_id
    expected.ClearField("last_result")
    expected.incarnation = copy.incarnation
    assert copy == expected
    old_events = await events_between(stub, original_id, floor, original.revision)
    for event in old_events:
        if event.lane_id:
            event.lane_id = copy_id
    assert await events_between(stub, copy_id, floor, copy.revision) == old_events
