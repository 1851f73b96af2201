"""An import is checked strictly (its event log folded against its lane record); every lane the
service itself wrote must still pass. Lanes are built in every state the fuzzer's world knows
(streaming partials, retries, suspended runs, tool batches at every step, aborts, compactions,
navigations, faults), their open operation ended (aborted), then exported and imported: the
copy equals the original but for its id and last result, and takes commands."""

from __future__ import annotations

from typing import Any

import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.integration.lanes import Probe, events_between, user
from tests.integration.test_export_import import import_file, snapshot_of
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


@pytest.mark.parametrize("state", LANE_STATES)
async def test_a_lane_in_any_state_once_idle_exports_and_imports_back_equal(
    lane_stub: Stub, state: str
) -> None:
    world = World()
    ref = await build_lane(lane_stub, world, state)
    await end_open_operation(lane_stub, ref.lane_id, ref.lease_tokens)
    pieces = lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=ref.lane_id))
    file = b"".join([piece.data async for piece in pieces])
    copy_id = f"{ref.lane_id}-copy"
    await import_file(lane_stub, copy_id, file, 1 << 16)

    original, copy = (
        await snapshot_of(lane_stub, ref.lane_id),
        await snapshot_of(lane_stub, copy_id),
    )
    expected = snapshot_pb2.LaneSnapshot()
    expected.CopyFrom(original)
    expected.lane_id = copy_id
    expected.ClearField("last_result")
    assert copy == expected
    old_events = await events_between(lane_stub, ref.lane_id, 0, original.revision)
    for event in old_events:
        if event.lane_id:
            event.lane_id = copy_id
    assert await events_between(lane_stub, copy_id, 0, copy.revision) == old_events
    # The copy takes commands, and its watchers' fold equals its capture.
    probe = Probe(lane_stub, copy_id)
    await probe.start()
    await lane_stub.StartRun(pb.StartRunRequest(lane_id=copy_id, prompt=[user("again")]))
    await probe.check()
