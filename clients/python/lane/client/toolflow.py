"""The tool flow for one batch (docs/contract.md, Tool calls), as the driver runs it.

For each call, in source order: prepare (TRUNCATED when the assistant stopped for length,
UNKNOWN_TOOL, INVALID_ARGUMENTS from the tool's JSON Schema), the before_tool hooks (replace
arguments, revalidated; deny; a raising hook denies), the intent (``StartToolCall``), then the
execution (progress and checkpoints are ``UpdateToolCall``; a raising tool gives an error
result), the after_tool hooks (skipped once an abort began) and staging
(``StageToolOutcome``; the service places the ready source-order prefix). Parallel batches
start their calls one after another and let them run and settle in any order; sequential ones
finish each call before starting the next. Once the run's abort is seen nothing new starts:
planned calls get CANCELLED results, running tools see the abort signal and finish (or are
cancelled after the grace period and get an INTERRUPTED result).

A batch taken over from a dead driver also has effect_pending calls: a call whose stored
policy and whose tool both say ``safe`` is replayed (``ReplayToolCall``, executed again);
any other gets an INTERRUPTED result (its latest checkpoint plus a notice). Staged calls are
left alone: they never execute again.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from lane.client.errors import LaneError, NotReplayable, OperationCancelled
from lane.client.hooks import (
    KEEP,
    AfterToolEvent,
    AfterToolPatch,
    BeforeToolEvent,
    Deny,
    Hooks,
    ReplaceArguments,
)
from lane.client.tools import Tool, ToolContext, ToolResult, ToolResultLike, to_result_proto
from lane.limits import MAX_PAYLOAD_BYTES
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

__all__ = ["BatchCall", "LeaseLost", "RunControl", "ToolFlow"]

_log = logging.getLogger("lane.client.driver")
#: The largest tool result the service accepts (docs/limits.md: one payload, encoded).
MAX_RESULT_BYTES = MAX_PAYLOAD_BYTES

#: Sends one command of the run (lease token, request id, retries, cancel_requested).
Command = Callable[[Any, Any], Awaitable[Any]]


class LeaseLost(Exception):
    """Another driver took the run over (the service refused this driver's fencing token)."""


class _ToolStopped(Exception):
    """A tool was cancelled after the abort grace period; its outcome is unknown."""


class RunControl:
    """One run a driver holds: its ids, lease token, settings, and the abort signal."""

    def __init__(
        self, operation_id: str, lease_token: int, settings: pb.RunSettings, revision: int
    ) -> None:
        self.operation_id = operation_id
        self.lease_token = lease_token
        self.settings = settings
        #: The revision after the run's first command here: a turn reads the lane at or after it.
        self.revision = revision
        #: Set once the run's abort was seen (durably requested at the service).
        self.cancel = asyncio.Event()
        self.lost: LaneError | None = None
        self.turns = 0

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def mark_cancelled(self, source: str) -> None:
        if not self.cancel.is_set():
            _log.info("operation %s: abort seen (%s); stopping", self.operation_id, source)
            self.cancel.set()


@dataclass
class BatchCall:
    """A call of the batch being driven, with its durable status."""

    tool_call_id: str
    tool_name: str
    source_index: int
    result_entry_id: str
    source_arguments: str
    status: pb.ToolCallStatus.ValueType = pb.TOOL_CALL_STATUS_PLANNED
    replay: pb.ReplayPolicy.ValueType = pb.REPLAY_POLICY_UNSPECIFIED
    persisted_arguments: str | None = None


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _text_block(text: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=text))


