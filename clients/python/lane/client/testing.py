"""Lane lifecycles in one line per step, for tests and benchmarks.

The service's commands each need the lane id, the operation id and the lease token; a script
keeps them so a test names only what it is about::

    lane = await LaneScript.create(stub)
    run = await lane.start_run("go", driver_id="d1", lease_seconds=30)
    turn = await run.turn("calling", tool_calls=["c1", ("c2", "shell", {"cmd": "ls"})])
    call = await turn.call("c1").start().progress("halfway").stage("done")
    assert call.staged is not None and call.staged.batch_complete
    await run.end()

Each step is one unary RPC on the stub given (so a refusal raises ``grpc.aio.AioRpcError``,
as the plain call would) and returns the response; nothing is retried and no request id is
sent. It lives in the client package, not among the tests, so benchmarks use it without
depending on the test suite.

A request a test sends itself (to a lane in a given state, with a wrong id, or mutated by a
fuzzer) is built by an :class:`Aim`, which holds the ids it names::

    request = run.aim.request(pb.EndRunRequest, status=COMPLETED)
    wrong = replace(run.aim, operation_id="op-wrong").request(pb.StartTurnRequest)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from google.protobuf.message import Message
from lane.v1 import entries_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

if TYPE_CHECKING:
    from lane.v1.lane_service_pb2_grpc import LaneServiceAsyncStub

__all__ = [
    "Aim",
    "CallScript",
    "LaneScript",
    "RunScript",
    "ToolCallSpec",
    "TurnScript",
    "assistant",
    "new_lane_id",
    "result",
    "text",
    "tool_call",
    "user",
]

#: A tool call a turn asks for: its id alone (tool ``t``, no arguments), or (id, tool name,
#: arguments as a dict or as JSON text kept verbatim).
ToolCallSpec = str | tuple[str, str, Mapping[str, Any] | str]


def new_lane_id(prefix: str = "lane") -> str:
    """A lane id no other run of the tests or benchmarks uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def text(value: str) -> messages_pb2.ContentBlock:
    """A text content block."""
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=value))


def user(value: str) -> messages_pb2.AgentMessage:
    """A user message with one text block."""
    return messages_pb2.AgentMessage(user=messages_pb2.UserMessage(content=[text(value)]))


def tool_call(call_id: str, name: str, args: Mapping[str, Any] | str) -> messages_pb2.ContentBlock:
    """A tool-call block (``args`` as JSON text is sent byte for byte)."""
    arguments = args if isinstance(args, str) else json.dumps(args)
    return messages_pb2.ContentBlock(
        tool_call=messages_pb2.ToolCallContent(id=call_id, name=name, arguments_json=arguments)
    )


def assistant(
    *blocks: messages_pb2.ContentBlock,
    stop: messages_pb2.StopReason.ValueType = messages_pb2.STOP_REASON_TOOL_USE,
    usage: messages_pb2.Usage | None = None,
) -> messages_pb2.AssistantMessage:
    """A settled assistant message from the scripted model ``m1``."""
    message = messages_pb2.AssistantMessage(
        content=blocks, api="test", provider="scripted", model="m1", stop_reason=stop
    )
    if usage is not None:
        message.usage.CopyFrom(usage)
    return message


def result(value: str, **fields: Any) -> messages_pb2.ToolResult:
    """A tool result with one text block (``fields``: the others, e.g. ``details_json``)."""
    return messages_pb2.ToolResult(content=[text(value)], **fields)


def _block(spec: ToolCallSpec) -> messages_pb2.ContentBlock:
    if isinstance(spec, str):
        return tool_call(spec, "t", {})
    return tool_call(*spec)


RequestT = TypeVar("RequestT", bound=Message)

#: Id fields that name a new id the caller chooses rather than one it aims at: never filled
#: from an :class:`Aim` (a run's own operation id would make StartRun collide with it).
_CHOSEN_IDS: dict[str, frozenset[str]] = {
    "StartRunRequest": frozenset({"operation_id"}),
    "StartCompactionRequest": frozenset({"operation_id"}),
    "StartTurnRequest": frozenset({"turn_id"}),
}


@dataclass(frozen=True)
class Aim:
    """The ids a command names, to build its request without sending it. Empty ids are
    proto3's unset; ``dataclasses.replace`` aims it elsewhere (a wrong operation, a call)."""

    lane_id: str
    operation_id: str = ""
    #: 0 for a run no driver leased.
    lease_token: int = 0
    turn_id: str = ""
    tool_call_id: str = ""
    request_id: str = ""

    def request(self, request_type: type[RequestT], **fields: Any) -> RequestT:
        """A ``request_type`` carrying the ids it has fields for (but those it chooses, see
        ``_CHOSEN_IDS``), then ``fields``, which win (``operation_id=""`` leaves it out)."""
        declared = request_type.DESCRIPTOR.fields_by_name
        chosen = _CHOSEN_IDS.get(request_type.DESCRIPTOR.name, frozenset())
        ids = {k: v for k, v in asdict(self).items() if k in declared and k not in chosen}
        # The protobuf stubs type Message() without keyword arguments; each message takes them.
        return cast(RequestT, cast(Any, request_type)(**(ids | fields)))


