"""Property: random concurrent command schedules across lanes and processes, with watchers that
connect, drop and resume at random — every watcher's fold equals a capture at each revision it
reaches, and no revision is missed or repeated.

The service runs on its own event loop in a background thread, so hypothesis can drive each
example synchronously (with shrinking) through fresh channels.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lane.client.reducer import fold
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from lane.server.app.config import Settings
from lane.server.app.server import RunningServer, start_server
from lane.server.testing import scratch_database
from tests.integration.lanes import assistant, result, text, tool_call, user

T = TypeVar("T")

ALLOWED_REFUSALS = {
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
}


@dataclass
class BackgroundServers:
    """Two service processes' worth of servers on one database, on a private loop."""

    loop: asyncio.AbstractEventLoop
    servers: list[RunningServer]

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.servers]


@pytest.fixture(scope="module")
def background(database_url: str) -> Iterator[BackgroundServers]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    database = scratch_database(database_url, prefix="lane_prop")
    dsn = run(database.__aenter__())

    # One process with NOTIFY, one polling only: watchers on either see commits of both.
    servers = [
        run(
            start_server(
                Settings(database_url=dsn, poll_interval_seconds=0.2), listen="127.0.0.1:0"
            )
        ),
        run(
            start_server(
                Settings(database_url=dsn, notify=False, poll_interval_seconds=0.2),
                listen="127.0.0.1:0",
            )
        ),
    ]
    try:
        yield BackgroundServers(loop, servers)
    finally:
        for server in servers:
            run(server.stop(0.5))
        run(database.__aexit__(None, None, None))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


# -- the schedule ----------------------------------------------------------------------------

ACTIONS = (
    "enqueue",
    "start_run",
    "start_turn",
    "settle",
    "start_tool",
    "update_tool",
    "stage_tool",
    "stage_synthetic",
    "abort",
    "end_run",
    "usage",
)
WATCHER_MOVES = ("drop_and_resume", "drop_and_resnapshot")

command_step = st.tuples(
    st.just("cmd"),
    st.integers(0, 1),  # lane
    st.integers(0, 1),  # which server (process)
    # Mostly the natural next step of a run, sometimes anything (refusals are part of it).
    st.sampled_from(("advance",) * 40 + ACTIONS),
    st.integers(0, 3),  # a parameter: which call, how many calls, ...
    st.sampled_from((False, False, False, True)),  # run concurrently with the next step
)
watch_step = st.tuples(st.just("watch"), st.integers(0, 2), st.sampled_from(WATCHER_MOVES))
# Commands outnumber watcher moves about five to one.
step_strategy = st.one_of(*[command_step] * 5, watch_step)


@dataclass
class LaneModel:
    """What a driver believes about one lane, enough to choose plausible next commands."""

    lane_id: str
    run_id: str = ""
    turn_id: str = ""
    phase: str = "none"  # none | idle | turn | tools
    calls: dict[str, str] = field(default_factory=dict)  # id -> planned | running | staged
    cancelled: bool = False

    def next_action(self, param: int) -> str:
        """The natural next command of a run."""
        if self.phase == "none":
            return "start_run"
        if self.phase == "idle":
            return "end_run" if self.cancelled or param == 3 else "start_turn"
        if self.phase == "turn":
            return "settle"
        open_calls = [c for c, status in self.calls.items() if status != "staged"]
        status = self.calls[open_calls[param % len(open_calls)]] if open_calls else "staged"
        if status == "planned":
            return "stage_synthetic" if self.cancelled or param == 3 else "start_tool"
        return "update_tool" if param < 2 else "stage_tool"

    def pick_call(self, param: int) -> str:
        open_calls = [c for c, status in self.calls.items() if status != "staged"]
        pool = open_calls or list(self.calls)
        return pool[param % len(pool)] if pool else f"none-{param}"


