"""ReadLaneEvents: a lane's event log a page at a time, through the real service — the log a
watch from the same revision streams, in whole groups, folding to the captures, and refused
where WatchLane's after_revision is refused."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import grpc
import pytest
from lane.client.reducer import fold
from lane.client.testing import LaneScript
from lane.v1 import events_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.history_rpcs import MAX_PAGE_BYTES
from lane.server.store import DEFAULT_NAMESPACE, LaneRef
from lane.server.store.retention import enforce_retention
from tests.integration.lanes import error_info, error_reason, events_between, new_lane_id, user

pytestmark = pytest.mark.asyncio(loop_scope="session")

Groups = list[list[events_pb2.HarnessEvent]]


async def read_all(stub: Any, lane_id: str, page_size: int, after: int = 0) -> list[Groups]:
    """Every page after ``after`` up to the head, read on from each page's last event."""
    pages: list[Groups] = []
    while True:
        page = await stub.ReadLaneEvents(
            pb.ReadLaneEventsRequest(lane_id=lane_id, after_revision=after, page_size=page_size)
        )
        if not page.groups:
            assert after == page.head_revision
            return pages
        pages.append([list(group.events) for group in page.groups])
        after = page.groups[-1].events[-1].revision


async def watched_groups(stub: Any, lane_id: str, until: int) -> Groups:
    """The groups WatchLane(after_revision=0) streams up to ``until``."""
    groups: Groups = []
    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id, after_revision=0))
    try:
        async for response in call:
            if response.WhichOneof("item") == "event_group":
                groups.append(list(response.event_group.events))
                if groups[-1][-1].revision >= until:
                    return groups
    finally:
        call.cancel()
    raise AssertionError("the watch ended")


async def a_lane_with_history(stub: Any) -> tuple[str, list[snapshot_pb2.LaneSnapshot]]:
    """A lane with multi-event groups (a run's start, a tool batch); its capture after each
    step."""
    script = await LaneScript.create(stub, new_lane_id("history"))
    captures = [await script.snapshot()]
    await script.enqueue("queued first", snapshot_pb2.QUEUE_KIND_NEXT_RUN)
    captures.append(await script.snapshot())
    run = await script.start_run("go")
    captures.append(await script.snapshot())
    await run.turn("calling", tool_calls=[("c0", "shell", {"n": 0}), ("c1", "shell", {"n": 1})])
    captures.append(await script.snapshot())
    await run.call("c0").start()
    await run.call("c1").start().stage("c1 done")
    captures.append(await script.snapshot())
    await run.call("c0").progress("half").stage("c0 done")
    captures.append(await script.snapshot())
    await run.turn("all done")
    await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    captures.append(await script.snapshot())
    return script.lane_id, captures


async def test_pages_are_the_watched_log_in_whole_groups(lane_stub) -> None:
    lane_id, captures = await a_lane_with_history(lane_stub)
    head = captures[-1].revision
    watched = await watched_groups(lane_stub, lane_id, head)
    assert any(len(group) > 2 for group in watched)
    for page_size in (1, 4, 0):
        pages = await read_all(lane_stub, lane_id, page_size)
        assert [group for page in pages for group in page] == watched, page_size
        for page in pages:
            # Whole groups while they fit the page size; always at least one.
            events = sum(len(group) for group in page)
            assert len(page) == 1 or events - len(page[-1]) < (page_size or 1000)
        if page_size == 1:
            assert [len(page) for page in pages] == [1] * len(watched)
    page = await lane_stub.ReadLaneEvents(pb.ReadLaneEventsRequest(lane_id=lane_id))
    assert (page.head_revision, page.retention_floor) == (head, 0)
    assert page.incarnation == captures[-1].incarnation
    at_head = await lane_stub.ReadLaneEvents(
        pb.ReadLaneEventsRequest(lane_id=lane_id, after_revision=head)
    )
    assert not at_head.groups and at_head.head_revision == head