@dataclass
class LaneScript:
    """One lane, created by :meth:`create`; runs start from here."""

    stub: LaneServiceAsyncStub
    lane_id: str

    @classmethod
    async def create(
        cls,
        stub: LaneServiceAsyncStub,
        lane_id: str | None = None,
        *,
        prefix: str = "lane",
        configuration: snapshot_pb2.LaneConfiguration | None = None,
    ) -> LaneScript:
        """CreateLane ``lane_id`` (default: a new id starting with ``prefix``)."""
        script = cls(stub, lane_id or new_lane_id(prefix))
        await stub.CreateLane(
            pb.CreateLaneRequest(lane_id=script.lane_id, configuration=configuration)
        )
        return script

    async def start_run(
        self,
        *prompt: str | messages_pb2.AgentMessage,
        driver_id: str = "",
        lease_seconds: int = 0,
        settings: pb.RunSettings | None = None,
    ) -> RunScript:
        """StartRun with ``prompt`` (strings are user messages); leased to ``driver_id`` when
        one is given."""
        messages = [user(p) if isinstance(p, str) else p for p in prompt]
        started = await self.stub.StartRun(
            pb.StartRunRequest(
                lane_id=self.lane_id,
                prompt=messages,
                settings=settings,
                driver_id=driver_id,
                lease_seconds=lease_seconds,
            )
        )
        return RunScript(self, started.operation_id, started.lease.token, started)

    async def snapshot(self) -> snapshot_pb2.LaneSnapshot:
        """GetLaneSnapshot."""
        answer = await self.stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=self.lane_id))
        return answer.snapshot

    async def enqueue(
        self,
        item: str | messages_pb2.AgentMessage | entries_pb2.CustomEntry,
        kind: snapshot_pb2.QueueKind.ValueType = snapshot_pb2.QUEUE_KIND_FOLLOW_UP,
        *,
        request_id: str = "",
    ) -> pb.EnqueueMessageResponse:
        """EnqueueMessage: ``item`` (a string is a user message, a custom entry is written as
        it is) into the ``kind`` queue, under ``request_id`` when one is given."""
        aim = Aim(self.lane_id, request_id=request_id)
        if isinstance(item, entries_pb2.CustomEntry):
            request = aim.request(pb.EnqueueMessageRequest, kind=kind, custom=item)
        else:
            message = user(item) if isinstance(item, str) else item
            request = aim.request(pb.EnqueueMessageRequest, kind=kind, message=message)
        return await self.stub.EnqueueMessage(request)


@dataclass
class RunScript:
    """An open run of a :class:`LaneScript`; its commands carry its lease token."""

    lane: LaneScript
    operation_id: str
    #: 0 for a run no driver leased.
    lease_token: int
    started: pb.StartRunResponse

    @property
    def stub(self) -> LaneServiceAsyncStub:
        """The stub every step is sent on."""
        return self.lane.stub

    @property
    def aim(self) -> Aim:
        """The run's ids (lane, operation, lease token), for requests sent by hand."""
        return Aim(self.lane.lane_id, self.operation_id, self.lease_token)

    async def turn(
        self,
        text_value: str = "",
        *,
        tool_calls: Sequence[ToolCallSpec] = (),
        stop: messages_pb2.StopReason.ValueType | None = None,
        usage: messages_pb2.Usage | None = None,
        message: messages_pb2.AssistantMessage | None = None,
    ) -> TurnScript:
        """StartTurn, then SettleAssistantMessage (see :meth:`settle`)."""
        turn_id = await self.start_turn()
        return await self.settle(
            turn_id, text_value, tool_calls=tool_calls, stop=stop, usage=usage, message=message
        )

    async def start_turn(self) -> str:
        """StartTurn alone (the turn stays open, awaiting its message); returns its id."""
        started = await self.stub.StartTurn(self.aim.request(pb.StartTurnRequest))
        return started.turn_id

    async def settle(
        self,
        turn_id: str,
        text_value: str = "",
        *,
        tool_calls: Sequence[ToolCallSpec] = (),
        stop: messages_pb2.StopReason.ValueType | None = None,
        usage: messages_pb2.Usage | None = None,
        message: messages_pb2.AssistantMessage | None = None,
    ) -> TurnScript:
        """SettleAssistantMessage for ``turn_id``: ``text_value`` and ``tool_calls`` (stop
        reason TOOL_USE when there are calls, else STOP), or ``message`` as it is."""
        if message is None:
            blocks = ([text(text_value)] if text_value else []) + [_block(c) for c in tool_calls]
            if stop is None:
                stop = (
                    messages_pb2.STOP_REASON_TOOL_USE
                    if tool_calls
                    else messages_pb2.STOP_REASON_STOP
                )
            message = assistant(*blocks, stop=stop, usage=usage)
        settled = await self.stub.SettleAssistantMessage(
            replace(self.aim, turn_id=turn_id).request(
                pb.SettleAssistantMessageRequest, message=message
            )
        )
        return TurnScript(self, turn_id, settled)

    def call(self, call_id: str) -> CallScript:
        """The steps of one call of the run's open batch (run them with ``await``)."""
        return CallScript(self, call_id)

    async def end(
        self,
        status: snapshot_pb2.OperationResultStatus.ValueType = (
            snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
        ),
        error: snapshot_pb2.OperationError | None = None,
    ) -> pb.EndRunResponse:
        """EndRun with ``status`` (and ``error``, for a failed run)."""
        return await self.stub.EndRun(
            self.aim.request(pb.EndRunRequest, status=status, error=error)
        )

    async def abort(self) -> pb.AbortOperationResponse:
        """AbortOperation (as a watcher would: the request has no lease token)."""
        return await self.stub.AbortOperation(self.aim.request(pb.AbortOperationRequest))

    async def release(self) -> pb.ReleaseLeaseResponse:
        """ReleaseLease: the run stays open for another driver."""
        return await self.stub.ReleaseLease(self.aim.request(pb.ReleaseLeaseRequest))


