"""A real driver process for the crash tests: it drives runs on one lane under a lease, and
survives (or is the victim of) kill -9 of itself or of the service.

    python -m tests.crash.driver --target HOST:PORT[,HOST:PORT...] --lane L --driver-id D \\
        --database-url URL [--runs N] [--seed S] [--lease-seconds 3] [--plan JSON] [--report F]

What it does, until the lane has ``--runs`` ended runs:

* The lane has an open run: take it over with AcquireOperation (retried while another driver's
  lease is live; a run that ends meanwhile is simply gone). Mid-batch it follows the
  recovery rules: outcome_ready calls were placed by the takeover itself; an effect_pending SAFE
  call is replayed (ReplayToolCall, then executed again with the persisted arguments); an
  effect_pending NEVER call gets the synthetic INTERRUPTED outcome (never executed again);
  planned calls start as usual, in source order.
* Otherwise start the next run (StartRun with a lease) and drive it: ``K`` turns whose
  assistant message asks for a parallel or sequential batch of tool calls, then a final
  assistant message without tool calls, then EndRun COMPLETED.

A background task renews the lease every third of its length. Every tool execution first
records a row in ``crash_executions`` (same database) and only then does its "effect" (sleeps,
progress updates, some of them checkpoints), so a checker can count executions per call.

Every mutating command carries a request id derived from the driver id and the step, so a retry
after the service died (UNAVAILABLE, a dropped connection, a deadline) is idempotent; retries
rotate over the ``--target`` list. Exit status: 0 done, 3 the lease was lost (a stale token was
refused), 4 the service stayed unreachable, 1 anything unexpected. Progress goes to ``--report``
as JSON lines.

The plan of a run is a pure function of (seed, operation id) — or ``--plan`` — so a driver that
takes a run over knows what its predecessor would have done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

import grpc
import psycopg
from lane.client.connect import open_channel
from lane.client.errors import LaneError, lane_error
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

EXIT_DONE = 0
EXIT_LEASE_LOST = 3
EXIT_UNREACHABLE = 4

SAFE_TOOL = "safe_read"
NEVER_TOOL = "never_write"
UNKNOWN_TOOL = "nosuch"
#: The marker the service appends to an interruption result (service/domain/results.py).
INTERRUPTED_MARKER = "[interrupted]"

EXECUTIONS_DDL = """
CREATE TABLE IF NOT EXISTS crash_executions (
    lane_id      text NOT NULL,
    operation_id text NOT NULL,
    tool_call_id text NOT NULL,
    attempt_no   integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    driver_id    text NOT NULL DEFAULT '',
    lease_token  bigint NOT NULL DEFAULT 0,
    replayed     boolean NOT NULL DEFAULT false
)
"""

T = TypeVar("T")


def replay_of(tool_name: str) -> int:
    """The replay policy a tool declares: ``safe_*`` tools are SAFE, everything else NEVER."""
    return pb.REPLAY_POLICY_SAFE if tool_name.startswith("safe_") else pb.REPLAY_POLICY_NEVER


async def ensure_executions_table(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create ``crash_executions`` if missing (concurrent creators may race: tolerated)."""
    with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        await conn.execute(EXECUTIONS_DDL)


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallSpec:
    """One tool call of a planned assistant message; its arguments say how it behaves."""

    name: str
    steps: int = 2
    delay: float = 0.2
    checkpoint: bool = True
    start_delay: float = 0.0

    def arguments(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "delay": self.delay,
            "checkpoint": self.checkpoint,
            "start_delay": self.start_delay,
        }


@dataclass(frozen=True)
class RunPlan:
    """What a run does: its tool execution mode and one list of calls per tool turn."""

    mode: int  # pb.ToolExecution
    turns: tuple[tuple[CallSpec, ...], ...]


