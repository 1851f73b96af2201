"""An async client of the lane service with typed methods.

::

    async with LaneClient("127.0.0.1:50051", token=os.environ.get("LANE_TOKEN")) as lanes:
        await lanes.create_lane("lane-1")
        started = await lanes.start_run("lane-1", "Hello", driver_id="worker-7")
        turn = await lanes.start_turn("lane-1", started.operation_id)
        ...
        async for view in lanes.watch("lane-1"):
            print(view.snapshot.revision)

Each method sends one command, as :func:`lane.client.commands.call` does: a fresh request id
(kept across retries, so a command whose answer was lost commits once), retries of
UNAVAILABLE, DEADLINE_EXCEEDED and ``DATABASE_BUSY`` paced by the client's
:class:`~lane.client.retry.RetryPolicy`, each attempt bounded by ``timeout`` seconds. A
refusal raises its :class:`~lane.client.errors.LaneError` subclass (:class:`StaleLease`,
:class:`LeaseHeld`, ...).

Lease tokens are handled: the token of a run this client leased (``start_run`` or
``acquire_operation`` with a ``driver_id``) goes on every later command of that run that
carries none, until the run ends, the lease is released, or the service says the token is
stale.

``LaneClient(..., session=True)`` sends every command (reads included) over one DriveLane
stream instead of a unary RPC each: a :class:`~lane.client.session.LaneSession`, opened by the
first command and closed with the client. The answers and refusals are the unary RPCs' (the
service serves each command of the stream with the unary handler); a session costs the
service less per command and lets commands be in flight together.

To drive runs with tools and a model, hand the client to :class:`~lane.client.driver.Driver`
(``Driver(client, lane_id, tools)``); it does all of the above over a DriveLane session (the
client's own, when it has one).

Failing fast: the first command (or watch, or driven run) waits for the service to answer a
health check, at most ``connect_timeout`` seconds (5 by default, as the ``lane`` command's
``--connect-timeout``), and otherwise raises :class:`~lane.client.reach.Unreachable` naming
the target, the cause (connection refused, unknown host, TLS against a plaintext service or
the reverse, an untrusted certificate) and the fix. A token the service refuses raises
:class:`~lane.client.errors.Unauthenticated` at the first command, saying how to pass one.
Once the service answered, a connection that drops is ridden out by the retry policy; when it
gives up, the error is an :class:`~lane.client.reach.Unreachable` too, saying how many
attempts it made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from lane.client.commands import call as unary_call
from lane.client.connect import CONNECT_TIMEOUT_SECONDS, open_channel
from lane.client.errors import LaneError, StaleLease
from lane.client.model import user_message
from lane.client.reach import SDK, explained, normalize_target, probe, scheme_problem
from lane.client.retry import COMMAND_RETRY, RetryPolicy
from lane.client.session import LaneSession
from lane.client.watch import LaneView, watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

__all__ = ["LaneClient"]

Resp = TypeVar("Resp", bound=Message)

#: The service's own default port, so a bare host works.
DEFAULT_TARGET = "127.0.0.1:50051"

Prompt = str | messages_pb2.AgentMessage | Sequence[messages_pb2.AgentMessage]


def _messages(prompt: Prompt) -> list[messages_pb2.AgentMessage]:
    if isinstance(prompt, str):
        return [user_message(prompt)]
    if isinstance(prompt, messages_pb2.AgentMessage):
        return [prompt]
    return list(prompt)


class LaneClient:
    """The lane service's commands as typed async methods (see the module doc).

    ``target`` (``HOST:PORT``; no port: 50051; default ``127.0.0.1:50051``) and
    ``token``/``credentials`` open a channel of the client's own
    (:func:`~lane.client.connect.open_channel`), closed by :meth:`aclose` or ``async with``;
    pass ``channel`` instead to share one (it is left open; ``target``, ``token`` and
    ``credentials`` then only describe it in messages). ``retry`` paces and bounds the retries of
    every method; ``timeout`` bounds each attempt (None: no bound). ``session``: send the
    commands over one DriveLane stream (see the module doc) instead of unary RPCs.
    ``connect_timeout``: how long the first call waits for the service (None: no check).

    A target written as a URL (``http://...``) raises ValueError: gRPC would read the scheme
    as a host name.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel: grpc.aio.Channel | None = None,
        retry: RetryPolicy = COMMAND_RETRY,
        timeout: float | None = 30.0,
        session: bool = False,
        connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        if target is None and channel is None:
            target = DEFAULT_TARGET
        problem = scheme_problem(target or "", SDK)
        if problem is not None:
            raise ValueError(problem)
        #: The service's address, as messages name it ("" for a channel given without it).
        self.target = normalize_target(target or "")
        self.connect_timeout = connect_timeout
        self._tls = credentials is not None
        self._token = bool(token)
        self._reached = False
        self._reaching = asyncio.Lock()
        self._owned = channel is None
        self._channel = (
            channel
            if channel is not None
            else open_channel(self.target, credentials=credentials, token=token)
        )
        self.stub = lane_service_pb2_grpc.LaneServiceStub(self._channel)
        self.retry = retry
        self.timeout = timeout
        #: The DriveLane session the commands go over (None: each is its unary RPC).
        self.session = (
            LaneSession(self.stub, retry=retry, attempt_timeout=timeout) if session else None
        )
        #: Lease tokens of runs this client leased: (lane id, operation id) → token.
        self._leases: dict[tuple[str, str], int] = {}

    async def __aenter__(self) -> LaneClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session, if any, and the channel if the client opened it."""
        if self.session is not None:
            await self.session.aclose()
        if self._owned:
            await self._channel.close()

    def lease_token(self, lane_id: str, operation_id: str) -> int | None:
        """The token this client holds for the run, if it leased it."""
        return self._leases.get((lane_id, operation_id))

    async def ready(self) -> None:
        """Wait until the service answers, at most ``connect_timeout`` seconds; raise
        :class:`~lane.client.reach.Unreachable` (the target, the cause, the fix) when it does
        not. Once it answered, this returns at once. Every command, :meth:`watch` and the
        :class:`~lane.client.driver.Driver` call it first."""
        if self._reached or self.connect_timeout is None:
            return
        async with self._reaching:
            if not self._reached:
                await probe(
                    self._channel,
                    self.target,
                    within=self.connect_timeout,
                    tls=self._tls,
                    wording=SDK,
                )
                self._reached = True

    def explained(self, error: LaneError) -> LaneError:
        """``error`` saying what to do about it (:func:`lane.client.reach.explained`: a
        transport failure as :class:`~lane.client.reach.Unreachable`, a refused token with how
        to pass one, a lane not found with a hint about namespaces when a token was given)."""
        return explained(error, self.target, tls=self._tls, wording=SDK, token=self._token)

    # -- any command -------------------------------------------------------------------------

    async def call(
        self,
        request: Message,
        *,
        retry: RetryPolicy | None = None,
        attempt_timeout: float | None = -1.0,
    ) -> Any:
        """Send ``request``, the request message of any unary LaneService RPC, and return the
        RPC's response (request id, lease token and retries as the typed methods do).
        ``retry`` and ``attempt_timeout`` replace the client's for this call."""
        method = _METHODS.get(request.DESCRIPTOR.full_name)
        if method is None:
            raise TypeError(f"{request.DESCRIPTOR.name} is not a LaneService unary request")
        key = self._run_of(request)
        fields = request.DESCRIPTOR.fields_by_name
        if key is not None and "lease_token" in fields and not getattr(request, "lease_token"):  # noqa: B009
            token = self._leases.get(key)
            if token is not None:
                setattr(request, "lease_token", token)  # noqa: B010
        policy = self.retry if retry is None else retry
        timeout = self.timeout if attempt_timeout == -1.0 else attempt_timeout
        await self.ready()
        try:
            if self.session is not None:
                response = await self.session.call(request, retry=policy, attempt_timeout=timeout)
            else:
                response = await unary_call(
                    getattr(self.stub, method), request, retry=policy, attempt_timeout=timeout
                )
        except StaleLease:
            if key is not None:
                self._leases.pop(key, None)
            raise
        except LaneError as err:
            better = self.explained(err)
            if better is err:
                raise
            raise better from err
        self._learn(method, request, response, key)
        return response

    def _run_of(self, request: Message) -> tuple[str, str] | None:
        fields = request.DESCRIPTOR.fields_by_name
        if "lane_id" not in fields or "operation_id" not in fields:
            return None
        return (getattr(request, "lane_id"), getattr(request, "operation_id"))  # noqa: B009

    def _learn(
        self, method: str, request: Message, response: Message, key: tuple[str, str] | None
    ) -> None:
        """Keep the lease a response grants; forget it once the run ends or lets it go."""
        if method == "StartRun" and isinstance(response, pb.StartRunResponse):
            key = (getattr(request, "lane_id"), response.operation_id)  # noqa: B009
        if key is None:
            return
        if method in ("EndRun", "ReleaseLease"):
            self._leases.pop(key, None)
            return
        has_lease = "lease" in response.DESCRIPTOR.fields_by_name and response.HasField("lease")
        if has_lease:
            self._leases[key] = getattr(response, "lease").token  # noqa: B009

    # -- lanes -------------------------------------------------------------------------------

    async def create_lane(
        self, lane_id: str, *, configuration: snapshot_pb2.LaneConfiguration | None = None
    ) -> pb.CreateLaneResponse:
        """Create ``lane_id`` (ALREADY_EXISTS-free: a retry returns the first answer)."""
        request = pb.CreateLaneRequest(lane_id=lane_id, configuration=configuration)
        response: pb.CreateLaneResponse = await self.call(request)
        return response

    async def snapshot(self, lane_id: str) -> snapshot_pb2.LaneSnapshot:
        """The lane now (GetLaneSnapshot; a lane over 4 MiB raises :class:`TooLarge`: watch
        it instead)."""
        response: pb.GetLaneSnapshotResponse = await self.call(
            pb.GetLaneSnapshotRequest(lane_id=lane_id)
        )
        return response.snapshot

    async def list_lanes(self, *, page_size: int = 0, page_token: str = "") -> pb.ListLanesResponse:
        """One page of the caller's lanes (``next_page_token`` names the next one)."""
        response: pb.ListLanesResponse = await self.call(
            pb.ListLanesRequest(page_size=page_size, page_token=page_token)
        )
        return response

    async def enqueue(
        self,
        lane_id: str,
        message: str | messages_pb2.AgentMessage,
        *,
        kind: snapshot_pb2.QueueKind.ValueType = snapshot_pb2.QUEUE_KIND_FOLLOW_UP,
    ) -> pb.EnqueueMessageResponse:
        """Queue a message in the lane's inbox (a string: a user message)."""
        (item,) = _messages(message)
        response: pb.EnqueueMessageResponse = await self.call(
            pb.EnqueueMessageRequest(lane_id=lane_id, kind=kind, message=item)
        )
        return response

    async def watch(self, lane_id: str, **options: Any) -> AsyncGenerator[LaneView, None]:
        """Follow the lane live: :func:`~lane.client.watch.watch_lane` on this client's
        channel (``options`` are its keyword arguments), after :meth:`ready`."""
        await self.ready()
        options.setdefault("target", self.target)
        try:
            async with contextlib.aclosing(watch_lane(self.stub, lane_id, **options)) as views:
                async for view in views:
                    yield view
        except LaneError as err:
            better = self.explained(err)
            if better is err:
                raise
            raise better from err

    # -- runs --------------------------------------------------------------------------------

    async def start_run(
        self,
        lane_id: str,
        prompt: Prompt = (),
        *,
        operation_id: str = "",
        settings: pb.RunSettings | None = None,
        driver_id: str = "",
        lease_seconds: int = 0,
    ) -> pb.StartRunResponse:
        """Open a run with ``prompt`` (a string: one user message); with ``driver_id`` the run
        is leased to it and its token kept for the run's later commands."""
        request = pb.StartRunRequest(
            lane_id=lane_id,
            operation_id=operation_id,
            prompt=_messages(prompt),
            settings=settings,
            driver_id=driver_id,
            lease_seconds=lease_seconds,
        )
        response: pb.StartRunResponse = await self.call(request)
        return response

    async def abort(self, lane_id: str, operation_id: str) -> pb.AbortOperationResponse:
        """Ask the open operation to stop (its driver winds it down)."""
        response: pb.AbortOperationResponse = await self.call(
            pb.AbortOperationRequest(lane_id=lane_id, operation_id=operation_id)
        )
        return response

    async def end_run(
        self,
        lane_id: str,
        operation_id: str,
        status: snapshot_pb2.OperationResultStatus.ValueType,
        *,
        error: snapshot_pb2.OperationError | None = None,
    ) -> pb.EndRunResponse:
        """End the run COMPLETED, ABORTED or FAILED (with ``error``)."""
        response: pb.EndRunResponse = await self.call(
            pb.EndRunRequest(lane_id=lane_id, operation_id=operation_id, status=status, error=error)
        )
        return response

    async def start_turn(
        self, lane_id: str, operation_id: str, *, turn_id: str = ""
    ) -> pb.StartTurnResponse:
        """Begin a turn (the model is asked next)."""
        response: pb.StartTurnResponse = await self.call(
            pb.StartTurnRequest(lane_id=lane_id, operation_id=operation_id, turn_id=turn_id)
        )
        return response

    async def settle_assistant_message(
        self,
        lane_id: str,
        operation_id: str,
        turn_id: str,
        message: messages_pb2.AssistantMessage,
    ) -> pb.SettleAssistantMessageResponse:
        """Commit the model's answer; its tool calls become the turn's batch."""
        response: pb.SettleAssistantMessageResponse = await self.call(
            pb.SettleAssistantMessageRequest(
                lane_id=lane_id, operation_id=operation_id, turn_id=turn_id, message=message
            )
        )
        return response

    # -- tool calls --------------------------------------------------------------------------

    async def start_tool_call(
        self,
        lane_id: str,
        operation_id: str,
        tool_call_id: str,
        arguments_json: str,
        *,
        replay: pb.ReplayPolicy.ValueType = pb.REPLAY_POLICY_NEVER,
    ) -> pb.StartToolCallResponse:
        """Commit a call's intent with its effective arguments (JSON text)."""
        response: pb.StartToolCallResponse = await self.call(
            pb.StartToolCallRequest(
                lane_id=lane_id,
                operation_id=operation_id,
                tool_call_id=tool_call_id,
                arguments_json=arguments_json,
                replay=replay,
            )
        )
        return response

    async def update_tool_call(
        self,
        lane_id: str,
        operation_id: str,
        tool_call_id: str,
        partial_result: messages_pb2.ToolResult,
        *,
        checkpoint: bool = False,
    ) -> pb.UpdateToolCallResponse:
        """Replace a running call's progress (``checkpoint``: also its recovery point)."""
        response: pb.UpdateToolCallResponse = await self.call(
            pb.UpdateToolCallRequest(
                lane_id=lane_id,
                operation_id=operation_id,
                tool_call_id=tool_call_id,
                partial_result=partial_result,
                checkpoint=checkpoint,
            )
        )
        return response

    async def stage_tool_outcome(
        self,
        lane_id: str,
        operation_id: str,
        tool_call_id: str,
        outcome: pb.ExecutedOutcome | pb.SyntheticOutcome,
    ) -> pb.StageToolOutcomeResponse:
        """Stage a call's final outcome; the service places the batch's ready prefix."""
        request = pb.StageToolOutcomeRequest(
            lane_id=lane_id, operation_id=operation_id, tool_call_id=tool_call_id
        )
        if isinstance(outcome, pb.ExecutedOutcome):
            request.executed.CopyFrom(outcome)
        else:
            request.synthetic.CopyFrom(outcome)
        response: pb.StageToolOutcomeResponse = await self.call(request)
        return response

    async def replay_tool_call(
        self, lane_id: str, operation_id: str, tool_call_id: str
    ) -> pb.ReplayToolCallResponse:
        """Execute a replay-safe call of a taken-over run again (its stored arguments)."""
        response: pb.ReplayToolCallResponse = await self.call(
            pb.ReplayToolCallRequest(
                lane_id=lane_id, operation_id=operation_id, tool_call_id=tool_call_id
            )
        )
        return response

    # -- ownership ---------------------------------------------------------------------------

    async def acquire_operation(
        self, lane_id: str, operation_id: str, *, driver_id: str, lease_seconds: int = 0
    ) -> pb.AcquireOperationResponse:
        """Take a run over (raises :class:`LeaseHeld` while another driver's lease is live);
        the new token is kept for the run's later commands."""
        response: pb.AcquireOperationResponse = await self.call(
            pb.AcquireOperationRequest(
                lane_id=lane_id,
                operation_id=operation_id,
                driver_id=driver_id,
                lease_seconds=lease_seconds,
            )
        )
        return response

    async def renew_lease(
        self, lane_id: str, operation_id: str, *, lease_seconds: int = 0
    ) -> pb.RenewLeaseResponse:
        """Extend this client's lease on the run."""
        response: pb.RenewLeaseResponse = await self.call(
            pb.RenewLeaseRequest(
                lane_id=lane_id, operation_id=operation_id, lease_seconds=lease_seconds
            )
        )
        return response

    async def release_lease(self, lane_id: str, operation_id: str) -> pb.ReleaseLeaseResponse:
        """Give the run up: another driver may acquire it at once."""
        response: pb.ReleaseLeaseResponse = await self.call(
            pb.ReleaseLeaseRequest(lane_id=lane_id, operation_id=operation_id)
        )
        return response

    async def get_operation(self, lane_id: str, operation_id: str) -> pb.OperationState:
        """The open run's durable state (raises :class:`OperationNotOpen` once it ended)."""
        response: pb.GetOperationResponse = await self.call(
            pb.GetOperationRequest(lane_id=lane_id, operation_id=operation_id)
        )
        return response.state


def _methods() -> dict[str, str]:
    """Request message full name → unary RPC name."""
    service = pb.DESCRIPTOR.services_by_name["LaneService"]
    return {
        method.input_type.full_name: method.name
        for method in service.methods
        if not method.client_streaming and not method.server_streaming
    }


_METHODS = _methods()
