"""The TypeScript ``LaneSession`` (clients/typescript/src/session.ts) against the real service,
in a Node process of its own (clients/typescript/test/session-process.ts, fed JSON lines):

- the shared table of test_drive_lane (every unary command kind, accepted and refused) gets the
  same answers, refusals (code, ErrorInfo reason, message, metadata) and events through the
  TypeScript session as through Python's unary calls, and through TypeScript's unary calls;
- pipelining: a lane whose commands wait on its row lock does not hold up another lane's, and
  each lane's commands are applied in the order sent, however many are in flight (also through
  a ``LaneClient`` of ``connectLane(target, { session: true })``: one stream);
- the in-flight bound: with a lane held, 64 commands are written and the rest wait in the
  session, unwritten (a free lane's command behind them does not run), then all are answered
  in order;
- a stream cut mid-flight (a proxy drops the connection) loses and doubles nothing: the
  session resends with request ids, and RenewLease, which has none, fails UNAVAILABLE;
- a service restart: the session reconnects and its command is answered once;
- an answer over the message limit comes in parts (MessagePart) the session joins, and a
  request too large for one message goes unary; the stream goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from lane.client.errors import LaneError, lane_error
from lane.client.testing import LaneScript
from lane.limits import MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from tests.integration.lanes import events_between, new_lane_id, user
from tests.integration.test_drive_batches import frames
from tests.integration.test_drive_lane import (
    METHOD_OF,
    SERVICE,
    CuttableProxy,
    check_held_commands_committed_once,
    created,
    leased,
    raw_drive,
    revision,
    row_locked,
    run_table,
    usage,
    waiting_on_locks,
)
from tests.integration.typescript_driver import TYPESCRIPT_DIR
from tests.support.servers import restartable

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROCESS = "test/session-process.ts"
#: The service's bound (service/lane/server/api/drive.py), which the session's default window
#: equals.
BOUND = 64


class SessionBrokenInNode(LaneError):
    """The TypeScript session's SessionBroken."""


class NodeSession:
    """A TypeScript LaneSession in a Node process: commands in as JSON lines, answers out."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, target: str, log: Path, **config: Any) -> NodeSession:
        node = shutil.which("node")
        if node is None:
            pytest.fail("node is not on PATH: the TypeScript client needs Node 20 or newer")
        if not (TYPESCRIPT_DIR / "node_modules" / "tsx").is_dir():
            pytest.fail("clients/typescript/node_modules is missing: run scripts/test.sh first")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:
            process = await asyncio.create_subprocess_exec(
                node,
                "--import",
                "tsx",
                PROCESS,
                json.dumps({"target": target, **config}),
                cwd=TYPESCRIPT_DIR,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=sink,
                limit=64 * 1024 * 1024,
            )
        return cls(process, log)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            future = self._waiting.pop(message["id"], None)
            if future is not None and not future.done():
                future.set_result(message)
        problem = AssertionError(f"the Node session exited; its log:\n{self.tail()}")
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(problem)

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-40:])

    def _send(self, op: str, **fields: Any) -> asyncio.Future[dict[str, Any]]:
        """Write one line now (lines go out in the order sent); its answer's future."""
        assert self.process.stdin is not None
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        self.process.stdin.write(json.dumps({"id": ident, "op": op, **fields}).encode() + b"\n")
        return future

    def submit(self, request: Message, via: str = "session") -> asyncio.Future[Any]:
        """Send ``request`` now; a future of its response, or of its LaneError."""
        method = METHOD_OF[request.DESCRIPTOR.full_name]
        answer = self._send(
            "call",
            method=method[0].lower() + method[1:],
            request=base64.b64encode(request.SerializeToString()).decode(),
            via=via,
        )
        return asyncio.ensure_future(_decode(method, answer))

    async def call(self, request: Message, via: str = "session") -> Any:
        return await asyncio.wait_for(self.submit(request, via), 60)

    async def burst(self, requests: list[Message]) -> tuple[list[Any], dict[str, Any]]:
        """Send every request through the session at once (one synchronous loop in Node):
        their responses or LaneErrors, in order, and the session's counts of what it wrote."""
        calls = []
        for request in requests:
            method = METHOD_OF[request.DESCRIPTOR.full_name]
            calls.append(
                {
                    "method": method[0].lower() + method[1:],
                    "request": base64.b64encode(request.SerializeToString()).decode(),
                }
            )
        message = await asyncio.wait_for(self._send("burst", calls=calls), 60)
        outcomes: list[Any] = []
        for request, answer in zip(requests, message["answers"], strict=True):
            method = METHOD_OF[request.DESCRIPTOR.full_name]
            done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            done.set_result(answer)
            try:
                outcomes.append(await _decode(method, done))
            except LaneError as error:
                outcomes.append(error)
        return outcomes, message

    async def stats(self) -> dict[str, Any]:
        return await asyncio.wait_for(self._send("stats"), 30)

    async def close(self) -> dict[str, Any]:
        answer = await asyncio.wait_for(self._send("close"), 30)
        await asyncio.wait_for(self.process.wait(), 30)
        return answer

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        self._reader.cancel()


