"""An import is checked strictly (its event log folded against its lane record); every lane the
service itself wrote must still pass. Lanes are built in every state the fuzzer's world knows
(streaming partials, retries, suspended runs, tool batches at every step, aborts, compactions,
navigations, faults), their open operation ended (aborted), then exported and imported: the
copy equals the original but for its id and last result, and takes commands. So does a lane
whose log retention cut at every commit boundary in turn (its log then starts inside a run)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.store.retention import enforce_retention
from tests.integration.lanes import Probe, new_lane_id, user
from tests.integration.servers import extra_server
from tests.integration.test_export_import import assert_copy, import_file, rich_lane, snapshot_of
from tests.outage.fuzz_world import LANE_STATES, World, build_lane

pytestmark = pytest.mark.asyncio(loop_scope="session")

Stub = Any
ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED


async def end_open_operation(stub: Stub, lane_id: str, lease_tokens: list[int]) -> None:
    """Abort the lane's open operation, if any, and end it."""
    snapshot = await snapshot_of(stub, lane_id)
    if not snapshot.HasField("operation"):
        return
    operation = snapshot.operation
    token = lease_tokens[-1] if lease_tokens else 0
    if operation.kind == snapshot_pb2.OPERATION_KIND_COMPACTION:
        await stub.EndCompaction(
            pb.EndCompactionRequest(lane_id=lane_id, operation_id=operation.id, status=ABORTED)
        )
        return
    if operation.status != snapshot_pb2.OPERATION_STATUS_ABORTING:
        await stub.AbortOperation(
            pb.AbortOperationRequest(lane_id=lane_id, operation_id=operation.id)
        )
    await stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane_id, operation_id=operation.id, status=ABORTED, lease_token=token
        )
    )


async def round_trip(stub: Stub, lane_id: str, copy_id: str) -> None:
    """Export ``lane_id``, import it as ``copy_id``: equal but for the id and last result,
    the events kept equal but for the lane they name, and the copy takes commands."""
    pieces = stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))
    file = b"".join([piece.data async for piece in pieces])
    await import_file(stub, copy_id, file, 1 << 16)
    floor = int(file.split(b'"retentionFloor":"', 1)[1].split(b'"', 1)[0])
    await assert_copy(stub, lane_id, copy_id, floor)
    probe = Probe(stub, copy_id)
    await probe.start()
    await stub.StartRun(pb.StartRunRequest(lane_id=copy_id, prompt=[user("again")]))
    await probe.check()


@pytest.mark.parametrize("state", LANE_STATES)
async def test_a_lane_in_any_state_once_idle_exports_and_imports_back_equal(
    lane_stub: Stub, state: str
) -> None:
    world = World()
    ref = await build_lane(lane_stub, world, state)
    await end_open_operation(lane_stub, ref.lane_id, ref.lease_tokens)
    await round_trip(lane_stub, ref.lane_id, f"{ref.lane_id}-copy")


async def test_a_lane_whose_log_retention_cut_anywhere_imports_back_equal(
    fresh_database_url: str,
) -> None:
    # A database of its own: retention cuts every lane's log.
    async with extra_server(fresh_database_url) as (running, stub):
        lane_id = "retained"
        await rich_lane(stub, lane_id)
        revision = (await snapshot_of(stub, lane_id)).revision
        floors = {0}
        for keep in range(revision - 1, 0, -1):
            cut = await enforce_retention(
                running.store.pool, keep_events=keep, keep_age=timedelta(0)
            )
            floor = max(cut.values(), default=max(floors))
            if floor in floors:
                continue  # inside a commit: retention cuts whole commits only
            floors.add(floor)
            await round_trip(stub, lane_id, f"retained-from-{floor}")
        assert len(floors) > 5, floors  # the log was cut at many commit boundaries


async def test_an_imported_lane_exports_and_imports_again(lane_stub: Stub) -> None:
    # Found by the fuzzer: an imported lane has no last result (its operations' ids are the
    # exported lane's), but its log still ends that lane's last operation; its export was
    # refused INVALID_EXPORT "the lane's last result differ from what its events make".
    lane_id = new_lane_id("twice")
    await rich_lane(lane_stub, lane_id)
    copies = [lane_id, f"{lane_id}-copy", f"{lane_id}-copy-of-copy"]
    for source, copy_id in itertools.pairwise(copies):
        pieces = lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=source))
        file = b"".join([piece.data async for piece in pieces])
        await import_file(lane_stub, copy_id, file, 1 << 16)
        await assert_copy(lane_stub, lane_id, copy_id)