async def perform(stub, model: LaneModel, action: str, param: int) -> None:
    """Issue one command; refusals are fine, as long as they are documented ones."""
    if action == "advance":
        action = model.next_action(param)
    lane = model.lane_id
    run_id = model.run_id or "x"
    call_id = model.pick_call(param)
    try:
        if action == "enqueue":
            kind = (
                snapshot_pb2.QUEUE_KIND_STEER,
                snapshot_pb2.QUEUE_KIND_FOLLOW_UP,
                snapshot_pb2.QUEUE_KIND_NEXT_RUN,
                snapshot_pb2.QUEUE_KIND_NEXT_RUN,
            )[param]
            await stub.EnqueueMessage(
                pb.EnqueueMessageRequest(lane_id=lane, kind=kind, message=user(f"q{param}"))
            )
        elif action == "start_run":
            answer = await stub.StartRun(pb.StartRunRequest(lane_id=lane, prompt=[user("go")]))
            model.run_id, model.phase, model.calls, model.cancelled = (
                answer.operation_id,
                "idle",
                {},
                False,
            )
        elif action == "start_turn":
            answer = await stub.StartTurn(pb.StartTurnRequest(lane_id=lane, operation_id=run_id))
            model.turn_id, model.phase = answer.turn_id, "turn"
        elif action == "settle":
            calls = [f"c{uuid.uuid4().hex[:6]}" for _ in range(param)]
            blocks = [tool_call(c, "t", json.dumps({"n": 2**60 + i})) for i, c in enumerate(calls)]
            await stub.SettleAssistantMessage(
                pb.SettleAssistantMessageRequest(
                    lane_id=lane,
                    operation_id=run_id,
                    turn_id=model.turn_id or "x",
                    message=assistant(text("t"), *blocks),
                )
            )
            model.calls = dict.fromkeys(calls, "planned")
            model.phase = "tools" if calls else "idle"
        elif action == "start_tool":
            await stub.StartToolCall(
                pb.StartToolCallRequest(
                    lane_id=lane,
                    operation_id=run_id,
                    tool_call_id=call_id,
                    arguments_json='{"e": 1}',
                )
            )
            model.calls[call_id] = "running"
        elif action == "update_tool":
            await stub.UpdateToolCall(
                pb.UpdateToolCallRequest(
                    lane_id=lane,
                    operation_id=run_id,
                    tool_call_id=call_id,
                    partial_result=result(f"p{param}"),
                    checkpoint=param % 2 == 0,
                )
            )
        elif action in ("stage_tool", "stage_synthetic"):
            request = pb.StageToolOutcomeRequest(
                lane_id=lane, operation_id=run_id, tool_call_id=call_id
            )
            if action == "stage_tool":
                request.executed.result.CopyFrom(result("r"))
                request.executed.is_error = param == 1
            else:
                request.synthetic.cause = (
                    pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL,
                    pb.SYNTHETIC_CAUSE_CANCELLED,
                    pb.SYNTHETIC_CAUSE_TRUNCATED,
                    pb.SYNTHETIC_CAUSE_INTERRUPTED,
                )[param]
            answer = await stub.StageToolOutcome(request)
            model.calls[call_id] = "staged"
            if answer.batch_complete:
                model.phase, model.calls = "idle", {}
        elif action == "abort":
            await stub.AbortOperation(pb.AbortOperationRequest(lane_id=lane, operation_id=run_id))
            model.cancelled = True
        elif action == "end_run":
            status = (
                snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
                snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            )[param % 2]
            await stub.EndRun(pb.EndRunRequest(lane_id=lane, operation_id=run_id, status=status))
            model.phase, model.run_id, model.calls = "none", "", {}
        elif action == "usage":
            await stub.RecordUsage(
                pb.RecordUsageRequest(
                    lane_id=lane, usage=messages_pb2.Usage(input=param, total_tokens=param)
                )
            )
    except grpc.aio.AioRpcError as error:
        assert error.code() in ALLOWED_REFUSALS, f"{action}: {error.code()} {error.details()}"


def snapshot_diff(folded: snapshot_pb2.LaneSnapshot, captured: snapshot_pb2.LaneSnapshot) -> str:
    """A unified diff of two snapshots' text forms (folded vs captured)."""
    return "\n".join(
        difflib.unified_diff(
            text_format.MessageToString(folded).splitlines(),
            text_format.MessageToString(captured).splitlines(),
            "folded",
            "captured",
            lineterm="",
        )
    )