async def _decode(method: str, answer: asyncio.Future[dict[str, Any]]) -> Any:
    message = await answer
    if "error" in message:
        error = message["error"]
        kind = SessionBrokenInNode if error.get("sessionBroken") else LaneError
        raise kind(
            grpc.StatusCode[error["code"]], error["reason"], error["message"], error["metadata"]
        )
    response_type = getattr(pb, SERVICE.methods_by_name[method].output_type.name)
    return response_type.FromString(base64.b64decode(message["response"]))


@contextlib.asynccontextmanager
async def node_session(target: str, tmp_path: Path, **config: Any) -> AsyncIterator[NodeSession]:
    session = await NodeSession.start(target, tmp_path / "node-session.log", **config)
    try:
        yield session
    finally:
        session.kill()


def target_of(server: RunningServer) -> str:
    return f"127.0.0.1:{server.port}"


# -- the shared table -----------------------------------------------------------------------------


async def test_the_table_answers_alike_through_a_typescript_session(
    lane_stub: Any, lane_server: RunningServer, tmp_path: Path
) -> None:
    async def unary(request: Message) -> Any:
        rpc = getattr(lane_stub, METHOD_OF[request.DESCRIPTOR.full_name])
        try:
            return await rpc(request, timeout=30)
        except grpc.aio.AioRpcError as err:
            raise lane_error(err) from err

    by_python, python_events = await run_table(lane_stub, new_lane_id("ts-table-py"), unary)
    async with node_session(target_of(lane_server), tmp_path) as node:
        by_session, session_events = await run_table(
            lane_stub, new_lane_id("ts-table-s"), node.call
        )
        by_ts_unary, ts_unary_events = await run_table(
            lane_stub,
            new_lane_id("ts-table-u"),
            lambda request: node.call(request, via="unary"),
        )
        assert (await node.close())["streamsOpened"] == 1
    for (label, expected), (_, session), (_, ts_unary) in zip(
        by_python, by_session, by_ts_unary, strict=True
    ):
        assert session == expected, label
        assert ts_unary == expected, label
    assert session_events == python_events == ts_unary_events
    refused = [label for label, outcome in by_session if outcome[0] == "refused"]
    assert len(refused) >= 15 and len(by_session) - len(refused) >= 35


# -- pipelining and order -------------------------------------------------------------------------


