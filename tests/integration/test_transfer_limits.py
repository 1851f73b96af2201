"""ExportLane and ImportLane in bounded memory: an export holds a page of its lane at a time
and a client that stops reading it is ended at the write deadline, its snapshot and memory
given back; an import holds a batch of its file at a time; a client that leaves an export
ends it quietly. The bytes held are the servicer's count (commands/transfer.py
TransferUsage); the resident memory it stands for is the benchmark's (bench/transfer_memory.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from lane.server.api import WatchSettings
from lane.server.api.transfer_rpcs import EXPORT_PIECE_BYTES
from lane.server.app.server import RunningServer
from lane.server.commands.transfer import EXPORT_PAGE_BYTES, IMPORT_BATCH_BYTES, TransferUsage
from tests.integration.lanes import new_lane_id
from tests.integration.servers import extra_server
from tests.integration.stalled_watcher import frozen_client
from tests.integration.test_app import _free_port
from tests.integration.test_export_import import import_file, snapshot_of
from tests.integration.test_serve_cli import lane_env
from tests.support.servers import serving, stop_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any
#: Progress reports of the long lane's tool call, and their size: its event log is 40 MB, more
#: than gRPC's and both kernels' buffers hold between a server and a client that stopped.
UPDATES, UPDATE_BYTES = 80, 500_000
#: The most an export or an import of the long lane may hold: a piece and a page of rows with
#: their lines (a row of UPDATE_BYTES beyond a page at most), or a batch of lines and a piece
#: of the file — a tenth of the lane.
BUDGET = EXPORT_PIECE_BYTES + 2 * (EXPORT_PAGE_BYTES + UPDATE_BYTES)


async def long_lane(stub: Stub, prefix: str) -> str:
    """An idle lane whose run's one tool call reported UPDATES progress results."""
    lane = await LaneScript.create(stub, prefix=prefix)
    run = await lane.start_run("go")
    call = (await run.turn(tool_calls=["big"])).call("big").start()
    for n in range(UPDATES):
        call.progress(f"{n:03}" + "x" * UPDATE_BYTES)
    await call.stage("done")
    await run.turn("done")
    await run.end()
    return lane.lane_id


async def until(condition: Any, within: float = 30.0) -> None:
    """Wait until ``condition()`` holds (polled)."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 (a count the server keeps; nothing to await)
            await asyncio.sleep(0.02)


def usage_of(server: RunningServer) -> TransferUsage:
    assert server.lane_servicer is not None
    return server.lane_servicer.transfers


async def test_an_export_nobody_reads_is_ended_and_holds_a_page(session_database_url) -> None:
    # A deadline far above any scheduling hiccup of a loaded test machine, so only the client
    # that stopped reading can miss it.
    watch = WatchSettings(write_deadline_seconds=2.0)
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        lane_id = await long_lane(stub, "export-stalled")
        usage = usage_of(running)
        # The client is a process of its own, frozen once it has the first piece: it stops
        # reading down to its socket, as a hung client does.
        async with frozen_client(running.port, lane_id, "export") as stalled:
            assert stalled.stdout is not None
            await until(lambda: usage.open == 1)
            # Cut off at its deadline while still frozen: its export closed, nothing held.
            await until(lambda: usage.open == 0)
            assert usage.held == 0
            # All the while it held a page and a piece, not the lane.
            assert 0 < usage.peak <= BUDGET, usage.peak
            # The export's connection is back in the pool: commands still go through.
            await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
            # Once thawed, the client finds what was buffered, then the reason it was ended.
            stalled.send_signal(signal.SIGCONT)
            outcome = json.loads(await asyncio.wait_for(stalled.stdout.readline(), 60))
            assert (outcome["code"], outcome["reason"]) == ("RESOURCE_EXHAUSTED", "EXPORT_TOO_SLOW")
            assert outcome["laneId"] == lane_id
            assert outcome["received"] < UPDATES * UPDATE_BYTES // EXPORT_PIECE_BYTES


async def test_an_export_that_is_read_holds_a_page_and_an_import_a_batch(
    lane_stub: Stub, lane_server: RunningServer
) -> None:
    lane_id = await long_lane(lane_stub, "export-bounded")
    usage = usage_of(lane_server)
    usage.peak = usage.held
    pieces = [p.data async for p in lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))]
    file = b"".join(pieces)
    assert len(file) > 5 * BUDGET
    assert 0 < usage.peak <= BUDGET, usage.peak
    usage.peak = usage.held
    # Sent in pieces of a batch: the import holds about one at a time, and one to write.
    imported = await import_file(lane_stub, new_lane_id("import-bounded"), file, IMPORT_BATCH_BYTES)
    assert 0 < usage.peak <= BUDGET, usage.peak
    assert usage.open == 0 and usage.held == 0
    original = await snapshot_of(lane_stub, lane_id)
    copy = await snapshot_of(lane_stub, imported.lane_id)
    assert list(copy.transcript) == list(original.transcript)
    assert copy.revision == original.revision


async def test_a_client_that_leaves_an_export_ends_it_quietly(
    session_database_url: str, tmp_path: Path
) -> None:
    # A real `lane serve` process (its event loop, its log), whose stderr is read at the end.
    port = _free_port()
    err = tmp_path / "serve.err"
    with err.open("wb") as stderr:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lane.client", "serve",
            "--listen", f"127.0.0.1:{port}", "--database-url", session_database_url,
            "--workers", "1", "--grace-seconds", "0.5",
            env=lane_env(), cwd=tmp_path, stderr=stderr,
        )  # fmt: skip
    try:
        assert await asyncio.wait_for(serving(port, server), 30), err.read_text()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = lane_service_pb2_grpc.LaneServiceStub(channel)
            lane_id = await long_lane(stub, "export-left")
            # One client cancels its call, another's process dies, each after its first piece
            # and a pause in which the server fills the buffers between and waits in a write
            # (where a client leaving used to surface as an unexpected error).
            call = stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))
            first = await call.read()
            assert isinstance(first, pb.ExportLaneResponse) and first.data
            await asyncio.sleep(1.0)
            call.cancel()
            async with frozen_client(port, lane_id, "export") as client:
                await asyncio.sleep(1.0)  # it stops reading, then dies
                client.kill()
            # The lane is exported whole afterwards: nothing of the two was left behind.
            pieces = [p.data async for p in stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))]
            assert b"".join(pieces).endswith(b"\n")
    finally:
        await stop_process(server, grace=20)
    log = err.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log
    assert log.count(f"ExportLane of lane {lane_id} ended early: ") == 2, log