def plan_for(seed: int, operation_id: str, override: dict[str, Any] | None) -> RunPlan:
    """The plan of ``operation_id``: from ``override`` (``--plan``) or drawn at random."""
    if override is not None:
        mode = (
            pb.TOOL_EXECUTION_SEQUENTIAL
            if override.get("mode") == "sequential"
            else pb.TOOL_EXECUTION_PARALLEL
        )
        return RunPlan(
            mode, tuple(tuple(CallSpec(**call) for call in turn) for turn in override["turns"])
        )
    rng = random.Random(f"{seed}:{operation_id}")
    mode = pb.TOOL_EXECUTION_PARALLEL if rng.random() < 0.6 else pb.TOOL_EXECUTION_SEQUENTIAL
    drawn: list[tuple[CallSpec, ...]] = []
    for _ in range(rng.choice((2, 3))):
        calls: list[CallSpec] = []
        for _ in range(rng.randint(1, 4)):
            name = rng.choice((SAFE_TOOL,) * 4 + (NEVER_TOOL,) * 5 + (UNKNOWN_TOOL,))
            calls.append(
                CallSpec(
                    name=name,
                    steps=rng.randint(1, 4),
                    delay=round(rng.uniform(0.1, 0.45), 2),
                    checkpoint=rng.random() < 0.7,
                )
            )
        drawn.append(tuple(calls))
    return RunPlan(mode, tuple(drawn))


def turn_id_of(operation_id: str, k: int) -> str:
    return f"{operation_id}.t{k}"


def turn_index(turn_id: str) -> int:
    return int(turn_id.rpartition(".t")[2])


def prompt_text(operation_id: str) -> str:
    return f"prompt {operation_id}"


def turn_text(operation_id: str, k: int) -> str:
    return f"turn {operation_id} {k}"


def _text(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def assistant_message(plan: RunPlan, operation_id: str, k: int) -> messages_pb2.AssistantMessage:
    """The assistant message of turn ``k``: tool calls for a tool turn, text only at the end."""
    content = [_text(turn_text(operation_id, k))]
    calls = plan.turns[k] if k < len(plan.turns) else ()
    for index, spec in enumerate(calls):
        content.append(
            messages_pb2.ContentBlock(
                tool_call=messages_pb2.ToolCallContent(
                    id=f"{turn_id_of(operation_id, k)}.c{index}",
                    name=spec.name,
                    arguments_json=json.dumps(spec.arguments(), sort_keys=True),
                )
            )
        )
    return messages_pb2.AssistantMessage(
        content=content,
        api="crash",
        provider="scripted",
        model="m1",
        stop_reason=messages_pb2.STOP_REASON_TOOL_USE if calls else messages_pb2.STOP_REASON_STOP,
    )


# -- errors --------------------------------------------------------------------------------------


class LeaseLost(Exception):
    """A command was refused with ABORTED STALE_LEASE: another driver owns the run now."""


class RunGone(Exception):
    """The run is no longer open (the service reconciled it, or another driver ended it)."""


class CancelSeen(Exception):
    """The run's abort was requested: wrap it up with EndRun ABORTED."""


class Unreachable(Exception):
    """No service answered for the whole retry budget."""


_TRANSPORT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
    }
)


def retryable(error: LaneError) -> bool:
    """Failures of the transport or of a dying service: retry with the same request id."""
    if error.code == grpc.StatusCode.UNAVAILABLE:
        return True
    return error.code in _TRANSPORT and error.reason in ("", "INTERNAL")


def classify(error: LaneError) -> Exception:
    """The driver's view of a refusal."""
    if error.code == grpc.StatusCode.ABORTED and error.reason == "STALE_LEASE":
        return LeaseLost(str(error))
    if error.reason == "OPERATION_NOT_OPEN":
        return RunGone(str(error))
    if error.reason == "OPERATION_CANCELLED":
        return CancelSeen(str(error))
    return error


# -- the driver ----------------------------------------------------------------------------------