@dataclass
class TurnScript:
    """A settled turn of a :class:`RunScript`."""

    run: RunScript
    turn_id: str
    settled: pb.SettleAssistantMessageResponse

    def call(self, call_id: str) -> CallScript:
        """The steps of one of the turn's tool calls (run them with ``await``)."""
        return self.run.call(call_id)


@dataclass
class CallScript:
    """One tool call's steps, queued by :meth:`start`, :meth:`progress`, :meth:`stage` and
    :meth:`synthetic`, sent in that order on ``await`` (which returns the script, its responses
    filled in). Awaited again, it sends only the steps queued since."""

    run: RunScript
    call_id: str
    #: StartToolCall's response, once sent.
    intent: pb.StartToolCallResponse | None = None
    #: UpdateToolCall's responses, in order.
    updates: list[pb.UpdateToolCallResponse] = field(default_factory=list)
    #: StageToolOutcome's response, once sent.
    staged: pb.StageToolOutcomeResponse | None = None
    _queued: list[Any] = field(default_factory=list, init=False, repr=False)

    @property
    def aim(self) -> Aim:
        """The call's ids (the run's, and the call id)."""
        return replace(self.run.aim, tool_call_id=self.call_id)

    def start(
        self,
        arguments: Mapping[str, Any] | str = "{}",
        *,
        replay: pb.ReplayPolicy.ValueType = pb.REPLAY_POLICY_NEVER,
    ) -> Self:
        """StartToolCall: the intent, with the effective ``arguments``."""
        arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments)
        request = self.aim.request(
            pb.StartToolCallRequest, arguments_json=arguments_json, replay=replay
        )
        self._queued.append(request)
        return self

    def progress(self, text_value: str, *, checkpoint: bool = False, **fields: Any) -> Self:
        """UpdateToolCall: a partial result (``fields``: more of the ToolResult's)."""
        request = self.aim.request(
            pb.UpdateToolCallRequest,
            partial_result=result(text_value, **fields),
            checkpoint=checkpoint,
        )
        self._queued.append(request)
        return self

    def stage(self, text_value: str, *, is_error: bool = False, **fields: Any) -> Self:
        """StageToolOutcome: the executed result (placed when the batch's order allows)."""
        outcome = pb.ExecutedOutcome(result=result(text_value, **fields), is_error=is_error)
        self._queued.append(self.aim.request(pb.StageToolOutcomeRequest, executed=outcome))
        return self

    def synthetic(self, cause: pb.SyntheticCause.ValueType) -> Self:
        """StageToolOutcome: a result the service writes for ``cause`` (unknown tool, ...)."""
        outcome = pb.SyntheticOutcome(cause=cause)
        self._queued.append(self.aim.request(pb.StageToolOutcomeRequest, synthetic=outcome))
        return self

    async def _send(self) -> Self:
        stub = self.run.stub
        while self._queued:
            request = self._queued.pop(0)
            if isinstance(request, pb.StartToolCallRequest):
                self.intent = await stub.StartToolCall(request)
            elif isinstance(request, pb.UpdateToolCallRequest):
                self.updates.append(await stub.UpdateToolCall(request))
            else:
                self.staged = await stub.StageToolOutcome(request)
        return self

    def __await__(self) -> Generator[Any, None, Self]:
        return self._send().__await__()
