"""DriveLane batches against the real service on a real PostgreSQL:

- a message carrying commands for three lanes, one of them refused: each answered under its
  sequence, exactly the two others committed;
- one lane's order inside a message (StartToolCall, UpdateToolCall, StageToolOutcome of one
  call together) and across messages (two lanes interleaved over several batches);
- malformed requests of a batch (a nested batch, no command, undecodable bytes) and a command
  beside a batch answered under their sequence, their neighbours served; a message over the
  batch bound ends the stream TOO_MANY_COMMANDS after answering what came before;
- a batch larger than the free in-flight slots is served as slots free up (no deadlock);
- answers ready together go out as one message; a client that sends single messages gets
  single answers; the service's header says it takes batches;
- the Python ``LaneSession`` coalesces commands issued in one loop turn: the service reads
  fewer messages than commands (``lane_drive_frames_total``), and each caller gets its answer;
- the write deadline: a client that sends commands and never reads its answers is cut off
  with RESOURCE_EXHAUSTED ``SESSION_TOO_SLOW``; its command that was in its transaction then
  still commits, and the service let go of the stream while the client still did not read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import grpc
import pytest
from lane.client.errors import LaneError, lane_error, status_error
from lane.client.session import LaneSession
from lane.client.testing import LaneScript
from lane.limits import DRIVE_BATCH_HEADER, MAX_DRIVE_BATCH
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.api import WatchSettings
from lane.server.api.drive import MAX_COMMANDS_IN_FLIGHT
from lane.server.api.framing import length_delimited
from lane.server.app.server import RunningServer
from tests.integration.lanes import events_between, kinds, new_lane_id, result
from tests.integration.test_drive_lane import (
    created,
    raw_drive,
    revision,
    row_locked,
    usage,
    waiting_on_locks,
)
from tests.support.servers import extra_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

BATCH = pb.DriveLaneRequest.DESCRIPTOR.fields_by_name["batch"].number


def batch(*requests: pb.DriveLaneRequest | bytes, sequence: int = 0) -> bytes:
    """An encoded DriveLaneRequest whose batch holds ``requests`` (messages or raw bytes)."""
    head = pb.DriveLaneRequest(sequence=sequence).SerializeToString()
    return head + b"".join(
        length_delimited(BATCH, r if isinstance(r, bytes) else r.SerializeToString())
        for r in requests
    )


def flat(messages: Iterable[pb.DriveLaneResponse]) -> dict[int, pb.DriveLaneResponse]:
    """The answers of ``messages`` (batches opened) by sequence."""
    answers: dict[int, pb.DriveLaneResponse] = {}
    for message in messages:
        for answer in message.batch or [message]:
            assert answer.sequence not in answers, answer.sequence
            answers[answer.sequence] = answer
    return answers


async def read_answers(call: Any, count: int) -> tuple[dict[int, pb.DriveLaneResponse], int]:
    """Read until ``count`` answers came; them by sequence, and the messages they came in."""
    messages: list[pb.DriveLaneResponse] = []
    while sum(len(m.batch) or 1 for m in messages) < count:
        messages.append(await asyncio.wait_for(call.read(), 20))
    return flat(messages), len(messages)


def refusal(answer: pb.DriveLaneResponse) -> tuple[grpc.StatusCode, str]:
    assert answer.WhichOneof("answer") == "error", answer
    error = status_error(answer.error)
    return error.code, error.reason


def frames(server: RunningServer) -> dict[tuple[str, str], float]:
    """``lane_drive_frames_total`` by (direction, kind)."""
    return {
        (direction, kind): server.registry.get_sample_value(
            "lane_drive_frames_total", {"direction": direction, "kind": kind}
        )
        or 0.0
        for direction in ("read", "written")
        for kind in ("single", "batch")
    }


# -- failure isolation and order -----------------------------------------------------------------


async def test_a_batch_for_three_lanes_commits_exactly_the_accepted_two(
    lane_stub, lane_channel
) -> None:
    first, refused, third = (new_lane_id(f"b3-{n}") for n in ("a", "b", "c"))
    await created(lane_stub, first, refused, third)
    call = raw_drive(lane_channel)
    try:
        await call.write(
            batch(
                pb.DriveLaneRequest(sequence=1, record_usage=usage(first, 1)),
                pb.DriveLaneRequest(
                    sequence=2,
                    start_turn=pb.StartTurnRequest(lane_id=refused, operation_id="no-such-run"),
                ),
                pb.DriveLaneRequest(sequence=3, record_usage=usage(third, 1)),
            )
        )
        answers, _ = await read_answers(call, 3)
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    finally:
        call.cancel()
    assert answers[1].record_usage.revision == 2
    assert refusal(answers[2]) == (grpc.StatusCode.FAILED_PRECONDITION, "OPERATION_NOT_OPEN")
    assert answers[3].record_usage.revision == 2
    assert [await revision(lane_stub, lane) for lane in (first, refused, third)] == [2, 1, 2]
    assert kinds(await events_between(lane_stub, first, 1, 2)) == ["usage"]


async def test_one_lanes_commands_keep_their_order_inside_a_batch(lane_stub, lane_channel) -> None:
    # Out of order, the progress report and the stage would be refused: the call would not
    # have started yet.
    run = await (await LaneScript.create(lane_stub, prefix="b-order")).start_run("go")
    await run.turn(tool_calls=["c1"])
    aim = run.call("c1").aim
    call = raw_drive(lane_channel)
    try:
        await call.write(
            batch(
                pb.DriveLaneRequest(
                    sequence=1,
                    start_tool_call=aim.request(pb.StartToolCallRequest, arguments_json="{}"),
                ),
                pb.DriveLaneRequest(
                    sequence=2,
                    update_tool_call=aim.request(
                        pb.UpdateToolCallRequest, partial_result=result("half")
                    ),
                ),
                pb.DriveLaneRequest(
                    sequence=3,
                    stage_tool_outcome=aim.request(
                        pb.StageToolOutcomeRequest,
                        executed=pb.ExecutedOutcome(result=result("done")),
                    ),
                ),
            )
        )
        answers, _ = await read_answers(call, 3)
    finally:
        call.cancel()
    assert [answers[n].WhichOneof("answer") for n in (1, 2, 3)] == [
        "start_tool_call",
        "update_tool_call",
        "stage_tool_outcome",
    ]
    revisions = [
        answers[1].start_tool_call.revision,
        answers[2].update_tool_call.revision,
        answers[3].stage_tool_outcome.revision,
    ]
    assert revisions == sorted(revisions) and len(set(revisions)) == 3


async def test_two_lanes_interleaved_over_several_batches_keep_each_lanes_order(
    lane_stub, lane_channel
) -> None:
    lanes = [new_lane_id("b-weave0"), new_lane_id("b-weave1")]
    await created(lane_stub, *lanes)
    per_message, messages = 10, 4  # 40 commands, 20 a lane, alternating lanes
    call = raw_drive(lane_channel)
    try:
        sequence = 0
        for _ in range(messages):
            requests = []
            for _ in range(per_message):
                sequence += 1
                lane = lanes[sequence % 2]
                n = (sequence + 1) // 2
                requests.append(pb.DriveLaneRequest(sequence=sequence, record_usage=usage(lane, n)))
            await call.write(batch(*requests))
        answers, _ = await read_answers(call, sequence)
    finally:
        call.cancel()
    for index, lane in enumerate(lanes):
        sent = [s for s in range(1, sequence + 1) if s % 2 == index]
        assert [answers[s].record_usage.revision for s in sent] == list(range(2, 22)), lane
        events = await events_between(lane_stub, lane, 1, 21)
        assert [e.usage.row.usage.input for e in events] == list(range(1, 21)), lane


# -- malformed batches and the bounds ------------------------------------------------------------


async def test_malformed_requests_of_a_batch_are_answered_under_their_sequence(
    lane_stub, lane_channel
) -> None:
    good, nested, beside, late = (new_lane_id(f"b-bad-{n}") for n in ("ok", "in", "by", "ok2"))
    create = pb.DriveLaneRequest
    call = raw_drive(lane_channel)
    try:
        # Beside the batch: a command of the message itself (sequence 9), not served.
        message = (
            batch(
                create(sequence=1, create_lane=pb.CreateLaneRequest(lane_id=good)),
                # A request of a batch holding a batch itself.
                batch(
                    create(sequence=21, create_lane=pb.CreateLaneRequest(lane_id=nested)),
                    sequence=2,
                ),
                create(sequence=3),  # no command
                b"\x08\x04\x1a\x03abc",  # sequence 4, create_lane holding three bytes of no message
                create(sequence=5, create_lane=pb.CreateLaneRequest(lane_id=late)),
                sequence=9,
            )
            + create(create_lane=pb.CreateLaneRequest(lane_id=beside)).SerializeToString()
        )
        await call.write(message)
        # Padding: a single message of more top-level fields than any request has.
        await call.write(pb.DriveLaneRequest(sequence=7).SerializeToString() + b"\x08\x07" * 1000)
        answers, _ = await read_answers(call, 7)
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK  # the stream went on
    finally:
        call.cancel()
    assert answers[1].create_lane.created and answers[5].create_lane.created
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert refusal(answers[2]) == (invalid, "MALFORMED_REQUEST")
    assert refusal(answers[3]) == (invalid, "MISSING_FIELD")
    assert status_error(answers[3].error).metadata == {"field": "command"}
    assert refusal(answers[4]) == (invalid, "MALFORMED_REQUEST")
    assert refusal(answers[9]) == (invalid, "MALFORMED_REQUEST")
    assert refusal(answers[7]) == (invalid, "MALFORMED_REQUEST")
    assert 21 not in answers
    listed = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=1000))
    ids = {lane.lane_id for lane in listed.lanes}
    assert {good, late} <= ids and not {nested, beside} & ids


async def test_answers_ready_together_go_out_in_one_message(lane_stub, lane_channel) -> None:
    # Refusals of a batch's requests are ready as the batch is read, all in one loop turn.
    call = raw_drive(lane_channel)
    try:
        await call.write(batch(*(pb.DriveLaneRequest(sequence=n) for n in range(1, 6))))
        answers, messages = await read_answers(call, 5)
    finally:
        call.cancel()
    assert messages == 1
    assert all(refusal(answers[n])[1] == "MISSING_FIELD" for n in range(1, 6))


async def test_a_message_over_the_batch_bound_ends_the_stream_after_what_came_before(
    lane_stub, lane_channel
) -> None:
    before = new_lane_id("b-over-before")
    over = [new_lane_id(f"b-over{n}") for n in range(MAX_DRIVE_BATCH + 1)]
    call = raw_drive(lane_channel)
    try:
        request = pb.DriveLaneRequest(sequence=1, create_lane=pb.CreateLaneRequest(lane_id=before))
        await call.write(request.SerializeToString())
        await call.write(
            batch(
                *(
                    pb.DriveLaneRequest(
                        sequence=10 + n, create_lane=pb.CreateLaneRequest(lane_id=lane)
                    )
                    for n, lane in enumerate(over)
                )
            )
        )
        answers = [await asyncio.wait_for(call.read(), 20)]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), 20)
    finally:
        call.cancel()
    assert [a.sequence for a in answers] == [1] and answers[0].create_lane.created
    error = lane_error(ended.value)
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "TOO_MANY_COMMANDS")
    assert error.metadata == {"limit": str(MAX_DRIVE_BATCH)}
    listed = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=1000))
    assert not set(over) & {lane.lane_id for lane in listed.lanes}  # none of them ran


async def test_a_batch_larger_than_the_free_slots_is_served_as_they_free_up(
    lane_stub, lane_channel, session_database_url: str
) -> None:
    held, free = new_lane_id("b-slots-held"), new_lane_id("b-slots-free")
    await created(lane_stub, held, free)
    waiting = MAX_COMMANDS_IN_FLIGHT - 4  # all but four slots taken by the held lane
    call = raw_drive(lane_channel)
    try:
        async with row_locked(session_database_url, held):
            for n in range(1, waiting + 1):
                request = pb.DriveLaneRequest(sequence=n, record_usage=usage(held, n))
                await call.write(request.SerializeToString())
            await waiting_on_locks(session_database_url, 1)
            # A full batch for a free lane: four slots are free; each answer frees the next.
            await call.write(
                batch(
                    *(
                        pb.DriveLaneRequest(sequence=100 + n, record_usage=usage(free, n))
                        for n in range(1, MAX_DRIVE_BATCH + 1)
                    )
                )
            )
            answers, _ = await read_answers(call, MAX_DRIVE_BATCH)
            # Every command of the batch was answered while the held lane still waits.
            assert set(answers) == {100 + n for n in range(1, MAX_DRIVE_BATCH + 1)}
        rest, _ = await read_answers(call, waiting)
    finally:
        call.cancel()
    assert [answers[100 + n].record_usage.revision for n in range(1, 65)] == list(range(2, 66))
    assert [rest[n].record_usage.revision for n in range(1, waiting + 1)] == list(
        range(2, waiting + 2)
    )


# -- single clients, and the Python session ------------------------------------------------------


async def test_a_client_of_single_messages_gets_single_answers(
    lane_stub, lane_channel, lane_server: RunningServer
) -> None:
    lanes = [new_lane_id(f"b-single{n}") for n in range(8)]
    before = frames(lane_server)
    call = raw_drive(lane_channel)
    try:
        # The service says it takes batches, and sends this client none.
        assert (DRIVE_BATCH_HEADER, str(MAX_DRIVE_BATCH)) in tuple(await call.initial_metadata())
        for n, lane in enumerate(lanes, start=1):
            request = pb.DriveLaneRequest(
                sequence=n, create_lane=pb.CreateLaneRequest(lane_id=lane)
            )
            await call.write(request.SerializeToString())
        messages = [await asyncio.wait_for(call.read(), 20) for _ in lanes]
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
    finally:
        call.cancel()
    assert all(not m.batch for m in messages)
    assert sorted(m.sequence for m in messages) == list(range(1, 9))
    after = frames(lane_server)
    assert after[("read", "single")] - before[("read", "single")] == 8
    assert after[("written", "single")] - before[("written", "single")] == 8
    assert after[("written", "batch")] == before[("written", "batch")]


async def test_the_session_sends_commands_of_one_loop_turn_together(
    lane_stub, lane_server: RunningServer
) -> None:
    lanes = [new_lane_id(f"b-turn{n}") for n in range(4)]
    await created(lane_stub, *lanes)
    async with LaneSession(lane_stub) as session:
        await session.call(pb.GetLaneSnapshotRequest(lane_id=lanes[0]))  # the stream is up
        before, sent = frames(lane_server), session.messages_sent
        # 20 commands issued in one turn: 5 per lane, in order.
        calls = [session.call(usage(lane, n)) for n in range(1, 6) for lane in lanes]
        answers = await asyncio.gather(*calls)
        after = frames(lane_server)
        assert session.streams_opened == 1
    read = sum(after[("read", k)] - before[("read", k)] for k in ("single", "batch"))
    assert after[("read", "batch")] > before[("read", "batch")]
    assert read < len(calls), read  # fewer messages than commands reached the service
    assert session.messages_sent - sent == read
    for index, lane in enumerate(lanes):
        assert [a.revision for a in answers[index :: len(lanes)]] == [2, 3, 4, 5, 6], lane


async def test_a_refusal_in_a_sessions_batch_reaches_its_caller_alone(lane_stub) -> None:
    lane = new_lane_id("b-session-refused")
    await created(lane_stub, lane)
    async with LaneSession(lane_stub) as session:
        await session.call(pb.GetLaneSnapshotRequest(lane_id=lane))
        results = await asyncio.gather(
            session.call(usage(lane, 1)),
            session.call(pb.StartTurnRequest(lane_id=lane, operation_id="no-such-run")),
            session.call(usage(lane, 2)),
            return_exceptions=True,
        )
        assert session.messages_sent < session.commands_sent
    first, refused, second = results
    assert isinstance(refused, LaneError) and refused.reason == "OPERATION_NOT_OPEN"
    assert isinstance(first, pb.RecordUsageResponse) and first.revision == 2
    assert isinstance(second, pb.RecordUsageResponse) and second.revision == 3


# -- the write deadline --------------------------------------------------------------------------


async def test_a_client_that_never_reads_its_answers_is_cut_off(session_database_url: str) -> None:
    # (The default deadline, 30 s, is the watchers' LANE_WATCH_WRITE_DEADLINE_SECONDS.)
    watch = WatchSettings(write_deadline_seconds=1.0)
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        big, written = new_lane_id("b-slow-big"), new_lane_id("b-slow-written")
        await created(stub, big, written)
        for part in "ab":  # an inbox of about 1 MB: each snapshot answer carries it
            await LaneScript(stub, big).enqueue(part * 500_000, snapshot_pb2.QUEUE_KIND_FOLLOW_UP)
        # No BDP probing: the stream's window stays at 64 KiB, so unread answers fill it fast.
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{running.port}", options=[("grpc.http2.bdp_probe", 0)]
        )
        call = raw_drive(channel)
        assert running.lane_servicer is not None
        sessions = running.lane_servicer.drive_sessions
        try:
            async with row_locked(session_database_url, written):
                # A command in its transaction when the stream is cut off: it still commits.
                request = pb.DriveLaneRequest(sequence=1, record_usage=usage(written, 1))
                await call.write(request.SerializeToString())
                await waiting_on_locks(session_database_url, 1)
                read = pb.DriveLaneRequest(get_lane_snapshot=pb.GetLaneSnapshotRequest(lane_id=big))
                for n in range(10, 40):
                    read.sequence = n
                    await call.write(read.SerializeToString())
                # The service lets go of the stream while the client still reads nothing.
                for _ in range(300):
                    if not sessions:
                        break
                    await asyncio.sleep(0.1)
                assert not sessions, "the stream was never cut off"
            for _ in range(100):
                if await revision(stub, written) == 2:
                    break
                await asyncio.sleep(0.1)
            assert await revision(stub, written) == 2
            # Reading again, the client finds the answers gRPC had buffered, then the reason.
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while True:
                    await asyncio.wait_for(call.read(), 20)
            assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            error = lane_error(ended.value)
            assert error.reason == "SESSION_TOO_SLOW", error
            assert error.metadata == {"deadlineSeconds": "1"}
        finally:
            call.cancel()
            await channel.close()