class ToolFlow:
    """Runs tool batches of one lane's runs through ``command``."""

    def __init__(
        self,
        *,
        stub: Any,
        lane_id: str,
        tools: Mapping[str, Tool],
        hooks: Hooks,
        abort_grace_seconds: float | None,
        command: Command,
    ) -> None:
        self._stub = stub
        self.lane_id = lane_id
        self.tools = tools
        self.hooks = hooks
        self.abort_grace_seconds = abort_grace_seconds
        self._command = command

    async def run_batch(
        self,
        run: RunControl,
        turn_id: str,
        assistant: messages_pb2.AssistantMessage,
        calls: Sequence[BatchCall],
        active: frozenset[str] | None = None,
    ) -> None:
        """Finish every call of the batch: start in source order; run in parallel or one at a
        time (RunSettings); stage each outcome. ``active``: the lane's active tool names (None:
        every tool of the driver); a call of another tool is UNKNOWN_TOOL."""
        sequential = run.settings.tool_execution == pb.TOOL_EXECUTION_SEQUENTIAL
        try:
            async with asyncio.TaskGroup() as group:
                for item in sorted(calls, key=lambda c: c.source_index):
                    if item.status in (
                        pb.TOOL_CALL_STATUS_OUTCOME_READY,
                        pb.TOOL_CALL_STATUS_COMPLETED,
                    ):
                        continue
                    if item.status == pb.TOOL_CALL_STATUS_EFFECT_PENDING:
                        job: Awaitable[None] | None = self._recover_call(run, turn_id, item, active)
                    else:
                        job = await self._start_call(run, turn_id, assistant, item, active)
                    if job is None:
                        continue
                    task = group.create_task(cast(Any, job), name=f"tool {item.tool_call_id}")
                    if sequential:
                        await task
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None

    async def _stage(
        self,
        run: RunControl,
        item: BatchCall,
        *,
        executed: pb.ExecutedOutcome | None = None,
        synthetic: pb.SyntheticOutcome | None = None,
    ) -> None:
        request = pb.StageToolOutcomeRequest(
            lane_id=self.lane_id, operation_id=run.operation_id, tool_call_id=item.tool_call_id
        )
        if executed is not None:
            request.executed.CopyFrom(executed)
        if synthetic is not None:
            request.synthetic.CopyFrom(synthetic)
        await self._command(self._stub.StageToolOutcome, request)
        if executed is not None:
            outcome = "error result" if executed.is_error else "result"
        else:
            outcome = pb.SyntheticCause.Name(request.synthetic.cause)
        _log.info("call %s (%s) staged: %s", item.tool_call_id, item.tool_name, outcome)

    async def _synthetic(
        self,
        run: RunControl,
        item: BatchCall,
        cause: pb.SyntheticCause.ValueType,
        message: str = "",
        terminate: bool = False,
    ) -> None:
        await self._stage(
            run,
            item,
            synthetic=pb.SyntheticOutcome(cause=cause, message=message, terminate=terminate),
        )

    def _tool(self, name: str, active: frozenset[str] | None) -> Tool | None:
        return self.tools.get(name) if active is None or name in active else None

    async def _start_call(
        self,
        run: RunControl,
        turn_id: str,
        assistant: messages_pb2.AssistantMessage,
        item: BatchCall,
        active: frozenset[str] | None,
    ) -> Awaitable[None] | None:
        """Prepare, before_tool, intent. Returns the execution to run, or None when the call
        got an immediate (synthetic) outcome."""
        if assistant.stop_reason == messages_pb2.STOP_REASON_LENGTH:
            # Before the abort check: the service accepts no other outcome for such a call.
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_TRUNCATED)
            return None
        if run.cancelled:
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_CANCELLED)
            return None
        tool = self._tool(item.tool_name, active)
        if tool is None:
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL)
            return None
        try:
            args = json.loads(item.source_arguments)
        except ValueError as err:
            await self._synthetic(
                run, item, pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, f"arguments are not JSON: {err}"
            )
            return None
        problem = tool.validate(args)
        if problem is not None:
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, problem)
            return None
        arguments_json = item.source_arguments
        for hook in self.hooks.before_tool:
            event = BeforeToolEvent(
                lane_id=self.lane_id,
                operation_id=run.operation_id,
                turn_id=turn_id,
                tool_call_id=item.tool_call_id,
                tool_name=item.tool_name,
                args=copy.deepcopy(args),
            )
            try:
                decision = await _maybe_await(hook(event))
            except Exception as err:
                reason = f"before_tool hook failed: {err or type(err).__name__}"
                await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_DENIED, reason)
                return None
            if isinstance(decision, Deny):
                reason = decision.reason or "denied by a before_tool hook"
                await self._synthetic(
                    run, item, pb.SYNTHETIC_CAUSE_DENIED, reason, decision.terminate
                )
                return None
            if isinstance(decision, ReplaceArguments):
                problem = tool.validate(decision.args)
                if problem is not None:
                    await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, problem)
                    return None
                args = dict(decision.args)
                arguments_json = json.dumps(args)
        if run.cancelled:
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_CANCELLED)
            return None
        replay = pb.REPLAY_POLICY_SAFE if tool.replay == "safe" else pb.REPLAY_POLICY_NEVER
        try:
            await self._command(
                self._stub.StartToolCall,
                pb.StartToolCallRequest(
                    lane_id=self.lane_id,
                    operation_id=run.operation_id,
                    tool_call_id=item.tool_call_id,
                    arguments_json=arguments_json,
                    replay=replay,
                ),
            )
        except OperationCancelled:
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_CANCELLED)
            return None
        if run.cancelled:
            # The intent committed but the effect has not begun: cancelled, not run.
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_CANCELLED)
            return None
        _log.info("call %s (%s) started", item.tool_call_id, item.tool_name)
        return self._execute(run, turn_id, item, tool, args, replaying=False)

    async def _recover_call(
        self, run: RunControl, turn_id: str, item: BatchCall, active: frozenset[str] | None
    ) -> None:
        """An effect_pending call of a taken-over batch: safe replay, else interruption."""
        tool = self._tool(item.tool_name, active)
        args: Any = None
        replayable = (
            not run.cancelled
            and item.replay == pb.REPLAY_POLICY_SAFE
            and tool is not None
            and tool.replay == "safe"
            and item.persisted_arguments is not None
        )
        if replayable and tool is not None and item.persisted_arguments is not None:
            try:
                args = json.loads(item.persisted_arguments)
            except ValueError:
                replayable = False
            else:
                replayable = tool.validate(args) is None
        if replayable and tool is not None:
            try:
                replayed = await self._command(
                    self._stub.ReplayToolCall,
                    pb.ReplayToolCallRequest(
                        lane_id=self.lane_id,
                        operation_id=run.operation_id,
                        tool_call_id=item.tool_call_id,
                    ),
                )
            except (OperationCancelled, NotReplayable):
                pass  # interrupted below instead
            else:
                _log.info("call %s (%s) replayed", item.tool_call_id, item.tool_name)
                await self._execute(
                    run, turn_id, item, tool, json.loads(replayed.arguments_json), replaying=True
                )
                return
        await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_INTERRUPTED)

    async def _execute(
        self,
        run: RunControl,
        turn_id: str,
        item: BatchCall,
        tool: Tool,
        args: dict[str, Any],
        *,
        replaying: bool,
    ) -> None:
        """Run the tool, apply after_tool hooks, stage the outcome."""

        async def report(result: messages_pb2.ToolResult, checkpoint: bool) -> None:
            await self._command(
                self._stub.UpdateToolCall,
                pb.UpdateToolCallRequest(
                    lane_id=self.lane_id,
                    operation_id=run.operation_id,
                    tool_call_id=item.tool_call_id,
                    partial_result=result,
                    checkpoint=checkpoint,
                ),
            )

        context = ToolContext(
            lane_id=self.lane_id,
            operation_id=run.operation_id,
            turn_id=turn_id,
            tool_call_id=item.tool_call_id,
            tool_name=item.tool_name,
            result_entry_id=item.result_entry_id,
            replaying=replaying,
            abort_signal=run.cancel,
            report=report,
        )
        try:
            produced = await self._await_tool(run, tool.invoke(copy.deepcopy(args), context))
            result, is_error = to_result_proto(produced)
        except _ToolStopped:
            await self._synthetic(run, item, pb.SYNTHETIC_CAUSE_INTERRUPTED)
            return
        except LeaseLost:
            raise
        except Exception as err:
            result = messages_pb2.ToolResult(content=[_text_block(str(err) or type(err).__name__)])
            is_error = True
        finally:
            context.close()
        if self.hooks.after_tool and not run.cancelled:
            result, is_error = await self._after_tool(
                run, turn_id, item, args, result, is_error, replaying
            )
        if result.ByteSize() > MAX_RESULT_BYTES:
            # The service would refuse it (PAYLOAD_TOO_LARGE) and the run could not go on;
            # the model gets an error it can act on instead (ask for less, page through).
            result = messages_pb2.ToolResult(
                content=[
                    _text_block(
                        f"the tool's result is {result.ByteSize()} bytes encoded, more than the "
                        f"{MAX_RESULT_BYTES} the lane service accepts; ask for less"
                    )
                ]
            )
            is_error = True
        await self._stage(run, item, executed=pb.ExecutedOutcome(result=result, is_error=is_error))

    async def _await_tool(
        self, run: RunControl, execution: Awaitable[ToolResultLike]
    ) -> ToolResultLike:
        """The tool's result; with an abort grace period, cancel it once the grace is over."""
        task = asyncio.ensure_future(execution)
        grace = self.abort_grace_seconds
        if grace is None:
            return await task
        aborted = asyncio.ensure_future(run.cancel.wait())
        try:
            await asyncio.wait({task, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                done, _ = await asyncio.wait({task}, timeout=grace)
                if not done:
                    task.cancel()
                    try:
                        return await task  # a tool may still return something when cancelled
                    except asyncio.CancelledError:
                        current = asyncio.current_task()
                        if current is not None and current.cancelling():
                            raise
                        raise _ToolStopped from None
            return task.result()
        finally:
            aborted.cancel()
            if not task.done():
                task.cancel()

    async def _after_tool(
        self,
        run: RunControl,
        turn_id: str,
        item: BatchCall,
        args: dict[str, Any],
        result: messages_pb2.ToolResult,
        is_error: bool,
        replayed: bool,
    ) -> tuple[messages_pb2.ToolResult, bool]:
        event = AfterToolEvent(
            lane_id=self.lane_id,
            operation_id=run.operation_id,
            turn_id=turn_id,
            tool_call_id=item.tool_call_id,
            tool_name=item.tool_name,
            args=args,
            content=tuple(result.content),
            details=json.loads(result.details_json) if result.HasField("details_json") else None,
            is_error=is_error,
            usage=result.usage if result.HasField("usage") else None,
            terminate=result.terminate,
            replayed=replayed,
        )
        for hook in self.hooks.after_tool:
            if run.cancelled:
                break  # after_tool is skipped once an abort began
            try:
                patch = await _maybe_await(hook(event))
            except Exception as err:
                text = f"after_tool hook failed: {err or type(err).__name__}"
                return messages_pb2.ToolResult(content=[_text_block(text)]), True
            if isinstance(patch, AfterToolPatch):
                event = _patched(event, patch)
        patched = messages_pb2.ToolResult(
            content=event.content,
            added_tool_names=result.added_tool_names,
            terminate=event.terminate,
        )
        if event.details is not None:
            patched.details_json = json.dumps(event.details)
        if event.usage is not None:
            patched.usage.CopyFrom(event.usage)
        return patched, event.is_error


def _patched(event: AfterToolEvent, patch: AfterToolPatch) -> AfterToolEvent:
    changes: dict[str, Any] = {}
    if patch.content is not KEEP:
        content, _ = to_result_proto(ToolResult(content=patch.content))
        changes["content"] = tuple(content.content)
    if patch.details is not KEEP:
        changes["details"] = patch.details
    if patch.is_error is not KEEP:
        changes["is_error"] = bool(patch.is_error)
    if patch.usage is not KEEP:
        changes["usage"] = patch.usage
    if patch.terminate is not KEEP:
        changes["terminate"] = bool(patch.terminate)
    return replace(event, **changes)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to raise for a failed batch: a lost lease first, else the first failure."""
    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        else:
            leaves.append(error)

    collect(group)
    for error in leaves:
        if isinstance(error, LeaseLost):
            return error
    return leaves[0]