class Driver:
    """One driver process's state: its channels, its database connection, its report."""

    def __init__(
        self,
        targets: Sequence[str],
        lane_id: str,
        driver_id: str,
        conn: psycopg.AsyncConnection[Any],
        *,
        runs: int,
        seed: int,
        lease_seconds: int,
        plan: dict[str, Any] | None,
        report: TextIO | None,
        retry_budget: float = 120.0,
    ) -> None:
        self.targets = list(targets)
        self.channels = [open_channel(t) for t in self.targets]
        self.stubs: list[lane_service_pb2_grpc.LaneServiceAsyncStub] = [
            lane_service_pb2_grpc.LaneServiceStub(c) for c in self.channels
        ]
        self.current = sum(driver_id.encode()) % len(self.stubs)
        self.lane_id = lane_id
        self.driver_id = driver_id
        self.conn = conn
        self.runs = runs
        self.seed = seed
        self.lease_seconds = lease_seconds
        self.plan_override = plan
        self.report_file = report
        self.retry_budget = retry_budget

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()

    def report(self, event: str, **fields: Any) -> None:
        if self.report_file is None:
            return
        line = {"t": round(time.time(), 3), "driver": self.driver_id, "event": event, **fields}
        self.report_file.write(json.dumps(line) + "\n")
        self.report_file.flush()

    # -- RPC with retries -------------------------------------------------------------------------

    async def rpc(self, method: str, request: Any, *, per_try: float = 15.0) -> Any:
        """Call ``method``; retry transport failures (same request, next target) for a while.
        Refusals raise: :class:`LeaseLost`, :class:`RunGone`, :class:`CancelSeen` or
        :class:`LaneError`."""
        deadline = time.monotonic() + self.retry_budget
        delay = 0.05
        while True:
            stub = self.stubs[self.current]
            try:
                return await getattr(stub, method)(request, timeout=per_try)
            except grpc.aio.AioRpcError as err:
                error = lane_error(err)
            if not retryable(error):
                raise classify(error)
            if error.code != grpc.StatusCode.UNAVAILABLE:
                # Expected when a service dies mid-call; INTERNAL would be a service bug.
                self.report(
                    "rpc_retry",
                    method=method,
                    code=error.code.name,
                    reason=error.reason,
                    detail=error.message[:200],
                )
            if time.monotonic() > deadline:
                raise Unreachable(f"{method}: {error}")
            self.current = (self.current + 1) % len(self.stubs)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def rid(self, *parts: object) -> str:
        return ":".join([self.driver_id, *map(str, parts)])

    # -- the main loop ----------------------------------------------------------------------------

    async def run(self) -> int:
        await ensure_executions_table(self.conn)
        await self.rpc("CreateLane", pb.CreateLaneRequest(lane_id=self.lane_id))
        self.report("begin", lane=self.lane_id)
        while True:
            snapshot = (
                await self.rpc("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=self.lane_id))
            ).snapshot
            try:
                if snapshot.HasField("operation"):
                    await self.take_over(snapshot.operation.id)
                    continue
                ended = await self.ended_runs()
                if ended >= self.runs:
                    self.report("done", ended=ended)
                    return EXIT_DONE
                await self.start_run(f"{self.lane_id}.r{ended}")
            except RunGone as gone:
                self.report("run_gone", detail=str(gone))
            except LeaseLost as lost:
                self.report("lease_lost", detail=str(lost))
                return EXIT_LEASE_LOST

    async def ended_runs(self) -> int:
        cur = await self.conn.execute(
            "SELECT count(*) FROM operations WHERE lane_id = %s AND phase = 'ended'",
            (self.lane_id,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def start_run(self, operation_id: str) -> None:
        plan = plan_for(self.seed, operation_id, self.plan_override)
        request = pb.StartRunRequest(
            lane_id=self.lane_id,
            operation_id=operation_id,
            prompt=[
                messages_pb2.AgentMessage(
                    user=messages_pb2.UserMessage(content=[_text(prompt_text(operation_id))])
                )
            ],
            settings=pb.RunSettings(tool_execution=plan.mode),  # type: ignore[arg-type]
            request_id=self.rid("run", operation_id),
            driver_id=self.driver_id,
            lease_seconds=self.lease_seconds,
        )
        try:
            answer = await self.rpc("StartRun", request)
        except LaneError as error:
            if error.reason in ("LANE_BUSY", "OPERATION_ID_REUSED") or (
                error.code == grpc.StatusCode.ALREADY_EXISTS
            ):
                self.report("start_refused", op=operation_id, reason=error.reason)
                return  # someone else's run appeared: look again
            raise
        self.report("start_run", op=operation_id, token=answer.lease.token)
        await self.own(operation_id, answer.lease.token, None, plan)

    async def take_over(self, operation_id: str) -> None:
        request = pb.AcquireOperationRequest(
            lane_id=self.lane_id,
            operation_id=operation_id,
            driver_id=self.driver_id,
            lease_seconds=self.lease_seconds,
            request_id=self.rid("acquire", operation_id),
        )
        while True:
            try:
                answer = await self.rpc("AcquireOperation", request)
                break
            except LaneError as error:
                if error.reason != "LEASE_HELD":
                    raise
            await asyncio.sleep(0.2)  # the previous driver's lease has not lapsed yet
        state = answer.state
        self.report(
            "takeover",
            op=operation_id,
            token=answer.lease.token,
            revision=answer.revision,
            phase=pb.RunPhase.Name(state.phase),
            calls={c.tool_call_id: pb.ToolCallStatus.Name(c.status) for c in state.tool_calls},
        )
        if not state.operation_id:
            raise RunGone("the takeover's placement ended the run")
        plan = plan_for(self.seed, operation_id, self.plan_override)
        await self.own(operation_id, answer.lease.token, state, plan)

    async def own(
        self, operation_id: str, token: int, state: pb.OperationState | None, plan: RunPlan
    ) -> None:
        """Drive the run while a background task keeps the lease; whichever fails first wins."""
        run = Run(self, operation_id, token, plan)
        renewer = asyncio.create_task(run.renew_forever())
        driving = asyncio.create_task(run.drive(state))
        try:
            done, _ = await asyncio.wait({renewer, driving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (renewer, driving):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await run.stop_tools()
        if driving in done:
            driving.result()  # re-raises how the drive failed, if it did
            return
        error = renewer.exception()
        if isinstance(error, CancelSeen):
            await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
            return
        assert error is not None
        raise error


class Run:
    """Driving one run under one lease token."""

    def __init__(self, driver: Driver, operation_id: str, token: int, plan: RunPlan) -> None:
        self.d = driver
        self.lane_id = driver.lane_id
        self.operation_id = operation_id
        self.token = token
        self.plan = plan
        self.tools: list[asyncio.Task[None]] = []

    def rid(self, *parts: object) -> str:
        return self.d.rid(self.operation_id, self.token, *parts)

    async def stop_tools(self) -> None:
        for task in self.tools:
            task.cancel()
        for task in self.tools:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tools.clear()

    async def renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.d.lease_seconds / 3)
            answer = await self.d.rpc(
                "RenewLease",
                pb.RenewLeaseRequest(
                    lane_id=self.lane_id,
                    operation_id=self.operation_id,
                    lease_token=self.token,
                    lease_seconds=self.d.lease_seconds,
                ),
            )
            if answer.cancel_requested:
                raise CancelSeen("the lease renewal says the abort was requested")

    async def drive(self, state: pb.OperationState | None) -> None:
        try:
            await self._drive(state)
        except CancelSeen:
            await self.stop_tools()
            await self.end(snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)

    async def get_state(self) -> pb.OperationState:
        try:
            answer = await self.d.rpc(
                "GetOperation",
                pb.GetOperationRequest(lane_id=self.lane_id, operation_id=self.operation_id),
            )
        except LaneError as error:
            if error.reason == "OPERATION_NOT_OPEN":
                raise RunGone(str(error)) from None
            raise
        state: pb.OperationState = answer.state
        return state

    async def _drive(self, state: pb.OperationState | None) -> None:
        while True:
            if state is None:
                state = await self.get_state()
            if state.lease.token and state.lease.token != self.token:
                raise LeaseLost(f"operation leased with token {state.lease.token}")
            if state.cancel_requested:
                raise CancelSeen("the operation state says the abort was requested")
            if state.phase == pb.RUN_PHASE_TOOLS:
                await self.run_batch(state)
            elif state.phase == pb.RUN_PHASE_TURN_OPEN:
                await self.settle(turn_index(state.turn_id))
            elif state.may_finish:
                await self.end(snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
                return
            else:
                k = await self.next_turn()
                answer = await self.d.rpc(
                    "StartTurn",
                    pb.StartTurnRequest(
                        lane_id=self.lane_id,
                        operation_id=self.operation_id,
                        turn_id=turn_id_of(self.operation_id, k),
                        request_id=self.rid("turn", k),
                        lease_token=self.token,
                    ),
                )
                if answer.cancel_requested:
                    raise CancelSeen("StartTurn")
                if await self.settle(k):
                    await self.run_batch(await self.get_state())
            state = None

    async def next_turn(self) -> int:
        """The index of the next turn: one past the run's last assistant message."""
        snapshot = (
            await self.d.rpc("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=self.lane_id))
        ).snapshot
        for entry in reversed(snapshot.transcript):
            if entry.WhichOneof("payload") != "message":
                continue
            message = entry.message.message
            kind = message.WhichOneof("message")
            blocks = (
                message.assistant.content
                if kind == "assistant"
                else message.user.content
                if kind == "user"
                else ()
            )
            first = blocks[0].text.text if blocks and blocks[0].HasField("text") else ""
            if kind == "assistant" and first.startswith(f"turn {self.operation_id} "):
                return int(first.rsplit(" ", 1)[1]) + 1
            if kind == "user" and first == prompt_text(self.operation_id):
                return 0
        raise AssertionError(f"run {self.operation_id} has no prompt in the transcript")

    async def settle(self, k: int) -> bool:
        """Settle turn ``k``'s assistant message; True when it planned a tool batch."""
        message = assistant_message(self.plan, self.operation_id, k)
        answer = await self.d.rpc(
            "SettleAssistantMessage",
            pb.SettleAssistantMessageRequest(
                lane_id=self.lane_id,
                operation_id=self.operation_id,
                turn_id=turn_id_of(self.operation_id, k),
                message=message,
                request_id=self.rid("settle", k),
                lease_token=self.token,
            ),
        )
        if answer.cancel_requested:
            raise CancelSeen("SettleAssistantMessage")
        return len(answer.tool_calls) > 0

    async def end(self, status: int) -> None:
        answer = await self.d.rpc(
            "EndRun",
            pb.EndRunRequest(
                lane_id=self.lane_id,
                operation_id=self.operation_id,
                status=status,  # type: ignore[arg-type]
                request_id=self.rid("end", status),
                lease_token=self.token,
            ),
        )
        self.d.report(
            "end_run",
            op=self.operation_id,
            status=answer.result.status,
            revision=answer.revision,
        )

    # -- the tool batch ---------------------------------------------------------------------------

    async def run_batch(self, state: pb.OperationState) -> None:
        """Bring every call of the batch to outcome_ready (placement follows by itself)."""
        sources = {
            block.tool_call.id: block.tool_call
            for block in state.assistant.content
            if block.WhichOneof("block") == "tool_call"
        }
        sequential = state.settings.tool_execution == pb.TOOL_EXECUTION_SEQUENTIAL
        try:
            for call in state.tool_calls:
                if call.status in (
                    pb.TOOL_CALL_STATUS_COMPLETED,
                    pb.TOOL_CALL_STATUS_OUTCOME_READY,
                ):
                    continue
                effect = await self.begin(call, sources[call.tool_call_id].arguments_json)
                if effect is None:
                    continue
                if sequential:
                    await effect
                else:
                    self.tools.append(asyncio.create_task(effect))
            # Tool tasks raise LeaseLost / RunGone / CancelSeen like the rest of the drive.
            for task in list(self.tools):
                await task
        finally:
            await self.stop_tools()

    async def begin(
        self, call: pb.ToolCallState, source_args: str
    ) -> Coroutine[Any, Any, None] | None:
        """The start phase of one call (awaited in source order); its effect, if it has one."""
        call_id = call.tool_call_id
        if call.status == pb.TOOL_CALL_STATUS_EFFECT_PENDING:
            if call.replay == pb.REPLAY_POLICY_SAFE:
                answer = await self.d.rpc(
                    "ReplayToolCall",
                    pb.ReplayToolCallRequest(
                        lane_id=self.lane_id,
                        operation_id=self.operation_id,
                        tool_call_id=call_id,
                        lease_token=self.token,
                        request_id=self.rid("replay", call_id),
                    ),
                )
                self.d.report("replay", op=self.operation_id, call=call_id)
                return self.execute(call, answer.arguments_json, replayed=True)
            await self.stage(
                call_id,
                synthetic=pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_INTERRUPTED),
                kind="interrupt",
            )
            self.d.report("interrupt", op=self.operation_id, call=call_id)
            return None
        spec = json.loads(source_args)
        if spec.get("start_delay"):
            await asyncio.sleep(float(spec["start_delay"]))
        if call.tool_name == UNKNOWN_TOOL:
            await self.stage(
                call_id,
                synthetic=pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL),
                kind="unknown",
            )
            return None
        answer = await self.d.rpc(
            "StartToolCall",
            pb.StartToolCallRequest(
                lane_id=self.lane_id,
                operation_id=self.operation_id,
                tool_call_id=call_id,
                arguments_json=source_args,
                replay=replay_of(call.tool_name),  # type: ignore[arg-type]
                request_id=self.rid("start", call_id),
                lease_token=self.token,
            ),
        )
        if answer.cancel_requested:
            raise CancelSeen("StartToolCall")
        return self.execute(call, source_args, replayed=False)

    async def execute(self, call: pb.ToolCallState, arguments_json: str, *, replayed: bool) -> None:
        """The tool: record the execution, then do the effect, then stage its result."""
        call_id = call.tool_call_id
        cur = await self.d.conn.execute(
            "INSERT INTO crash_executions"
            " (lane_id, operation_id, tool_call_id, attempt_no, driver_id, lease_token, replayed)"
            " SELECT %s, %s, %s, coalesce(max(attempt_no), 0) + 1, %s, %s, %s"
            " FROM crash_executions WHERE lane_id = %s AND tool_call_id = %s"
            " RETURNING attempt_no",
            (
                self.lane_id,
                self.operation_id,
                call_id,
                self.d.driver_id,
                self.token,
                replayed,
                self.lane_id,
                call_id,
            ),
        )
        row = await cur.fetchone()
        attempt = row[0] if row else 0
        spec = json.loads(arguments_json)
        steps = int(spec.get("steps", 1))
        for step in range(1, steps + 1):
            await asyncio.sleep(float(spec.get("delay", 0.1)))
            answer = await self.d.rpc(
                "UpdateToolCall",
                pb.UpdateToolCallRequest(
                    lane_id=self.lane_id,
                    operation_id=self.operation_id,
                    tool_call_id=call_id,
                    partial_result=messages_pb2.ToolResult(
                        content=[_text(f"{call_id} step {step}/{steps}")]
                    ),
                    checkpoint=bool(spec.get("checkpoint")),
                    request_id=self.rid("update", call_id, step),
                    lease_token=self.token,
                ),
            )
            if answer.cancel_requested:
                raise CancelSeen("UpdateToolCall")
        await self.stage(
            call_id,
            executed=pb.ExecutedOutcome(
                result=messages_pb2.ToolResult(
                    content=[_text(f"{call.tool_name} {call_id} done (attempt {attempt})")]
                )
            ),
            kind="stage",
        )

    async def stage(
        self,
        call_id: str,
        *,
        kind: str,
        executed: pb.ExecutedOutcome | None = None,
        synthetic: pb.SyntheticOutcome | None = None,
    ) -> None:
        request = pb.StageToolOutcomeRequest(
            lane_id=self.lane_id,
            operation_id=self.operation_id,
            tool_call_id=call_id,
            request_id=self.rid(kind, call_id),
            lease_token=self.token,
        )
        if executed is not None:
            request.executed.CopyFrom(executed)
        if synthetic is not None:
            request.synthetic.CopyFrom(synthetic)
        answer = await self.d.rpc("StageToolOutcome", request)
        self.d.report(
            "staged",
            op=self.operation_id,
            call=call_id,
            kind=kind,
            staged_revision=answer.staged_revision,
            placed=list(answer.placed_tool_call_ids),
        )


async def amain(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as files:
        report = (
            files.enter_context(Path(args.report).open("a", encoding="utf-8"))  # noqa: ASYNC230
            if args.report
            else None
        )
        async with await psycopg.AsyncConnection.connect(
            args.database_url, autocommit=True
        ) as conn:
            driver = Driver(
                [t for t in args.target.split(",") if t],
                args.lane,
                args.driver_id,
                conn,
                runs=args.runs,
                seed=args.seed,
                lease_seconds=args.lease_seconds,
                plan=json.loads(args.plan) if args.plan else None,
                report=report,
            )
            try:
                return await driver.run()
            except Unreachable as error:
                driver.report("unreachable", detail=str(error))
                return EXIT_UNREACHABLE
            finally:
                await driver.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.crash.driver", description=__doc__)
    parser.add_argument("--target", required=True, help="HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--lane", required=True)
    parser.add_argument("--driver-id", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--runs", type=int, default=1, help="stop once the lane has N ended runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease-seconds", type=int, default=3)
    parser.add_argument("--plan", default="", help="JSON: {mode, turns: [[call spec...]...]}")
    parser.add_argument("--report", default="", help="append JSON lines of progress here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, run: Callable[..., Any] = asyncio.run) -> int:
    status: int = run(amain(argv))
    return status


if __name__ == "__main__":
    sys.exit(main())