async def test_a_held_lane_does_not_hold_up_another_and_each_keeps_its_order(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    held, free = new_lane_id("ts-held"), new_lane_id("ts-free")
    await created(lane_stub, held, free)
    async with node_session(target_of(lane_server), tmp_path) as node:
        async with row_locked(session_database_url, held):
            # Three of the held lane first, then three of the free one, none awaited.
            held_calls = [node.submit(usage(held, n)) for n in (1, 2, 3)]
            free_calls = [node.submit(usage(free, n)) for n in (1, 2, 3)]
            # The free lane is answered while the held lane's first command waits in
            # PostgreSQL: both were in flight on the one stream at once.
            free_answers = await asyncio.wait_for(asyncio.gather(*free_calls), 20)
            await waiting_on_locks(session_database_url, 1)
            assert not any(call.done() for call in held_calls)
        held_answers = await asyncio.wait_for(asyncio.gather(*held_calls), 20)

        # Many lanes, many commands each, all submitted before any is answered: through a
        # LaneClient made with a session of its own (connectLane(target, { session: true })).
        lanes = [new_lane_id(f"ts-pipe{i}") for i in range(8)]
        await asyncio.gather(
            *(node.call(pb.CreateLaneRequest(lane_id=lane), via="client") for lane in lanes)
        )
        calls = [node.submit(usage(lane, n), via="client") for n in range(1, 21) for lane in lanes]
        answers = await asyncio.wait_for(asyncio.gather(*calls), 60)
        assert (await node.stats())["clientStreamsOpened"] == 1
        assert (await node.close())["streamsOpened"] == 1
    assert [a.revision for a in free_answers] == [2, 3, 4]
    assert [a.revision for a in held_answers] == [2, 3, 4]
    events = await events_between(lane_stub, held, 1, 4)
    assert [e.usage.row.usage.input for e in events] == [1, 2, 3]
    for index, lane in enumerate(lanes):
        revisions = [a.revision for a in answers[index :: len(lanes)]]
        assert revisions == list(range(2, 22)), lane  # one lane's commands in the order sent


# -- batches --------------------------------------------------------------------------------------


async def test_the_typescript_session_sends_commands_of_one_turn_together(
    lane_stub: Any, lane_server: RunningServer, tmp_path: Path
) -> None:
    lanes = [new_lane_id(f"ts-turn{n}") for n in range(4)]
    await created(lane_stub, *lanes)
    refused = pb.StartTurnRequest(lane_id=lanes[0], operation_id="no-such-run")
    requests: list[Message] = [usage(lane, n) for n in range(1, 6) for lane in lanes]
    requests.insert(2, refused)  # among the commands, one the service refuses
    async with node_session(target_of(lane_server), tmp_path) as node:
        await node.call(pb.GetLaneSnapshotRequest(lane_id=lanes[0]))  # the stream is up
        before = frames(lane_server)
        outcomes, sent = await node.burst(requests)
        after = frames(lane_server)
        assert (await node.close())["streamsOpened"] == 1
    read = sum(after[("read", k)] - before[("read", k)] for k in ("single", "batch"))
    assert after[("read", "batch")] > before[("read", "batch")]
    assert read < len(requests), read  # fewer messages than commands reached the service
    assert (sent["messagesSent"], sent["commandsSent"]) == (read, len(requests))
    error = outcomes.pop(2)
    assert isinstance(error, LaneError) and error.reason == "OPERATION_NOT_OPEN"
    for index, lane in enumerate(lanes):
        assert [a.revision for a in outcomes[index :: len(lanes)]] == [2, 3, 4, 5, 6], lane


# -- the in-flight bound --------------------------------------------------------------------------


async def test_past_the_bound_commands_wait_in_the_session_unwritten(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    held, free = new_lane_id("ts-bound-held"), new_lane_id("ts-bound-free")
    await created(lane_stub, held, free)
    sent = BOUND + 36
    async with node_session(target_of(lane_server), tmp_path) as node:
        async with row_locked(session_database_url, held):
            held_calls = [node.submit(usage(held, n)) for n in range(1, sent + 1)]
            await waiting_on_locks(session_database_url, 1)
            stats = await node.stats()  # read after every line above: all are submitted
            assert (stats["inFlight"], stats["queued"]) == (BOUND, sent - BOUND)
            # A free lane's command waits behind them for a slot: not written, so not run.
            free_call = node.submit(usage(free, 1))
            stats = await node.stats()
            assert (stats["inFlight"], stats["queued"]) == (BOUND, sent - BOUND + 1)
            assert await revision(lane_stub, free) == 1
            assert not free_call.done()
        # The lock is gone: answers free slots, the queue drains, everything is answered.
        held_answers = await asyncio.wait_for(asyncio.gather(*held_calls), 60)
        assert (await asyncio.wait_for(free_call, 20)).revision == 2
        stats = await node.stats()
        assert (stats["inFlight"], stats["queued"], stats["streamsOpened"]) == (0, 0, 1)
    assert [a.revision for a in held_answers] == list(range(2, sent + 2))


# -- a broken stream ------------------------------------------------------------------------------


async def test_a_stream_cut_mid_flight_loses_and_doubles_nothing(
    lane_stub: Any, lane_server: RunningServer, session_database_url: str, tmp_path: Path
) -> None:
    proxy = CuttableProxy(lane_server.port)
    await proxy.start()
    held, other = new_lane_id("ts-cut-held"), new_lane_id("ts-cut-other")
    await created(lane_stub, held, other)
    run = await leased(lane_stub, held)
    try:
        async with node_session(f"127.0.0.1:{proxy.listen_port}", tmp_path) as node:
            await node.call(pb.GetLaneSnapshotRequest(lane_id=other))  # the stream is up
            async with row_locked(session_database_url, held):
                # The held lane's commands wait in PostgreSQL (the first holds its
                # connection); the other lane's are answered.
                held_calls = [node.submit(usage(held, n)) for n in (1, 2, 3)]
                renew = node.submit(run.aim.request(pb.RenewLeaseRequest))
                for n in (1, 2):
                    await node.call(usage(other, n))
                await waiting_on_locks(session_database_url, 1)
                proxy.cut()  # the stream breaks; the first held command is in its transaction
                # RenewLease has no request id: it is not sent again blindly.
                with pytest.raises(SessionBrokenInNode) as broken:
                    await asyncio.wait_for(renew, 20)
                assert broken.value.code == grpc.StatusCode.UNAVAILABLE
                # A command sent while the session reconnects goes out on the new stream.
                assert (await node.call(usage(other, 3))).revision == 4
            # The lock is gone: the first transaction commits (its stream is gone), and the
            # resent commands get their answers: the stored one for the command that committed.
            answers = await asyncio.wait_for(asyncio.gather(*held_calls), 30)
            assert (await node.close())["streamsOpened"] == 2
    finally:
        await proxy.stop()
    await check_held_commands_committed_once(lane_stub, run, other, list(answers))


async def test_a_session_rides_out_a_service_restart(
    fresh_database_url: str, tmp_path: Path
) -> None:
    lane = new_lane_id("ts-restart")
    async with restartable(fresh_database_url) as service:
        async with node_session(f"127.0.0.1:{service.port}", tmp_path) as node:
            await node.call(pb.CreateLaneRequest(lane_id=lane))
            await node.call(usage(lane, 1))
            # Ends the stream UNAVAILABLE SERVER_SHUTTING_DOWN.
            await service.stop(grace=5.0)
            pending = node.submit(usage(lane, 2))
            await service.restart()
            assert (await asyncio.wait_for(pending, 30)).revision == 3
            assert (await node.close())["streamsOpened"] >= 2
        assert await revision(service.stub, lane) == 3


# -- sizes ----------------------------------------------------------------------------------------


async def answer_bytes(stub: Any, lane: str) -> int:
    answer = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))
    size: int = answer.ByteSize()
    return size