class PropertyWatcher:
    """A watcher that checks contiguity and compares its fold with recorded captures."""

    def __init__(self, lane_id: str, captures: dict[int, snapshot_pb2.LaneSnapshot]) -> None:
        self.lane_id = lane_id
        self.captures = captures
        self.snapshot = snapshot_pb2.LaneSnapshot()
        self.revision = 0
        self.compared = 0
        self.task: asyncio.Task[None] | None = None

    def start(self, channel: grpc.aio.Channel, resume: bool) -> None:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        request = pb.WatchLaneRequest(lane_id=self.lane_id)
        if resume and self.revision:
            request.after_revision = self.revision
        self.task = asyncio.create_task(self._read(stub.WatchLane(request)))

    async def _read(self, call: Any) -> None:
        try:
            async for response in call:
                kind = response.WhichOneof("item")
                if kind == "snapshot":
                    self.snapshot = response.snapshot.snapshot
                    self.revision = self.snapshot.revision
                elif kind == "event_group":
                    events = list(response.event_group.events)
                    assert [e.revision for e in events] == list(
                        range(self.revision + 1, self.revision + 1 + len(events))
                    ), "a revision was missed or repeated"
                    self.snapshot = fold(self.snapshot, events).snapshot
                    self.revision = events[-1].revision
                    self.check()
        finally:
            call.cancel()

    def check(self) -> None:
        expected = self.captures.get(self.revision)
        if expected is not None:
            assert self.snapshot == expected, (
                f"fold != capture at revision {self.revision}:\n"
                + snapshot_diff(self.snapshot, expected)
            )
            self.compared += 1

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            results = await asyncio.gather(self.task, return_exceptions=True)
            for outcome in results:
                if isinstance(outcome, AssertionError):
                    raise outcome


async def run_schedule(targets: list[str], steps: list[tuple]) -> None:  # type: ignore[type-arg]
    channels = [grpc.aio.insecure_channel(t) for t in targets]
    stubs = [lane_service_pb2_grpc.LaneServiceStub(c) for c in channels]
    models = [LaneModel(f"prop-{uuid.uuid4().hex[:10]}") for _ in range(2)]
    captures: list[dict[int, snapshot_pb2.LaneSnapshot]] = [{}, {}]
    try:
        for model in models:
            await stubs[0].CreateLane(pb.CreateLaneRequest(lane_id=model.lane_id))
        # Three watchers: two on lane 0 (one per process), one on lane 1.
        watchers = [
            PropertyWatcher(models[0].lane_id, captures[0]),
            PropertyWatcher(models[0].lane_id, captures[0]),
            PropertyWatcher(models[1].lane_id, captures[1]),
        ]
        for index, watcher in enumerate(watchers):
            watcher.start(channels[index % 2], resume=False)

        async def capture(lane: int) -> None:
            response = await stubs[lane % 2].GetLaneSnapshot(
                pb.GetLaneSnapshotRequest(lane_id=models[lane].lane_id)
            )
            captures[lane][response.snapshot.revision] = response.snapshot
            for watcher in watchers:
                if watcher.lane_id == models[lane].lane_id:
                    watcher.check()

        pending: list = []  # type: ignore[type-arg]
        for step in steps:
            if step[0] == "cmd":
                _, lane, process, action, param, concurrent = step
                pending.append(perform(stubs[process], models[lane], action, param))
                if concurrent:
                    continue
                await asyncio.gather(*pending)
                pending = []
                await asyncio.gather(capture(0), capture(1))
            else:
                _, index, move = step
                watcher = watchers[index]
                await watcher.stop()
                watcher.start(channels[(index + 1) % 2], resume=move == "drop_and_resume")
        await asyncio.gather(*pending)
        await asyncio.gather(capture(0), capture(1))
        # Quiescent: every watcher converges on the final capture.
        for index, watcher in enumerate(watchers):
            lane = 0 if index < 2 else 1
            final = max(captures[lane])
            async with asyncio.timeout(20):
                while watcher.revision < final:
                    await asyncio.sleep(0.02)
                    if watcher.task is not None and watcher.task.done():
                        await watcher.task  # surfaces a failed assertion
            assert watcher.snapshot == captures[lane][final]
        for watcher in watchers:
            await watcher.stop()
    finally:
        for channel in channels:
            await channel.close()


@settings(
    max_examples=int(__import__("os").environ.get("LANE_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(step_strategy, min_size=10, max_size=60))
def test_watchers_fold_to_every_capture(background: BackgroundServers, steps: list[Any]) -> None:
    asyncio.run(run_schedule(background.targets, steps))
