"""Random and mutated requests against a live server (docs/contract.md, Targets).

Every RPC of lane_service.proto gets thousands of generated requests (see
:mod:`tests.outage.fuzzing` for the generator and the checks): every answer must be OK or one of
the documented codes with an ErrorInfo whose reason docs/errors.md lists — never UNKNOWN,
INTERNAL or DATA_LOSS; every lane a request named must still capture without a fault, fold to
its capture, and hold no invalid value. test_refusals has the small, per-case version of the
mutated-bytes test; this is the large-scale one. ``python -m tests.outage.soak`` runs the
same generator for as many requests as asked.

The server is one of its own on a fresh database (the generator creates lanes with odd ids that
other tests listing lanes should not meet). Hypothesis runs with its example database off and a
fixed seed (``LANE_FUZZ_SEED``), so the generated choices are the same on every run; the ids the
server mints are not, so neither are the exact bytes.
"""

from __future__ import annotations

import os

import grpc
import pytest
from lane.client.testing import Aim, LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from tests.integration.lanes import Probe, error_reason, user
from tests.integration.servers import extra_server
from tests.outage.fuzz_transfer import EMPTY_FILE
from tests.outage.fuzz_world import LaneRef, World
from tests.outage.fuzzing import METHODS, Case, Fuzzer, fuzz

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

#: The CI run (at least 5,000 requests). Which RPCs get accepted depends on
#: timing as well as the random seed: at 5,000 requests runs here accepted 27-28 of the 32 RPCs (one
#: CI run failed the bar below), at 12,000 all 32, in about 100 s.
REQUESTS = int(os.environ.get("LANE_FUZZ_REQUESTS", "12000"))
SEED = int(os.environ.get("LANE_FUZZ_SEED", "8005"))
BATCH_SIZE = 50


# About 100 s on a quiet machine: more than the suite's default timeout allows on a busy one.
@pytest.mark.timeout(400)
async def test_random_and_mutated_requests_get_only_documented_answers(
    fresh_database_url: str,
) -> None:
    async with extra_server(fresh_database_url) as (running, stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
        try:
            stats = await fuzz(
                channel, stub, requests=REQUESTS, batch_size=BATCH_SIZE, seed_value=SEED
            )
        finally:
            await channel.close()
    print("\n" + stats.report())
    assert stats.sent >= REQUESTS >= 5000
    assert set(stats.by_method) == set(METHODS), "an RPC got no request"
    answered_ok = {method for method, counts in stats.by_method.items() if counts["OK"]}
    # Accepted commands keep the lanes moving through their states (a few RPCs need rare
    # states, e.g. ReplayToolCall a takeover of a SAFE call: the bench run reaches them).
    assert len(answered_ok) >= len(METHODS) - 4, f"never accepted: {set(METHODS) - answered_ok}"
    assert not stats.violations, f"{len(stats.violations)} violations:\n" + "\n".join(
        stats.violations[:50]
    )


# -- what the fuzzer found, as plain regression tests --------------------------------------------


async def test_usage_totals_beyond_int64_are_not_an_internal_error(lane_stub) -> None:
    # Found by the fuzzer: RecordUsage adds the row to the lane's totals (int64 fields); a sum
    # beyond int64 raised ValueError in service/lane/server/domain/usage.py add_usage and was
    # answered INTERNAL. Each request is valid on its own; the refusal must be a documented one.
    lane = await LaneScript.create(lane_stub, prefix="usage-overflow")
    aim = Aim(lane.lane_id)
    await lane_stub.RecordUsage(
        aim.request(pb.RecordUsageRequest, usage=messages_pb2.Usage(input=1))
    )
    before = await lane.snapshot()
    try:
        await lane_stub.RecordUsage(
            aim.request(pb.RecordUsageRequest, usage=messages_pb2.Usage(input=2**63 - 1))
        )
    except grpc.aio.AioRpcError as error:
        assert error.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ), f"{error.code().name}: {error.details()}"
        assert error_reason(error)
        assert await lane.snapshot() == before, "a refused command changed the lane"
        return
    probe = Probe(lane_stub, lane.lane_id)
    probe.snapshot = before
    await probe.check()


async def test_a_lane_filled_by_accepted_requests_still_captures(lane_stub) -> None:
    # Found by the fuzzer: requests each under the 4 MiB message limit are accepted, but the
    # lane they fill no longer fits one GetLaneSnapshot answer: capture then fails for good
    # with gRPC's own RESOURCE_EXHAUSTED "Sent message larger than max" (no ErrorInfo), and
    # so does a watcher's snapshot and any event group over the limit. Either the request that
    # would overflow is refused (the limits in docs/limits.md), or the lane still captures.
    lane = (await LaneScript.create(lane_stub, prefix="big-lane")).lane_id
    accepted = 0
    for index in range(3):
        big = user(f"{index}" + "x" * (3 << 19))  # 1.5 MiB of text
        try:
            await lane_stub.EnqueueMessage(
                pb.EnqueueMessageRequest(
                    lane_id=lane, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=big
                )
            )
            accepted += 1
        except grpc.aio.AioRpcError as error:
            assert error.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            ), f"{error.code().name}: {error.details()}"
            assert error_reason(error)
    problems = []
    try:
        await lane_stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))
    except grpc.aio.AioRpcError as error:
        problems.append(f"GetLaneSnapshot answers {error.code().name}: {error.details()}")
    stream = lane_stub.WatchLane(pb.WatchLaneRequest(lane_id=lane, after_revision=0))
    try:
        async for response in stream:
            group = response.event_group
            if (
                response.WhichOneof("item") == "event_group"
                and group.events[-1].revision > accepted
            ):
                break
    except grpc.aio.AioRpcError as error:
        problems.append(f"WatchLane of its event log ends {error.code().name}: {error.details()}")
    finally:
        stream.cancel()
    assert not problems, f"{accepted} EnqueueMessage of 1.5 MiB accepted; then " + "; ".join(
        problems
    )


def import_call(lane_id: str, data: bytes, *, fresh: bool) -> Case:
    message = pb.ImportLaneRequest(lane_id=lane_id, data=data).SerializeToString()
    return Case("ImportLane", "lines_edit", message, [message], fresh_lane=fresh)


async def test_a_refused_import_naming_an_imported_lane_is_no_leftover(
    lane_channel, lane_stub
) -> None:
    # The fuzzer's own check was wrong: it took every id that looks minted for an import
    # (`<prefix>-imported-N`) for a new lane, but the lanes earlier imports created look so
    # too and are among the lanes an import may name. A refused import naming one was
    # reported as "a refused import left lane ... behind".
    world = World()
    imported = world.fresh("imported")
    await lane_stub.ImportLane(iter([pb.ImportLaneRequest(lane_id=imported, data=EMPTY_FILE)]))
    world.add(LaneRef(imported, "imported"))
    fuzzer = Fuzzer(lane_channel, lane_stub, world)
    left, refused = world.fresh("imported"), world.fresh("imported")
    await fuzzer.send_batch(
        [
            import_call(imported, b"not an export\n", fresh=False),
            import_call(refused, b"not an export\n", fresh=True),
        ]
    )
    assert fuzzer.stats.by_code["INVALID_ARGUMENT"] == 2
    assert not fuzzer.stats.violations
    # A lane that is there after its import was refused still is one.
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=left))
    await fuzzer.send_batch([import_call(left, b"not an export\n", fresh=True)])
    assert fuzzer.stats.violations == [
        f"a refused import (lines_edit: INVALID_ARGUMENT INVALID_EXPORT) left lane {left!r} behind"
    ]