async def grown_to_the_limit(stub: Any, lane: str) -> pb.GetLaneSnapshotResponse:
    """Grow ``lane`` until its GetLaneSnapshot answer is 3 bytes short of the message limit: a
    unary answer, but no DriveLane one (the sequence and the field's header add 7)."""
    script = await LaneScript.create(stub, lane)
    # Runs whose prompts fill the transcript to some 40 KB short (a run's start commit carries
    # its prompt more than once: at most two messages of 500 KB each).
    while (room := MAX_MESSAGE_BYTES - 40_000 - await answer_bytes(stub, lane)) > 0:
        pieces = [min(500_000, room - n * 500_000) for n in range(2) if room > n * 500_000]
        run = await script.start_run(*["x" * size for size in pieces])
        await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    # The rest with the configuration's tool names, replaced until the size is exact (each
    # name costs its length and 2 bytes; the configuration's own header may grow meanwhile).
    target = MAX_MESSAGE_BYTES - 3
    names: list[str] = []
    for _ in range(8):
        answer = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))
        gap = target - answer.ByteSize()
        if gap == 0:
            return answer  # type: ignore[no-any-return]
        wanted = sum(len(name) + 2 for name in names) + gap
        assert wanted > 0, gap
        full, rest = divmod(wanted, 102)
        names = [f"t{i:05d}".ljust(100, "x") for i in range(full)]
        if rest:  # a name of rest - 2 bytes, or one full name longer when rest is too small
            if rest < 3 and names:
                names[-1] += "y" * rest
            else:
                names.append(f"r{'z' * (rest - 3)}")
        await stub.UpdateLaneConfig(
            pb.UpdateLaneConfigRequest(lane_id=lane, active_tool_names=pb.ToolNames(names=names))
        )
    raise AssertionError("the snapshot's size did not settle")


