"""The fuzzer's world: lanes built in every state, and the ids learnt about them.

:func:`populate` builds lanes in every state a command can meet (LANE_STATES) and records their
ids: operations, turns, tool calls, entries, lease tokens, drivers. The fuzzer adds the ids every
accepted request names, so later requests reach the states earlier ones created.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

T = TypeVar("T")
Stub = Any  # lane_service_pb2_grpc.LaneServiceAsyncStub (exists only in the type stubs)


@dataclass(eq=False)
class LaneRef:
    """A lane and every id the fuzzer learnt about it."""

    lane_id: str
    state: str
    operation_ids: list[str] = field(default_factory=list)
    turn_ids: list[str] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=lambda: ["c0", "c1", "c2"])
    entry_ids: list[str] = field(default_factory=list)
    lease_tokens: list[int] = field(default_factory=list)
    driver_ids: list[str] = field(default_factory=list)
    revision: int = 0
    #: The open operation as of the last capture ('' when none).
    open_operation: str = ""

    def learn(self, pool: list[T], value: T) -> None:
        if value not in pool and value not in ("", 0):
            pool.append(value)
            del pool[:-40]  # keep pools small: recent ids are the interesting ones


@dataclass(repr=False)
class World:
    """Every lane the fuzzer knows, and fresh ids for new ones."""

    lanes: list[LaneRef] = field(default_factory=list)
    by_id: dict[str, LaneRef] = field(default_factory=dict)
    #: Lanes built in a chosen state, oldest first; and lanes with an open operation.
    built: list[LaneRef] = field(default_factory=list)
    active: list[LaneRef] = field(default_factory=list)
    _active_ids: set[str] = field(default_factory=set)
    request_ids: list[str] = field(default_factory=list)
    page_tokens: list[str] = field(default_factory=lambda: [""])
    #: Recent export files (ExportLane answers), and the lanes imports created.
    exports: list[bytes] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"fz{uuid.uuid4().hex[:6]}")
    counter: int = 0

    def __repr__(self) -> str:  # hypothesis shows it in notes: keep it short
        return f"World({self.prefix}, {len(self.lanes)} lanes)"

    def fresh(self, kind: str) -> str:
        self.counter += 1
        return f"{self.prefix}-{kind}-{self.counter}"

    def set_active(self, ref: LaneRef, active: bool) -> None:
        """Note whether ``ref`` has an open operation (as of its last capture)."""
        if active and ref.lane_id not in self._active_ids:
            self._active_ids.add(ref.lane_id)
            self.active.append(ref)
        elif not active and ref.lane_id in self._active_ids:
            self._active_ids.discard(ref.lane_id)
            self.active.remove(ref)

    def add(self, ref: LaneRef) -> LaneRef:
        if ref.lane_id not in self.by_id:
            self.lanes.append(ref)
            self.by_id[ref.lane_id] = ref
        return self.by_id[ref.lane_id]


def user_msg(value: str) -> messages_pb2.AgentMessage:
    return messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(
            content=[messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))]
        )
    )


def text_block(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def call_block(call_id: str, name: str = "t", arguments: str = "{}") -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(
        tool_call=messages_pb2.ToolCallContent(id=call_id, name=name, arguments_json=arguments)
    )


def assistant_msg(*blocks: messages_pb2.ContentBlock, stop: int) -> messages_pb2.AssistantMessage:
    return messages_pb2.AssistantMessage(
        content=blocks,
        api="fuzz",
        provider="fuzz",
        model="m",
        stop_reason=stop,  # type: ignore[arg-type]
    )


STOP = messages_pb2.STOP_REASON_STOP
TOOL_USE = messages_pb2.STOP_REASON_TOOL_USE
#: The states :func:`build_lane` can put a lane in.
LANE_STATES = (
    "lane",
    "queued",
    "idle",
    "leased_idle",
    "turn_open",
    "streaming",
    "retry_scheduled",
    "suspended",
    "may_finish",
    "planned",
    "effect_pending",
    "outcome_ready_blocked",
    "completed_call",
    "aborting",
    "aborting_tools",
    "leased_tools",
    "ended",
    "compaction",
    "faulted",
    "navigated",
)


async def build_lane(stub: Stub, world: World, state: str) -> LaneRef:
    """A new lane in ``state`` (one of LANE_STATES), added to ``world``."""
    ref = LaneRef(world.fresh("lane"), state)
    lane = ref.lane_id
    # Added before the first await: lanes built concurrently join the world in a fixed order.
    world.add(ref)
    world.built.append(ref)
    await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))
    if state == "lane":
        return ref
    if state == "queued":
        for kind in (1, 2, 3):
            answer = await stub.EnqueueMessage(
                pb.EnqueueMessageRequest(lane_id=lane, kind=kind, message=user_msg(f"q{kind}"))  # type: ignore[arg-type]
            )
            ref.learn(ref.entry_ids, answer.entry_id)
        answer = await stub.EnqueueMessage(
            pb.EnqueueMessageRequest(
                lane_id=lane,
                kind=snapshot_pb2.QUEUE_KIND_WRITE,
                custom=entries_pb2.CustomEntry(custom_type="note", data_json='{"k": 1}'),
            )
        )
        ref.learn(ref.entry_ids, answer.entry_id)
        return ref
    if state in ("compaction", "faulted", "navigated", "ended"):
        await _finished_run(stub, ref)
        if state == "compaction":
            answer = await stub.StartCompaction(pb.StartCompactionRequest(lane_id=lane))
            ref.learn(ref.operation_ids, answer.operation_id)
        elif state == "faulted":
            await stub.ReportFault(pb.ReportFaultRequest(lane_id=lane, code="boom", message="m"))
        elif state == "navigated":
            await stub.NavigateLane(
                pb.NavigateLaneRequest(lane_id=lane, target_entry_id=ref.entry_ids[0])
            )
        return ref
    leased = state.startswith("leased")
    driver = world.fresh("driver")
    run = await stub.StartRun(
        pb.StartRunRequest(
            lane_id=lane,
            prompt=[user_msg("go")],
            driver_id=driver if leased else "",
            lease_seconds=600 if leased else 0,
        )
    )
    op = run.operation_id
    ref.learn(ref.operation_ids, op)
    token = run.lease.token
    if leased:
        ref.learn(ref.lease_tokens, token)
        ref.learn(ref.driver_ids, driver)
    if state in ("idle", "leased_idle"):
        return ref
    if state == "aborting":
        await stub.AbortOperation(pb.AbortOperationRequest(lane_id=lane, operation_id=op))
        return ref
    turn = await stub.StartTurn(
        pb.StartTurnRequest(lane_id=lane, operation_id=op, lease_token=token)
    )
    ref.learn(ref.turn_ids, turn.turn_id)
    common = {"lane_id": lane, "operation_id": op, "turn_id": turn.turn_id, "lease_token": token}
    if state == "turn_open":
        return ref
    if state == "streaming":
        partial = assistant_msg(text_block("part"), stop=messages_pb2.STOP_REASON_PENDING)
        await stub.AppendAssistantStream(
            pb.AppendAssistantStreamRequest(
                partials=[pb.StreamedPartial(message=partial)], **common
            )
        )
        return ref
    if state == "retry_scheduled":
        await stub.ScheduleRetry(
            pb.ScheduleRetryRequest(max_attempts=3, delay_ms=10, error_message="e", **common)
        )
        return ref
    if state == "suspended":
        await stub.SuspendRun(
            pb.SuspendRunRequest(
                deferred=snapshot_pb2.DeferredState(handle_json='{"h": 1}'), **common
            )
        )
        return ref
    if state == "may_finish":
        await stub.SettleAssistantMessage(
            pb.SettleAssistantMessageRequest(
                message=assistant_msg(text_block("done"), stop=STOP), **common
            )
        )
        return ref
    settled = await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            message=assistant_msg(
                text_block("calling"),
                call_block("c0"),
                call_block("c1", "u"),
                call_block("c2"),
                stop=TOOL_USE,
            ),
            **common,
        )
    )
    ref.learn(ref.entry_ids, settled.entry_id)
    for planned in settled.tool_calls:
        ref.learn(ref.entry_ids, planned.result_entry_id)
    tool = {"lane_id": lane, "operation_id": op, "lease_token": token}
    if state == "planned":
        return ref
    if state == "completed_call":
        await stub.StageToolOutcome(
            pb.StageToolOutcomeRequest(
                tool_call_id="c0",
                synthetic=pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL),
                **tool,
            )
        )
        return ref
    await stub.StartToolCall(
        pb.StartToolCallRequest(
            tool_call_id="c0", arguments_json='{"a": 1}', replay=pb.REPLAY_POLICY_SAFE, **tool
        )
    )
    if state in ("effect_pending", "leased_tools"):
        return ref
    if state == "aborting_tools":
        await stub.AbortOperation(pb.AbortOperationRequest(lane_id=lane, operation_id=op))
        return ref
    assert state == "outcome_ready_blocked", state
    await stub.StartToolCall(
        pb.StartToolCallRequest(tool_call_id="c1", arguments_json="{}", **tool)
    )
    await stub.StageToolOutcome(
        pb.StageToolOutcomeRequest(
            tool_call_id="c1",
            executed=pb.ExecutedOutcome(result=messages_pb2.ToolResult(content=[text_block("r")])),
            **tool,
        )
    )
    return ref


async def _finished_run(stub: Stub, ref: LaneRef) -> None:
    lane = ref.lane_id
    run = await stub.StartRun(pb.StartRunRequest(lane_id=lane, prompt=[user_msg("first")]))
    turn = await stub.StartTurn(pb.StartTurnRequest(lane_id=lane, operation_id=run.operation_id))
    settled = await stub.SettleAssistantMessage(
        pb.SettleAssistantMessageRequest(
            lane_id=lane,
            operation_id=run.operation_id,
            turn_id=turn.turn_id,
            message=assistant_msg(text_block("answer"), stop=STOP),
        )
    )
    await stub.EndRun(
        pb.EndRunRequest(
            lane_id=lane,
            operation_id=run.operation_id,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
        )
    )
    ref.learn(ref.operation_ids, run.operation_id)
    ref.learn(ref.turn_ids, turn.turn_id)
    ref.learn(ref.entry_ids, settled.entry_id)


async def populate(stub: Stub, world: World, copies: int = 2) -> None:
    """``copies`` lanes in every state of LANE_STATES."""
    for _ in range(copies):
        await asyncio.gather(*(build_lane(stub, world, state) for state in LANE_STATES))
