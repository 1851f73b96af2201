"""The published limits (docs/limits.md), each at its boundary through gRPC.

A request at a limit is accepted; one byte over is refused with the documented code and reason
(docs/errors.md) and changes nothing: the lane's GetLaneSnapshot is the same before and after,
revision included. Everything accepted stays deliverable: a Probe folds every accepted commit's
events (read back through WatchLane) into the previous capture and compares with a fresh one.

- request size: 4 MiB, gRPC's own RESOURCE_EXHAUSTED past it;
- counts (INVALID_ARGUMENT ``TOO_MANY_*``): tool calls per assistant message, content blocks,
  messages and tool names per request, counted before anything walks the request; a batch at
  the call limit runs to its end, call by call or ended at once;
- payloads: 512 KiB per message, argument text or result, 64 KiB per operation error
  (INVALID_ARGUMENT ``PAYLOAD_TOO_LARGE``), a one-call run with every payload at its limit;
- commits: results adding up past one message are placed in one commit, which watchers get in
  parts (nothing is refused for a commit's size; the parts' byte-exact edges are in
  tests/unit/test_message_parts.py);
- GetLaneSnapshot: exactly 4 MiB answered, one byte more refused (``SNAPSHOT_TOO_LARGE``), and
  WatchLane still delivers that lane in transcript chunks of at most about 1 MiB;
- watchers: per lane and per process (``TOO_MANY_WATCHERS``), a leaving watcher frees its
  place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from lane.client.testing import LaneScript, RunScript
from lane.limits import MAX_MESSAGE_BYTES
from lane.v1 import entries_pb2, lane_service_pb2_grpc, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api import WatchSettings
from lane.server.app.config import ConfigError, Settings
from lane.server.app.server import MAX_RECEIVE_MESSAGE_BYTES, MAX_SEND_MESSAGE_BYTES, start_server
from lane.server.domain.limits import (
    MAX_CONTENT_BLOCKS,
    MAX_ERROR_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_REQUEST_MESSAGES,
    MAX_TOOL_CALLS,
    MAX_TOOL_NAMES,
)
from lane.server.store import DEFAULT_NAMESPACE, LaneRef
from tests.integration.lanes import (
    Probe,
    assistant,
    error_info,
    new_lane_id,
    result,
    text,
    tool_call,
    user,
)
from tests.integration.servers import extra_server
from tests.outage.fuzz_encoding import padded_to

pytestmark = pytest.mark.asyncio(loop_scope="session")

M = Any  # a protobuf message


def sized(make: Callable[[int], M], target: int) -> M:
    """``make(n)`` for the ``n`` whose encoding is exactly ``target`` bytes."""
    n = target
    for _ in range(10):
        message = make(n)
        size = message.ByteSize() if isinstance(message, Message) else len(message.encode())
        if size == target:
            return message
        n += target - size
    raise AssertionError(f"no size {target}")


def sized_text(make: Callable[[str], M], target: int) -> M:
    """``make("x" * n)`` of exactly ``target`` bytes."""
    return sized(lambda n: make("x" * n), target)


async def snapshot_of(stub: Any, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    response = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    snapshot: snapshot_pb2.LaneSnapshot = response.snapshot
    return snapshot


async def refused(
    stub: Any,
    lane_id: str,
    call: Awaitable[Any],
    code: grpc.StatusCode,
    reason: str,
    **metadata: object,
) -> grpc.aio.AioRpcError:
    """Await ``call``: it must fail with ``code`` and ``reason`` (and ``metadata``) and leave
    the lane as it was."""
    before = await snapshot_of(stub, lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    assert error.code() == code, error.details()
    info = error_info(error)
    assert info.reason == reason, error.details()
    for key, value in metadata.items():
        assert info.metadata[key] == str(value), (key, dict(info.metadata))
    after = await snapshot_of(stub, lane_id)
    assert after == before, "a refused command changed the lane"
    assert after.revision == before.revision
    return error


async def over_then_at(
    stub: Any,
    lane_id: str,
    send: Callable[[int], Awaitable[Any]],
    field: str,
    limit: int = MAX_PAYLOAD_BYTES,
) -> Any:
    """``send(limit + 1)`` is refused PAYLOAD_TOO_LARGE naming ``field``; ``send(limit)`` is
    accepted (its answer is returned)."""
    await refused(
        stub,
        lane_id,
        send(limit + 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PAYLOAD_TOO_LARGE",
        field=field,
        bytes=limit + 1,
        limit=limit,
    )
    return await send(limit)


async def new_lane(stub: Any, prefix: str = "limits") -> str:
    return (await LaneScript.create(stub, prefix=prefix)).lane_id


async def test_the_published_message_limits_agree() -> None:
    assert MAX_RECEIVE_MESSAGE_BYTES == MAX_SEND_MESSAGE_BYTES == MAX_MESSAGE_BYTES == 4 << 20
    assert (MAX_PAYLOAD_BYTES, MAX_ERROR_BYTES) == (512 << 10, 64 << 10)
    assert WatchSettings().chunk_bytes == 1 << 20


# -- request size ----------------------------------------------------------------------------


async def test_a_request_of_4_mib_is_accepted_one_byte_more_is_refused_by_grpc(
    lane_stub, lane_channel
) -> None:
    lane_id = await new_lane(lane_stub)
    enqueue = lane_channel.unary_unary(
        "/lane.v1.LaneService/EnqueueMessage",
        request_serializer=lambda body: body,
        response_deserializer=pb.EnqueueMessageResponse.FromString,
    )
    request = pb.EnqueueMessageRequest(
        lane_id=lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user("padded")
    ).SerializeToString()
    # An unknown field pads the request: the service ignores it, gRPC counts it.
    over = padded_to(request, MAX_RECEIVE_MESSAGE_BYTES + 1)
    before = await snapshot_of(lane_stub, lane_id)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await enqueue(over)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert await snapshot_of(lane_stub, lane_id) == before

    answer = await enqueue(padded_to(request, MAX_RECEIVE_MESSAGE_BYTES))
    assert answer.revision == before.revision + 1
    after = await snapshot_of(lane_stub, lane_id)
    assert [item.message for item in after.queues] == [user("padded")]


# -- counts ----------------------------------------------------------------------------------


async def open_turn(stub: Any) -> tuple[RunScript, str, str]:
    """A run on a new lane with an open turn: (the run, the turn id, the lane id)."""
    run = await (await LaneScript.create(stub, prefix="limits")).start_run("go")
    return run, await run.start_turn(), run.lane.lane_id


async def probed_lane(stub: Any) -> tuple[LaneScript, Probe]:
    """A new lane, and a Probe started on it."""
    lane = await LaneScript.create(stub, prefix="limits")
    probe = Probe(stub, lane.lane_id)
    await probe.start()
    return lane, probe


def sized_result_text(size: int) -> str:
    """The text of a one-block tool result of exactly ``size`` bytes."""
    value: str = sized_text(result, size).content[0].text.text
    return value


def calls(count: int, width: int = 0) -> list[messages_pb2.ContentBlock]:
    """``count`` tool-call blocks with distinct ids (padded to ``width`` bytes)."""
    return [tool_call(f"{i:0{width}d}" if width else f"c{i}", "t", {"i": i}) for i in range(count)]


async def test_too_many_tool_calls_or_content_blocks_are_refused_and_change_nothing(
    lane_stub,
) -> None:
    stub = lane_stub
    run, turn_id, lane_id = await open_turn(stub)

    def settle(message: messages_pb2.AssistantMessage) -> Any:
        return run.settle(turn_id, message=message)

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for count in (MAX_TOOL_CALLS + 1, 3000):
        await refused(
            stub, lane_id, settle(assistant(*calls(count))), invalid, "TOO_MANY_TOOL_CALLS",
            field="message.content", count=count, limit=MAX_TOOL_CALLS,
        )  # fmt: skip
    blocks = [text("") for _ in range(MAX_CONTENT_BLOCKS + 1)]
    await refused(
        stub, lane_id, settle(assistant(*blocks, stop=messages_pb2.STOP_REASON_STOP)), invalid,
        "TOO_MANY_CONTENT_BLOCKS", field="message.content", count=MAX_CONTENT_BLOCKS + 1,
        limit=MAX_CONTENT_BLOCKS,
    )  # fmt: skip
    # A message of 4 MiB made of a million empty text blocks: counted from its bytes, never
    # decoded, the count stopping one past the limit (a lower bound: "at least").
    huge = replace(run.aim, turn_id=turn_id).request(pb.SettleAssistantMessageRequest)
    huge.message.stop_reason = messages_pb2.STOP_REASON_STOP
    huge.message.content.extend([text("")] * 1_000_000)
    assert huge.ByteSize() <= MAX_RECEIVE_MESSAGE_BYTES
    error = await refused(
        stub, lane_id, stub.SettleAssistantMessage(huge), invalid, "TOO_MANY_CONTENT_BLOCKS",
        count=MAX_CONTENT_BLOCKS + 1, limit=MAX_CONTENT_BLOCKS,
    )  # fmt: skip
    assert f"at least {MAX_CONTENT_BLOCKS + 1}" in (error.details() or "")
    # Blocks add up over the messages of one request, and messages are counted too.
    prompt = [
        messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text("")] * 64))
        for _ in range(MAX_CONTENT_BLOCKS // 64 + 1)
    ]
    other = await new_lane(stub)
    await refused(
        stub, other, stub.StartRun(pb.StartRunRequest(lane_id=other, prompt=prompt)), invalid,
        "TOO_MANY_CONTENT_BLOCKS", limit=MAX_CONTENT_BLOCKS,
    )  # fmt: skip
    prompt = [user(str(i)) for i in range(MAX_REQUEST_MESSAGES + 1)]
    await refused(
        stub, other, stub.StartRun(pb.StartRunRequest(lane_id=other, prompt=prompt)), invalid,
        "TOO_MANY_MESSAGES", field="prompt", count=MAX_REQUEST_MESSAGES + 1,
        limit=MAX_REQUEST_MESSAGES,
    )  # fmt: skip
    names = pb.UpdateLaneConfigRequest(lane_id=other)
    names.active_tool_names.names.extend(f"t{i}" for i in range(MAX_TOOL_NAMES + 1))
    await refused(
        stub, other, stub.UpdateLaneConfig(names), invalid, "TOO_MANY_TOOL_NAMES",
        field="active_tool_names.names", count=MAX_TOOL_NAMES + 1, limit=MAX_TOOL_NAMES,
    )  # fmt: skip
    # At the limits, accepted.
    at_limit = [text("") for _ in range(MAX_CONTENT_BLOCKS - MAX_TOOL_CALLS)]
    answer = (await settle(assistant(*at_limit, *calls(MAX_TOOL_CALLS)))).settled
    assert len(answer.tool_calls) == MAX_TOOL_CALLS
    prompt = [user(str(i)) for i in range(MAX_REQUEST_MESSAGES)]
    await stub.StartRun(pb.StartRunRequest(lane_id=other, prompt=prompt))


async def test_a_batch_at_the_call_limit_runs_to_its_end(lane_stub) -> None:
    stub = lane_stub
    run, turn_id, lane_id = await open_turn(stub)
    probe = Probe(stub, lane_id)
    await probe.start()
    ids = [f"c{i}" for i in range(MAX_TOOL_CALLS)]
    many = assistant(text("many"), *calls(MAX_TOOL_CALLS))
    settled = (await run.settle(turn_id, message=many)).settled
    assert [c.tool_call_id for c in settled.tool_calls] == ids
    await probe.check()
    placed: list[str] = []
    for call_id in ids:
        staged = (await run.call(call_id).start().stage(f"done {call_id}")).staged
        assert staged is not None
        placed.extend(staged.placed_tool_call_ids)
    assert placed == ids and staged is not None and staged.batch_complete
    await probe.check()
    failed = snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
    await run.end(failed, snapshot_pb2.OperationError(code="E", message="needs an answer"))
    await probe.check()


async def test_a_batch_at_the_call_limit_with_the_longest_ids_ends_at_once(lane_stub) -> None:
    # Every id and name at 128 bytes, nothing started: EndRun settles and places all of them
    # in one event group, which WatchLane delivers.
    stub = lane_stub
    lane_id = new_lane_id("L" * 115)
    assert len(lane_id) == 128
    lane = await LaneScript.create(stub, lane_id)
    # The run's and the turn's ids are chosen here (128 bytes), so they are sent by hand.
    started = await stub.StartRun(
        pb.StartRunRequest(
            lane_id=lane_id, operation_id=new_lane_id("R" * 115), prompt=[user("go")]
        )
    )
    run = RunScript(lane, started.operation_id, started.lease.token, started)
    turn = await stub.StartTurn(run.aim.request(pb.StartTurnRequest, turn_id="T" * 128))
    blocks = [tool_call(f"{i:0128d}", "n" * 128, {}) for i in range(MAX_TOOL_CALLS)]
    await run.settle(turn.turn_id, message=assistant(*blocks))
    probe = Probe(stub, lane_id)
    await probe.start()
    ended = await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    events = await probe.check()
    assert ended.result.status == snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
    assert sum(1 for e in events if e.WhichOneof("kind") == "entry_added") == MAX_TOOL_CALLS


# -- payloads --------------------------------------------------------------------------------


async def test_a_run_with_every_payload_at_its_limit(lane_stub) -> None:
    stub = lane_stub
    lane, probe = await probed_lane(stub)
    lane_id = lane.lane_id

    def enqueue(size: int) -> Any:
        return lane.enqueue(sized_text(user, size), snapshot_pb2.QUEUE_KIND_NEXT_RUN)

    await over_then_at(stub, lane_id, enqueue, "message")
    await probe.check()

    def start_run(size: int) -> Any:
        return lane.start_run(user("hi"), sized_text(user, size))

    run = await over_then_at(stub, lane_id, start_run, "prompt[1]")
    await probe.check()  # the queued message and both prompts placed: three times each
    turn_id = await run.start_turn()
    await probe.check()

    def settle(size: int) -> Any:
        message = sized_text(lambda x: assistant(text(x), tool_call("c1", "t", {"a": 1})), size)
        return run.settle(turn_id, message=message)

    await over_then_at(stub, lane_id, settle, "message")
    await probe.check()

    def start_tool(size: int) -> Any:
        return run.call("c1").start(sized_text(lambda x: json.dumps({"a": x}), size))

    await over_then_at(stub, lane_id, start_tool, "arguments_json")
    await probe.check(["c1"])

    def checkpoint(size: int) -> Any:
        return run.call("c1").progress(sized_result_text(size), checkpoint=True)

    await over_then_at(stub, lane_id, checkpoint, "partial_result")
    await probe.check(["c1"])

    def stage(size: int) -> Any:
        return run.call("c1").stage(sized_result_text(size))

    staged = (await over_then_at(stub, lane_id, stage, "executed.result")).staged
    assert staged.batch_complete  # placed: the result in five events, two of them one group
    await probe.check(["c1"])

    def end(size: int) -> Any:
        error = sized_text(lambda x: snapshot_pb2.OperationError(code="E", message=x), size)
        return run.end(snapshot_pb2.OPERATION_RESULT_STATUS_FAILED, error)

    await over_then_at(stub, lane_id, end, "error", MAX_ERROR_BYTES)
    await probe.check()
    assert probe.snapshot.last_result.error.ByteSize() == MAX_ERROR_BYTES


async def test_every_other_payload_kind_is_limited(lane_stub) -> None:
    stub = lane_stub
    lane, probe = await probed_lane(stub)
    lane_id = lane.lane_id

    def write(size: int) -> Any:
        custom = sized_text(
            lambda x: entries_pb2.CustomEntry(custom_type="note", data_json=json.dumps(x)), size
        )
        return lane.enqueue(custom, snapshot_pb2.QUEUE_KIND_WRITE)

    await over_then_at(stub, lane_id, write, "custom")
    run = await lane.start_run("go")
    turn = replace(run.aim, turn_id=await run.start_turn())
    await probe.check()

    def stream(size: int) -> Any:
        partial = sized_text(
            lambda x: assistant(text(x), stop=messages_pb2.STOP_REASON_PENDING), size
        )
        return stub.AppendAssistantStream(
            turn.request(
                pb.AppendAssistantStreamRequest, partials=[pb.StreamedPartial(message=partial)]
            )
        )

    await over_then_at(stub, lane_id, stream, "partials[0].message")
    await probe.check()

    def suspend(size: int) -> Any:
        deferred = sized_text(lambda x: snapshot_pb2.DeferredState(handle_json=json.dumps(x)), size)
        return stub.SuspendRun(turn.request(pb.SuspendRunRequest, deferred=deferred))

    await over_then_at(stub, lane_id, suspend, "deferred")
    await stub.ResumeRun(run.aim.request(pb.ResumeRunRequest))
    await probe.check()

    def compact(size: int) -> Any:
        entry = sized_text(lambda x: entries_pb2.CompactionEntry(summary=x), size)
        return stub.CompactRun(run.aim.request(pb.CompactRunRequest, entry=entry))

    await run.settle(turn.turn_id, "done")
    await over_then_at(stub, lane_id, compact, "entry")
    await probe.check()


# -- commits ---------------------------------------------------------------------------------


async def test_results_adding_up_past_one_message_are_placed_and_delivered_in_parts(
    lane_stub,
) -> None:
    """Once refused COMMIT_TOO_LARGE: three results at the payload limit placed in one commit
    (each in message_start, message_end and entry_added) are more than one message; the
    group is committed and watchers get it in parts."""
    stub = lane_stub
    run, turn_id, lane_id = await open_turn(stub)
    await run.settle(turn_id, tool_calls=["a", "b", "c"])
    for name in ("a", "b", "c"):
        await run.call(name).start()
    probe = Probe(stub, lane_id)
    await probe.start()

    def stage(name: str, size: int) -> Any:
        return run.call(name).stage(sized_result_text(size))

    # b and c wait for a: staging a places all three in one group of more than 4 MiB.
    await stage("b", MAX_PAYLOAD_BYTES)
    await stage("c", MAX_PAYLOAD_BYTES)
    await probe.check(["a", "b", "c"])
    placed = (await stage("a", MAX_PAYLOAD_BYTES)).staged
    assert placed.batch_complete
    assert list(placed.placed_tool_call_ids) == ["a", "b", "c"]
    group = await probe.check(["a", "b", "c"])
    sizes = sum(event.ByteSize() for event in group)
    assert sizes > MAX_MESSAGE_BYTES


# -- GetLaneSnapshot and the transcript chunks ---------------------------------------------


async def test_a_snapshot_of_4_mib_is_answered_one_byte_more_goes_through_watch_only(
    lane_stub, store
) -> None:
    stub = lane_stub
    script = await LaneScript.create(stub, prefix="big-snapshot")
    lane_id = script.lane_id
    # A transcript of about 3.8 MiB, over many commits: 10 runs with a 400 KB prompt each.
    for index in range(10):
        run = await script.start_run(f"{index}" + "x" * 400_000)
        await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    # Handler errors change nothing but the revision: step it to 126, so a filler brings the
    # snapshot to revision 127 (a 1-byte varint) and one more commit to 128 (2 bytes).
    report = pb.ReportHandlerErrorRequest(lane_id=lane_id, error="e")
    revision = (await snapshot_of(stub, lane_id)).revision
    while revision < 126:
        revision = (await stub.ReportHandlerError(report)).revision
    assert revision == 126
    before = pb.GetLaneSnapshotResponse(snapshot=await snapshot_of(stub, lane_id))
    filler = pb.GetLaneSnapshotResponse()
    filler.CopyFrom(before)
    filler.snapshot.revision = 127

    def item(x: str) -> snapshot_pb2.QueuedItem:
        custom = entries_pb2.CustomEntry(custom_type="fill", data_json=json.dumps(x))
        return snapshot_pb2.QueuedItem(
            entry_id="0" * 36, kind=snapshot_pb2.QUEUE_KIND_WRITE, custom=custom
        )

    def filled(x: str) -> pb.GetLaneSnapshotResponse:
        response = pb.GetLaneSnapshotResponse()
        response.CopyFrom(filler)
        response.snapshot.queues.append(item(x))
        return response

    exact = sized_text(filled, MAX_MESSAGE_BYTES).snapshot.queues[0]
    await script.enqueue(exact.custom, snapshot_pb2.QUEUE_KIND_WRITE)
    at_limit = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert at_limit.ByteSize() == MAX_MESSAGE_BYTES
    assert at_limit.snapshot.revision == 127

    await stub.ReportHandlerError(report)  # revision 128: one byte more
    lane = LaneRef(DEFAULT_NAMESPACE, lane_id)
    whole = await store.snapshot(lane)
    assert pb.GetLaneSnapshotResponse(snapshot=whole).ByteSize() == MAX_MESSAGE_BYTES + 1
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(caught.value)
    assert info.reason == "SNAPSHOT_TOO_LARGE"
    assert dict(info.metadata) == {
        "laneId": lane_id,
        "bytes": str(MAX_MESSAGE_BYTES + 1),
        "limit": str(MAX_MESSAGE_BYTES),
    }
    assert "WatchLane" in (caught.value.details() or "")

    # WatchLane sends it: a head, then transcript chunks of about 1 MiB each.
    chunk_bytes = WatchSettings().chunk_bytes
    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
    try:
        head = await call.read()
        assert head.WhichOneof("item") == "snapshot"
        assert head.ByteSize() <= MAX_MESSAGE_BYTES
        assembled = snapshot_pb2.LaneSnapshot()
        assembled.CopyFrom(head.snapshot.snapshot)
        assert head.snapshot.following_chunks >= 3
        for _ in range(head.snapshot.following_chunks):
            chunk = await call.read()
            assert chunk.WhichOneof("item") == "transcript_chunk"
            entries = chunk.transcript_chunk.entries
            assert sum(e.ByteSize() for e in entries) <= chunk_bytes or len(entries) == 1
            assert chunk.ByteSize() <= MAX_MESSAGE_BYTES
            assembled.transcript.extend(entries)
    finally:
        call.cancel()
    assert assembled == whole


# -- watchers --------------------------------------------------------------------------------


async def _first_message(call: Any) -> pb.WatchLaneResponse:
    response: pb.WatchLaneResponse = await asyncio.wait_for(call.read(), 20)
    return response


async def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 (the hub has no event for it)
            await asyncio.sleep(0.02)


async def test_watchers_are_limited_per_lane_and_per_process(session_database_url) -> None:
    watch = WatchSettings(max_watchers_per_lane=2, max_watchers_per_process=3)
    async with extra_server(session_database_url, watch=watch) as (running, stub):
        lane_x, lane_y, lane_z = [await new_lane(stub, "watched") for _ in range(3)]
        calls: list[Any] = []

        async def watch_ok(lane_id: str) -> Any:
            call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
            calls.append(call)
            assert (await _first_message(call)).WhichOneof("item") == "snapshot"
            return call

        async def watch_refused(lane_id: str, scope: str, limit: int) -> None:
            call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
            calls.append(call)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _first_message(call)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(caught.value)
            assert info.reason == "TOO_MANY_WATCHERS", caught.value.details()
            assert dict(info.metadata) == {
                "laneId": lane_id,
                "scope": scope,
                "watchers": str(limit),
                "limit": str(limit),
            }

        try:
            first = await watch_ok(lane_x)
            await watch_ok(lane_x)  # at the lane's limit
            await watch_refused(lane_x, "lane", 2)
            # A resuming watcher counts the same.
            resume = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_x, after_revision=1))
            calls.append(resume)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _first_message(resume)
            assert error_info(caught.value).reason == "TOO_MANY_WATCHERS"
            await watch_ok(lane_y)  # at the process's limit
            await watch_refused(lane_z, "process", 3)
            assert running.hub.watcher_count() == 3

            # A watcher leaves: its place is free again, on its lane and in the process.
            first.cancel()
            x = LaneRef(DEFAULT_NAMESPACE, lane_x)
            await _until(lambda: running.hub.watcher_count(x) == 1)
            await watch_ok(lane_x)
            await watch_refused(lane_z, "process", 3)
        finally:
            for call in calls:
                call.cancel()


async def test_the_watcher_limits_come_from_the_environment(session_database_url) -> None:
    defaults = Settings.from_env({})
    assert (
        (defaults.max_watchers_per_lane, defaults.max_watchers)
        == (
            WatchSettings().max_watchers_per_lane,
            WatchSettings().max_watchers_per_process,
        )
        == (1000, 10_000)
    )
    env = {"LANE_MAX_WATCHERS_PER_LANE": "1", "LANE_MAX_WATCHERS": "7"}
    settings = Settings.from_env(env)
    assert (settings.max_watchers_per_lane, settings.max_watchers) == (1, 7)
    for variable in env:
        for bad in ("0", "-1", "2.5", "many"):
            with pytest.raises(ConfigError, match=f"^{variable}="):
                Settings.from_env({variable: bad})

    running = await start_server(
        dataclasses.replace(settings, database_url=session_database_url), listen="127.0.0.1:0"
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        lane_id = await new_lane(stub, "watched")
        first = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        second = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        try:
            assert (await _first_message(first)).WhichOneof("item") == "snapshot"
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _first_message(second)
            info = error_info(caught.value)
            assert (info.reason, info.metadata["limit"]) == ("TOO_MANY_WATCHERS", "1")
        finally:
            first.cancel()
            second.cancel()
    finally:
        await channel.close()
        await running.stop(grace=0.5)