async def test_an_answer_over_the_message_limit_comes_in_parts(
    lane_stub: Any, lane_channel: Any, lane_server: RunningServer, tmp_path: Path
) -> None:
    lane = new_lane_id("ts-too-large")
    expected = await grown_to_the_limit(lane_stub, lane)
    # On the stream its answer is over the limit (the sequence and the field's header add 7):
    # it comes in two parts, each within the limit, that join into the answer ...
    call = raw_drive(lane_channel)
    frames: list[pb.DriveLaneResponse] = []
    try:
        request = pb.DriveLaneRequest(
            sequence=1, get_lane_snapshot=pb.GetLaneSnapshotRequest(lane_id=lane)
        )
        await call.write(request.SerializeToString())
        while not frames or frames[-1].part.continues:
            frames.append(await asyncio.wait_for(call.read(), 20))
    finally:
        call.cancel()
    assert len(frames) == 2
    assert all(frame.ByteSize() <= MAX_MESSAGE_BYTES for frame in frames)
    assert all(frame.WhichOneof("answer") is None and frame.sequence == 0 for frame in frames)
    joined = pb.DriveLaneResponse.FromString(b"".join(frame.part.data for frame in frames))
    assert joined.sequence == 1
    assert joined.get_lane_snapshot == expected
    async with node_session(target_of(lane_server), tmp_path) as node:
        # ... and the session joins them: the whole answer, on its one stream.
        assert await node.call(pb.GetLaneSnapshotRequest(lane_id=lane)) == expected
        # A request too large for a stream message goes unary too: gRPC's own refusal.
        huge = pb.EnqueueMessageRequest(
            lane_id=lane,
            kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP,
            message=user("x" * MAX_MESSAGE_BYTES),
        )
        with pytest.raises(LaneError) as too_big:
            await node.call(huge)
        assert too_big.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The stream went on: a command after them is answered on it.
        assert (await node.call(usage(lane, 1))).revision == expected.snapshot.revision + 1
        assert (await node.close())["streamsOpened"] == 1


async def test_a_session_refused_for_too_many_sessions_goes_unary(
    session_database_url: str, tmp_path: Path
) -> None:
    # A server that serves one DriveLane stream at a time, taken: the TypeScript session's
    # stream is refused TOO_MANY_SESSIONS (nothing on it ran), and its commands go unary.
    settings = Settings(database_url=session_database_url, max_sessions=1)
    running = await start_server(settings, listen="127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(target_of(running)) as channel:
            stub: Any = lane_service_pb2_grpc.LaneServiceStub(channel)
            held = stub.DriveLane()
            await held.write(pb.DriveLaneRequest(sequence=1, list_lanes=pb.ListLanesRequest()))
            assert (await held.read()).HasField("list_lanes")  # the one slot is taken
            lane_id = new_lane_id("ts-unary")
            async with node_session(target_of(running), tmp_path) as node:
                answer = await node.call(pb.CreateLaneRequest(lane_id=lane_id))
                assert answer.created
                configured = await node.call(
                    pb.UpdateLaneConfigRequest(
                        lane_id=lane_id, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
                    )
                )
                assert configured.revision == 2
                assert (await node.close())["streamsOpened"] == 1  # refused once, then unary
            held.cancel()
    finally:
        await running.stop(grace=0.5)