async def test_a_page_folds_from_one_capture_to_the_next(lane_stub) -> None:
    lane_id, captures = await a_lane_with_history(lane_stub)
    for before, after in itertools.pairwise(captures):
        pages = await read_all(lane_stub, lane_id, 3, after=before.revision)
        events = [e for page in pages for group in page for e in group]
        upto = [e for e in events if e.revision <= after.revision]
        assert fold(before, upto).snapshot == after, after.revision


async def test_the_byte_bound_cuts_pages_at_group_ends(lane_stub) -> None:
    script = await LaneScript.create(lane_stub, new_lane_id("history-big"))
    big = "x" * (300 << 10)  # each run start holds it three times: ~900 KiB a group
    for n in range(3):
        run = await script.start_run(f"{n} {big}")
        await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    pages = await read_all(lane_stub, script.lane_id, 0)
    assert len(pages) >= 2
    groups = [group for page in pages for group in page]
    largest = max(sum(e.ByteSize() for e in group) for group in groups)
    for page in pages:
        size = sum(e.ByteSize() for group in page for e in group)
        assert size <= MAX_PAGE_BYTES + largest
    watched = await watched_groups(lane_stub, script.lane_id, groups[-1][-1].revision)
    assert groups == watched


async def refusal(stub: Any, **fields: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ReadLaneEvents(pb.ReadLaneEventsRequest(**fields))
    return caught.value


async def test_refused_where_a_watch_could_not_start(lane_stub, store) -> None:
    script = await LaneScript.create(lane_stub, new_lane_id("history-refused"))
    lane_id = script.lane_id
    run = await lane_stub.StartRun(
        pb.StartRunRequest(lane_id=lane_id, prompt=[user("a"), user("b")])
    )
    head = run.revision
    inside = await refusal(lane_stub, lane_id=lane_id, after_revision=head - 1)
    assert inside.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error_reason(inside) == "REVISION_INSIDE_GROUP"
    assert "cannot read lane" in (inside.details() or "")
    beyond = await refusal(lane_stub, lane_id=lane_id, after_revision=head + 1)
    assert error_reason(beyond) == "REVISION_OUT_OF_RANGE"
    assert error_info(beyond).metadata["head"] == str(head)
    negative = await refusal(lane_stub, lane_id=lane_id, after_revision=-1)
    assert error_reason(negative) == "REVISION_OUT_OF_RANGE"
    other = await refusal(lane_stub, lane_id=lane_id, incarnation="12345")
    assert other.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(other) == "LANE_INCARNATION_CHANGED"
    size = await refusal(lane_stub, lane_id=lane_id, page_size=10_001)
    assert (size.code(), error_reason(size)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_SIZE",
    )
    missing = await refusal(lane_stub, lane_id=new_lane_id("history-none"))
    assert (missing.code(), error_reason(missing)) == (
        grpc.StatusCode.NOT_FOUND,
        "LANE_NOT_FOUND",
    )
    no_id = await refusal(lane_stub)
    assert error_reason(no_id) == "MISSING_FIELD"

    # Below the retention floor: refused with the floor; at the floor: the rest of the log.
    await run_ended(lane_stub, lane_id, run.operation_id)
    for n in range(4):
        await lane_stub.EnqueueMessage(
            pb.EnqueueMessageRequest(
                lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user(f"m{n}")
            )
        )
    floors = await enforce_retention(store.pool, keep_events=2, keep_age=timedelta(0))
    floor = floors[LaneRef(DEFAULT_NAMESPACE, lane_id)]
    below = await refusal(lane_stub, lane_id=lane_id, after_revision=floor - 1)
    assert error_reason(below) == "REVISION_OUT_OF_RANGE"
    assert error_info(below).metadata["floor"] == str(floor)
    page = await lane_stub.ReadLaneEvents(
        pb.ReadLaneEventsRequest(lane_id=lane_id, after_revision=floor)
    )
    assert page.retention_floor == floor
    events = [e for group in page.groups for e in group.events]
    assert events == await events_between(lane_stub, lane_id, floor, page.head_revision)


async def run_ended(stub: Any, lane_id: str, operation_id: str) -> None:
    await stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane_id,
            operation_id=operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
        )
    )
