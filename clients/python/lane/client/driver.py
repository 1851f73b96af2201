"""The driver SDK: run an agent on a lane, committing every step to the lane service.

::

    async with LaneClient("127.0.0.1:50051") as client:
        driver = Driver(client, "lane-1", [SHELL, READ_FILE], driver_id="worker-7")
        result = await driver.run("List the files.", model)   # a RunResult
        result = await driver.recover(operation_id, model)     # take a run over after a crash

A run: ``StartRun`` leased to this driver (the lease is renewed in the background and its
fencing token goes on every command), then turns until the model answers without tool calls,
then ``EndRun`` COMPLETED (FAILED, ``tool_use_without_calls``, when the model stops to use
tools but names none). Each turn: ``StartTurn``, the model is asked with the lane's durable
transcript, ``SettleAssistantMessage``; its tool calls form a batch, run as the tool
flow (docs/contract.md, Tool calls). The driver reads the lane from one WatchLane subscription
per run (the snapshot in chunks, then every commit folded in), so a turn costs no snapshot
read and a lane whose transcript is beyond GetLaneSnapshot's 4 MiB works as any other:

prepare
    the assistant stopped for length → TRUNCATED (also once the run is aborted: the service
    accepts no other outcome for such a call); the tool is unknown, or not among the lane's
    active tool names when its configuration names any → UNKNOWN_TOOL; the
    arguments fail the tool's JSON Schema → INVALID_ARGUMENTS (the validation message).
before_tool hooks
    may replace the arguments (validated again) or deny (DENIED, with the reason and the
    terminate flag); a hook that raises denies.
intent
    ``StartToolCall`` with the effective arguments and the tool's replay policy.
execute
    the tool runs; its ``progress``/``checkpoint`` calls are ``UpdateToolCall`` commands; a tool
    that raises gives an error result (text = the exception's message).
after_tool hooks
    may patch content, details, is_error, usage, terminate; skipped once an abort began.
stage
    ``StageToolOutcome``; the service places the ready source-order prefix.

Parallel batches (the default) start their calls one after another in source order and let them
run and settle in any order; sequential batches (``RunSettings.tool_execution``) run one call
at a time. After a batch whose every call asked to terminate the run completes; otherwise the
next turn starts.

Abort: whoever calls ``AbortOperation`` (``lane abort``, Escape in ``lane watch``,
:meth:`Driver.abort`), the driver sees it in a command's answer (``cancel_requested``), a
lease renewal, or the lane's watch (the run's ``operation_abort``). From then on it
starts nothing new: planned calls get CANCELLED results, running tools see
``ToolContext.abort_signal`` and finish with their real result (or, after
``abort_grace_seconds``, are cancelled and get an INTERRUPTED result), after_tool hooks are
skipped, and the run ends ABORTED.

Every mutating command carries a request id and is retried with the same id on UNAVAILABLE,
DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED ``DATABASE_BUSY`` (:mod:`lane.client.commands`). A
refusal with ABORTED ``STALE_LEASE`` means another driver took the run over: :class:`LeaseLost`
is raised and nothing more is committed.

Commands travel over one DriveLane stream per run (:class:`~lane.client.session.LaneSession`:
the same answers and refusals as the unary RPCs, for less service CPU; a broken stream
is replaced and its unanswered commands sent again with their request ids). ``Driver(...,
session=False)`` sends each command as its unary RPC instead; ``session=`` a
:class:`~lane.client.session.LaneSession` of your own shares it (it is not closed by the
driver). A :class:`~lane.client.lane_client.LaneClient` made with ``session=True`` lends the
driver its session. WatchLane (the lane's watch) is its own stream either way.

Recovery (:meth:`Driver.recover`): ``AcquireOperation`` (waiting for a live lease of a dead
driver to lapse), then the open batch is finished: effect_pending calls of tools declared
``replay="safe"`` are replayed (``ReplayToolCall``, executed again, after_tool, staged),
other effect_pending calls get an INTERRUPTED result (their latest checkpoint plus a notice),
planned calls run the ordinary flow; then the run continues as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast

import grpc
from google.protobuf.message import Message
from lane.client.commands import call
from lane.client.errors import (
    LaneError,
    LeaseHeld,
    OperationCancelled,
    OperationNotOpen,
    StaleLease,
    TooManyWatchers,
    reason_name,
)
from lane.client.hooks import Hooks
from lane.client.lane_client import LaneClient
from lane.client.model import Model, ModelError, ModelRequest, user_message
from lane.client.session import LaneSession
from lane.client.streaming import DEFAULT_INTERVAL, PartialCommits
from lane.client.toolflow import BatchCall, LeaseLost, RunControl, ToolFlow
from lane.client.tools import Tool
from lane.client.watch import RetryPolicy, watch_lane
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, reasons_pb2, snapshot_pb2

__all__ = [
    "MAX_RETRY_AFTER_SECONDS",
    "MODEL_RETRY",
    "Driver",
    "DriverError",
    "LeaseLost",
    "RunResult",
]

_log = logging.getLogger(__name__)

Resp = TypeVar("Resp")
Req = TypeVar("Req", bound=Message)

Status: TypeAlias = snapshot_pb2.OperationResultStatus.ValueType


class DriverError(Exception):
    """The driver cannot go on (no model to continue a recovered run, a broken batch, ...)."""


@dataclass(frozen=True)
class RunResult:
    """How a driven run ended."""

    operation_id: str
    #: COMPLETED, ABORTED or FAILED.
    status: Status
    #: The service's record of the ended run.
    result: snapshot_pb2.OperationResult
    #: Turns this driver took.
    turns: int

    @property
    def status_name(self) -> str:
        """``completed``, ``aborted``, ``failed``, ..."""
        name = snapshot_pb2.OperationResultStatus.Name(self.status)
        return name.removeprefix("OPERATION_RESULT_STATUS_").lower()


class _ModelFailed(Exception):
    """The model raised, or answered with an error stop reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _RetryModel(Exception):
    """The model failed in a way worth asking again (a retryable :class:`ModelError`)."""

    def __init__(self, error: ModelError) -> None:
        super().__init__(error.message)
        self.error = error


#: Retries of a failed model call: 1 s, 2 s, 4 s, 8 s (up to 30 s) unless the provider says how
#: long to wait; 4 retries, so 5 attempts in all.
MODEL_RETRY = RetryPolicy(initial_backoff=1.0, max_backoff=30.0, jitter=0.2, max_attempts=4)

#: The longest wait a provider's Retry-After may ask for: a longer one fails the run with the
#: provider's message instead (a quota reset hours away is not worth an agent waiting for).
MAX_RETRY_AFTER_SECONDS = 60.0


def _active_tools(snapshot: snapshot_pb2.LaneSnapshot) -> frozenset[str] | None:
    """The lane's active tool names; None when the lane names none (every tool is active)."""
    names = frozenset(snapshot.configuration.active_tool_names)
    return names or None


#: The watch's backoff: capped like a command's retries (a turn waits for the watch).
#: A unary answer over one message: the driver reads it over DriveLane instead.
_ANSWER_TOO_LARGE = reason_name(reasons_pb2.REASON_ANSWER_TOO_LARGE)
_WATCH_RETRY = RetryPolicy(initial_backoff=0.1, max_backoff=2.0)


class _LaneFollower:
    """The lane as one WatchLane subscription shows it (:func:`~lane.client.watch.watch_lane`:
    a snapshot sent in chunks, then every commit folded in, resumed after failures): the
    transcript and configuration a turn asks the model with, and the run's abort.

    One subscription per run instead of a GetLaneSnapshot per turn: a snapshot is refused once
    the lane is over 4 MiB, a watch is not, and a turn reads the lane without a round trip.
    """

    def __init__(self, stub: Any, lane_id: str) -> None:
        self._stub = stub
        self.lane_id = lane_id
        self._snapshot: snapshot_pb2.LaneSnapshot | None = None
        self._failure: Exception | None = None
        #: Set (and replaced) whenever the snapshot or the failure changes.
        self._changed = asyncio.Event()

    def _update(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self, run: RunControl, watch_abort: bool) -> None:
        """Follow the lane until cancelled; with ``watch_abort``, mark ``run`` cancelled once
        the lane shows its abort. A lane too busy to watch now (TOO_MANY_WATCHERS) is tried
        again; any other failure the watch does not recover from is kept for :meth:`at`."""
        while True:
            try:
                async for view in watch_lane(
                    self._stub,
                    self.lane_id,
                    snapshot=self._snapshot,
                    retry=_WATCH_RETRY,
                    connect_timeout=None,  # the run's commands reached the service: ride out
                ):
                    self._snapshot = view.snapshot
                    operation = view.snapshot.operation
                    if (
                        watch_abort
                        and operation.id == run.operation_id
                        and operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING
                    ):
                        run.mark_cancelled("lane watch")
                    self._update()
            except Exception as err:  # kept for at(), which raises it
                if not isinstance(err, TooManyWatchers):
                    _log.warning("lane %s: the watch failed: %s", self.lane_id, err)
                    self._failure = err
                    self._update()
                    return
            await asyncio.sleep(1.0)

    async def at(self, revision: int) -> snapshot_pb2.LaneSnapshot:
        """The lane at ``revision`` or later (read-only: the watch's own snapshot)."""
        while True:
            snapshot = self._snapshot
            if snapshot is not None and snapshot.revision >= revision:
                return snapshot
            if self._failure is not None:
                raise DriverError(f"cannot follow lane {self.lane_id}: {self._failure}")
            await self._changed.wait()


async def _capture(stub: Any, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    """The lane now, from the first view of a watch (however large its transcript)."""
    async with contextlib.aclosing(watch_lane(stub, lane_id, connect_timeout=None)) as views:
        async for view in views:
            return view.snapshot
    raise DriverError(f"the watch of lane {lane_id} ended without a snapshot")


def _default_driver_id() -> str:
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Driver:
    """Drives runs of one lane with a set of tools (see the module doc).

    ``client`` is the :class:`~lane.client.lane_client.LaneClient` whose channel the driver
    talks over (left open: the client's to close). A generated ``LaneServiceStub`` is still
    accepted in its place (deprecated: pass the client).
    ``lease_seconds`` is the lease length (renewed every third of it). ``settings`` are the
    run settings of new runs (parallel tool execution by default). ``max_turns`` bounds a run
    (it then ends FAILED ``max_turns``). ``abort_grace_seconds``: after an abort, how long a
    running tool may take to finish before it is cancelled and gets an INTERRUPTED result
    (None: wait for it). ``retry_seconds``: how long a command is retried while the service is
    unavailable. ``watch_abort``: see an abort at once in the lane's watch (else it is
    seen at the next command or lease renewal). ``model`` is the default model of
    :meth:`run` and :meth:`recover`. ``stream_interval``: the least time between two commits
    of a streaming model's partials. ``model_retry``: how a retryable model error is retried
    (its ``max_attempts`` retries at most; :data:`MODEL_RETRY` by default).
    ``max_retry_after``: the longest Retry-After of a provider the driver waits for (a longer
    one fails the run with the provider's message; :data:`MAX_RETRY_AFTER_SECONDS`).
    ``session``: send the commands of each run over one DriveLane stream (True, the default),
    as unary RPCs (False), or over the given :class:`~lane.client.session.LaneSession` (see the
    module doc).

    With a :class:`~lane.client.lane_client.LaneClient`, :meth:`run` and :meth:`recover` first
    wait for the service (:meth:`LaneClient.ready`: an unreachable service fails within its
    connect timeout, saying why), and their errors say what to do
    (:meth:`LaneClient.explained`): a refused token how to pass one, a busy lane
    (:class:`~lane.client.errors.LaneBusy`) how to free it.
    """

    def __init__(
        self,
        client: LaneClient | Any,
        lane_id: str,
        tools: Sequence[Tool] = (),
        *,
        driver_id: str | None = None,
        lease_seconds: int = 30,
        hooks: Hooks | None = None,
        settings: pb.RunSettings | None = None,
        max_turns: int = 50,
        abort_grace_seconds: float | None = None,
        retry_seconds: float = 30.0,
        watch_abort: bool = True,
        model: Model | None = None,
        session: bool | LaneSession = True,
        stream_interval: float = DEFAULT_INTERVAL,
        model_retry: RetryPolicy = MODEL_RETRY,
        max_retry_after: float = MAX_RETRY_AFTER_SECONDS,
    ) -> None:
        if not 1 <= lease_seconds <= 3600:
            raise ValueError("lease_seconds must be between 1 and 3600")
        self._client: LaneClient | None = None
        if isinstance(client, LaneClient):
            self._client = client
            stub = client.stub
            if session is True and client.session is not None:
                session = client.session
        else:
            stub = client
        self._stub = stub
        self.lane_id = lane_id
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name}")
            self.tools[tool.name] = tool
        self.driver_id = driver_id or _default_driver_id()
        self.lease_seconds = lease_seconds
        self.hooks = hooks or Hooks()
        self.settings = settings or pb.RunSettings()
        self.max_turns = max_turns
        self.abort_grace_seconds = abort_grace_seconds
        self.retry_seconds = retry_seconds
        self.watch_abort = watch_abort
        self.model = model
        self.session = session
        self.stream_interval = stream_interval
        self.model_retry = model_retry
        self.max_retry_after = max_retry_after
        #: The session the commands go through now (None: unary RPCs).
        self._session: LaneSession | None = None
        self._run: RunControl | None = None
        #: The lane as the current run's watch shows it.
        self._lane = _LaneFollower(stub, lane_id)
        self._flow = ToolFlow(
            stub=stub,
            lane_id=lane_id,
            tools=self.tools,
            hooks=self.hooks,
            abort_grace_seconds=abort_grace_seconds,
            command=self._call,
        )

    # -- public ------------------------------------------------------------------------------

    @property
    def operation_id(self) -> str | None:
        """The run this driver holds now, if any."""
        return self._run.operation_id if self._run is not None else None

    async def run(
        self,
        prompt: str | messages_pb2.AgentMessage | Sequence[messages_pb2.AgentMessage],
        model: Model | None = None,
        *,
        operation_id: str = "",
    ) -> RunResult:
        """Start a run with ``prompt`` (the lane is created if needed) and drive it to its end.

        Raises :class:`LeaseLost` if another driver takes the run over, and
        :class:`~lane.client.errors.LaneError` when the service refuses or stays unreachable.
        """
        chosen = self._model(model)
        if self._run is not None:
            raise DriverError(f"this driver already drives operation {self._run.operation_id}")
        if isinstance(prompt, str):
            messages = [user_message(prompt)]
        elif isinstance(prompt, messages_pb2.AgentMessage):
            messages = [prompt]
        else:
            messages = list(prompt)
        async with self._explaining(), self._commands():
            await self._call(self._stub.CreateLane, pb.CreateLaneRequest(lane_id=self.lane_id))
            started = await self._call(
                self._stub.StartRun,
                pb.StartRunRequest(
                    lane_id=self.lane_id,
                    operation_id=operation_id,
                    prompt=messages,
                    settings=self.settings,
                    driver_id=self.driver_id,
                    lease_seconds=self.lease_seconds,
                ),
            )
            run = RunControl(
                started.operation_id, started.lease.token, self.settings, started.revision
            )
            _log.info("lane %s: run %s started", self.lane_id, run.operation_id)
            return await self._supervise(run, chosen, None)

    async def recover(
        self, operation_id: str, model: Model | None = None, *, wait_seconds: float = 60.0
    ) -> RunResult:
        """Take the open run ``operation_id`` over and drive it to its end.

        Waits up to ``wait_seconds`` for another driver's live lease to lapse. Then finishes
        the open batch (safe replay, interruption, or the ordinary flow; see the module doc)
        and continues the run.
        """
        if self._run is not None:
            raise DriverError(f"this driver already drives operation {self._run.operation_id}")
        async with self._explaining(), self._commands():
            return await self._recover(operation_id, model, wait_seconds)

    async def _recover(
        self, operation_id: str, model: Model | None, wait_seconds: float
    ) -> RunResult:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                taken = await self._call(
                    self._stub.AcquireOperation,
                    pb.AcquireOperationRequest(
                        lane_id=self.lane_id,
                        operation_id=operation_id,
                        driver_id=self.driver_id,
                        lease_seconds=self.lease_seconds,
                    ),
                )
                break
            except LaneError as err:
                if not isinstance(err, LeaseHeld) or time.monotonic() >= deadline:
                    raise
                _log.info("operation %s: leased to another driver; waiting", operation_id)
                await asyncio.sleep(0.25)
        if not taken.HasField("state"):
            snapshot = await _capture(self._stub, self.lane_id)
            return RunResult(operation_id, snapshot.last_result.status, snapshot.last_result, 0)
        state = taken.state
        run = RunControl(operation_id, taken.lease.token, state.settings, taken.revision)
        _log.info(
            "lane %s: took over run %s (lease token %d)",
            self.lane_id,
            operation_id,
            run.lease_token,
        )
        return await self._supervise(run, model or self.model, state)

    async def abort(self) -> bool:
        """Ask the service to abort the run this driver holds; False if it holds none."""
        run = self._run
        if run is None:
            return False
        await self._call(
            self._stub.AbortOperation,
            pb.AbortOperationRequest(lane_id=self.lane_id, operation_id=run.operation_id),
        )
        run.mark_cancelled("AbortOperation")
        return True

    # -- commands ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _explaining(self) -> AsyncIterator[None]:
        """Wait for the client's service (fail fast, saying why), and raise the errors of the
        block as the client explains them."""
        client = self._client
        if client is None:
            yield
            return
        await client.ready()
        try:
            yield
        except LaneError as err:
            better = client.explained(err)
            if better is err:
                raise
            raise better from err

    @contextlib.asynccontextmanager
    async def _commands(self) -> AsyncIterator[None]:
        """The session of one run() or recover(), as ``Driver(session=...)`` asks."""
        if self.session is False or self._session is not None:
            yield
            return
        if isinstance(self.session, LaneSession):
            self._session = self.session
            try:
                yield
            finally:
                self._session = None
            return
        async with LaneSession(self._stub, retry_seconds=self.retry_seconds) as session:
            self._session = session
            try:
                yield
            finally:
                self._session = None

    async def _send(
        self,
        rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        *,
        retry_seconds: float,
        attempt_timeout: float | None = 30.0,
    ) -> Resp:
        """One command: over the run's session, or as its unary RPC ``rpc``."""
        session = self._session
        if session is None:
            try:
                return await call(
                    rpc, request, retry_seconds=retry_seconds, attempt_timeout=attempt_timeout
                )
            except LaneError as err:
                if err.reason != _ANSWER_TOO_LARGE:
                    raise
            # An answer over one message (a large run state): DriveLane sends it in parts. A
            # command ran already; its request id (set by call) brings its recorded answer.
            async with LaneSession(self._stub, retry_seconds=retry_seconds) as once:
                return cast(Resp, await once.call(request, attempt_timeout=attempt_timeout))
        answer = await session.call(
            request, retry_seconds=retry_seconds, attempt_timeout=attempt_timeout
        )
        return cast(Resp, answer)

    # -- supervision ---------------------------------------------------------------------------

    def _model(self, model: Model | None) -> Model:
        chosen = model or self.model
        if chosen is None:
            raise DriverError("no model: pass one to run()/recover() or to Driver(model=...)")
        return chosen

    async def _supervise(
        self, run: RunControl, model: Model | None, state: pb.OperationState | None
    ) -> RunResult:
        """Drive ``run`` with the lease renewer and the lane's watch running beside it."""
        self._run = run
        self._lane = _LaneFollower(self._stub, self.lane_id)
        drive = asyncio.create_task(
            self._drive(run, model, state), name=f"drive {run.operation_id}"
        )
        helpers = [
            asyncio.create_task(self._renew(run, drive), name="renew lease"),
            asyncio.create_task(self._lane.follow(run, self.watch_abort), name="watch lane"),
        ]
        try:
            return await drive
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if run.lost is not None and (current is None or not current.cancelling()):
                raise LeaseLost(str(run.lost)) from run.lost
            raise
        except LeaseLost:
            raise
        except (LaneError, DriverError):
            # Leave the run to another driver (or the service's reconciliation) at once.
            await self._release(run)
            raise
        finally:
            self._run = None
            if not drive.done():
                drive.cancel()
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(drive, *helpers, return_exceptions=True)

    async def _release(self, run: RunControl) -> None:
        with contextlib.suppress(LaneError):
            await self._send(
                self._stub.ReleaseLease,
                pb.ReleaseLeaseRequest(
                    lane_id=self.lane_id,
                    operation_id=run.operation_id,
                    lease_token=run.lease_token,
                ),
                retry_seconds=2.0,
                attempt_timeout=5.0,
            )

    async def _renew(self, run: RunControl, drive: asyncio.Task[RunResult]) -> None:
        """Renew the lease every third of its length; watch the answers for an abort."""
        interval = max(0.2, self.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                answer = await self._send(
                    self._stub.RenewLease,
                    pb.RenewLeaseRequest(
                        lane_id=self.lane_id,
                        operation_id=run.operation_id,
                        lease_token=run.lease_token,
                        lease_seconds=self.lease_seconds,
                    ),
                    retry_seconds=interval,
                    attempt_timeout=max(interval, 1.0),
                )
            except LaneError as err:
                if isinstance(err, StaleLease):
                    _log.warning("operation %s: lease lost: %s", run.operation_id, err)
                    run.lost = err
                    drive.cancel()
                    return
                if isinstance(err, OperationNotOpen):
                    return  # the run ended
                _log.warning("operation %s: lease renewal failed: %s", run.operation_id, err)
                continue
            if answer.cancel_requested:
                run.mark_cancelled("lease renewal")

    async def _call(self, rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Resp], request: Req) -> Resp:
        """Send a command of the current run: lease token, request id, retries, and the
        ``cancel_requested`` of its answer."""
        run = self._run
        if run is not None and "lease_token" in request.DESCRIPTOR.fields_by_name:
            setattr(request, "lease_token", run.lease_token)  # noqa: B010
        try:
            answer = await self._send(rpc, request, retry_seconds=self.retry_seconds)
        except LaneError as err:
            if isinstance(err, StaleLease):
                if run is not None:
                    run.lost = err
                raise LeaseLost(str(err)) from err
            if run is not None and isinstance(err, OperationCancelled):
                run.mark_cancelled("refused command")
            raise
        if run is not None and getattr(answer, "cancel_requested", False):
            run.mark_cancelled("command answer")
        return answer

    # -- the run -------------------------------------------------------------------------------

    async def _drive(
        self, run: RunControl, model: Model | None, state: pb.OperationState | None
    ) -> RunResult:
        try:
            may_finish = False
            if state is not None:
                if state.cancel_requested:
                    run.mark_cancelled("operation state")
                may_finish = await self._resume(run, model, state)
            while True:
                if run.cancelled:
                    return await self._end(run, snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
                if may_finish:
                    return await self._end(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
                if run.turns >= self.max_turns:
                    raise _ModelFailed("max_turns", f"the run took {run.turns} turns")
                try:
                    turn = await self._call(
                        self._stub.StartTurn,
                        pb.StartTurnRequest(lane_id=self.lane_id, operation_id=run.operation_id),
                    )
                except LaneError as err:
                    if isinstance(err, OperationCancelled):
                        continue  # marked cancelled: end ABORTED
                    raise
                run.turns += 1
                may_finish = await self._turn(run, self._model(model), turn.turn_id, turn.revision)
        except _ModelFailed as failure:
            _log.warning("operation %s: %s: %s", run.operation_id, failure.code, failure.message)
            return await self._end(
                run,
                snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
                snapshot_pb2.OperationError(code=failure.code, message=failure.message),
            )

    async def _resume(self, run: RunControl, model: Model | None, state: pb.OperationState) -> bool:
        """Continue a taken-over run from its durable phase; return whether it may finish."""
        if run.cancelled:
            return False  # EndRun settles whatever is unfinished
        if state.phase == pb.RUN_PHASE_TOOLS:
            calls = [
                BatchCall(
                    tool_call_id=c.tool_call_id,
                    tool_name=c.tool_name,
                    source_index=c.source_index,
                    result_entry_id=c.result_entry_id,
                    source_arguments=state.assistant.content[
                        c.source_index
                    ].tool_call.arguments_json,
                    status=c.status,
                    replay=c.replay,
                    persisted_arguments=c.arguments_json if c.HasField("arguments_json") else None,
                )
                for c in state.tool_calls
            ]
            active = _active_tools(await self._lane.at(run.revision))
            await self._flow.run_batch(run, state.turn_id, state.assistant, calls, active)
            return await self._batch_may_finish(run)
        if state.phase == pb.RUN_PHASE_TURN_OPEN:
            run.turns += 1
            return await self._turn(run, self._model(model), state.turn_id, run.revision)
        return state.may_finish

    async def _end(
        self, run: RunControl, status: Status, error: snapshot_pb2.OperationError | None = None
    ) -> RunResult:
        request = pb.EndRunRequest(
            lane_id=self.lane_id, operation_id=run.operation_id, status=status
        )
        if error is not None:
            request.error.CopyFrom(error)
        ended = await self._call(self._stub.EndRun, request)
        result = RunResult(run.operation_id, ended.result.status, ended.result, run.turns)
        _log.info("lane %s: run %s ended %s", self.lane_id, run.operation_id, result.status_name)
        return result

    async def _turn(self, run: RunControl, model: Model, turn_id: str, revision: int) -> bool:
        """One turn after StartTurn (committed at ``revision``): ask the model (again after a
        retryable failure), settle, run the batch. Returns whether the run may finish now."""
        snapshot = await self._lane.at(revision)
        active = _active_tools(snapshot)
        if snapshot.operation.HasField("retry"):
            # Taken over while a retry was scheduled: start it when it is due.
            due = snapshot.operation.retry.next_attempt_time.ToDatetime().timestamp()
            if not await self._start_retry(run, turn_id, due - time.time()):
                return False
        transcript = tuple(snapshot.transcript)
        messages = tuple(
            entry.message.message
            for entry in transcript
            if entry.WhichOneof("payload") == "message"
        )
        failures = 0
        while True:
            partials = PartialCommits(
                functools.partial(self._append_stream, run, turn_id),
                interval=self.stream_interval,
            )
            request = ModelRequest(
                lane_id=self.lane_id,
                operation_id=run.operation_id,
                turn_id=turn_id,
                messages=messages,
                tools=tuple(t for t in self.tools.values() if active is None or t.name in active),
                abort_signal=run.cancel,
                partial=partials,
                entries=transcript,
            )
            try:
                assistant = await self._generate(run, model, request, partials)
            except _RetryModel as retry:
                failures += 1
                delay = await self._schedule_retry(run, turn_id, retry.error, failures)
                if not await self._start_retry(run, turn_id, delay):
                    return False
                continue
            break
        if assistant is None:
            return False  # aborted while the model was answering
        settled = await self._call(
            self._stub.SettleAssistantMessage,
            pb.SettleAssistantMessageRequest(
                lane_id=self.lane_id,
                operation_id=run.operation_id,
                turn_id=turn_id,
                message=assistant,
            ),
        )
        if assistant.stop_reason == messages_pb2.STOP_REASON_ERROR:
            raise _ModelFailed(
                "assistant_error", assistant.error_message or "the assistant stopped with an error"
            )
        if not settled.tool_calls:
            if assistant.stop_reason == messages_pb2.STOP_REASON_TOOL_USE:
                # The service will not complete a run on it (docs/contract.md, Tool calls).
                raise _ModelFailed(
                    "tool_use_without_calls", "the assistant stopped to use tools but named none"
                )
            return True
        calls = [
            BatchCall(
                tool_call_id=p.tool_call_id,
                tool_name=p.tool_name,
                source_index=p.source_index,
                result_entry_id=p.result_entry_id,
                source_arguments=assistant.content[p.source_index].tool_call.arguments_json,
            )
            for p in settled.tool_calls
        ]
        await self._flow.run_batch(run, turn_id, assistant, calls, active)
        return await self._batch_may_finish(run)

    async def _append_stream(
        self, run: RunControl, turn_id: str, partials: list[messages_pb2.AssistantMessage]
    ) -> None:
        """Commit streamed partials (a :class:`PartialCommits` commit)."""
        await self._call(
            self._stub.AppendAssistantStream,
            pb.AppendAssistantStreamRequest(
                lane_id=self.lane_id,
                operation_id=run.operation_id,
                turn_id=turn_id,
                partials=[pb.StreamedPartial(message=m) for m in partials],
            ),
        )

    async def _schedule_retry(
        self, run: RunControl, turn_id: str, error: ModelError, failures: int
    ) -> float:
        """ScheduleRetry for failure number ``failures`` of this turn; return the delay.
        Raises :class:`_ModelFailed` once the retries are spent."""
        policy = self.model_retry
        retries = policy.max_attempts if policy.max_attempts is not None else 4
        if retries < 1:
            raise _ModelFailed(error.code, error.message)
        if error.retry_after is not None:
            delay = max(0.0, error.retry_after)
            if delay > self.max_retry_after:
                raise _ModelFailed(
                    error.code,
                    f"{error.message} (the provider asks to retry after {delay:g}s, longer "
                    f"than the {self.max_retry_after:g}s this driver waits)",
                )
        else:
            delay = policy.delay(failures)
        try:
            scheduled = await self._call(
                self._stub.ScheduleRetry,
                pb.ScheduleRetryRequest(
                    lane_id=self.lane_id,
                    operation_id=run.operation_id,
                    turn_id=turn_id,
                    max_attempts=retries + 1,
                    delay_ms=round(delay * 1000),
                    error_message=error.message,
                ),
            )
        except LaneError as err:
            if err.reason == "RETRIES_EXHAUSTED":
                raise _ModelFailed(
                    error.code, f"{error.message} (gave up after {retries + 1} attempts)"
                ) from err
            raise
        _log.info(
            "operation %s: model failed (%s); attempt %d in %.1fs",
            run.operation_id,
            error.message,
            scheduled.attempt,
            delay,
        )
        return delay

    async def _start_retry(self, run: RunControl, turn_id: str, delay: float) -> bool:
        """Wait ``delay`` seconds (less if the run is aborted), then StartRetry. Returns False
        when the run was aborted instead."""
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.cancel.wait(), delay)
        if run.cancelled:
            return False
        try:
            await self._call(
                self._stub.StartRetry,
                pb.StartRetryRequest(
                    lane_id=self.lane_id, operation_id=run.operation_id, turn_id=turn_id
                ),
            )
        except OperationCancelled:
            return False  # marked cancelled: the run ends ABORTED
        return True

    async def _generate(
        self, run: RunControl, model: Model, request: ModelRequest, partials: PartialCommits
    ) -> messages_pb2.AssistantMessage | None:
        """The model's answer, normalized; None when the run's abort came first. Raises
        :class:`_RetryModel` for a retryable :class:`ModelError`."""
        if run.cancelled:
            return None
        answer = asyncio.ensure_future(model(request))
        aborted = asyncio.ensure_future(run.cancel.wait())
        try:
            try:
                await asyncio.wait({answer, aborted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                aborted.cancel()
            if not answer.done():
                answer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await answer
                return None
        finally:
            # Before the settlement or the retry: their commands follow any partial's.
            await partials.close()
        if isinstance(partials.failure, LeaseLost):
            raise partials.failure
        try:
            message = answer.result()
        except ModelError as err:
            if err.retryable:
                raise _RetryModel(err) from err
            raise _ModelFailed(err.code, err.message) from err
        except Exception as err:
            raise _ModelFailed("model_error", str(err) or type(err).__name__) from err
        if not isinstance(message, messages_pb2.AssistantMessage):
            raise _ModelFailed(
                "model_error", f"the model returned {type(message).__name__}, not AssistantMessage"
            )
        settled = messages_pb2.AssistantMessage()
        settled.CopyFrom(message)
        if settled.stop_reason in (
            messages_pb2.STOP_REASON_UNSPECIFIED,
            messages_pb2.STOP_REASON_PENDING,
        ):
            has_calls = any(b.WhichOneof("block") == "tool_call" for b in settled.content)
            settled.stop_reason = (
                messages_pb2.STOP_REASON_TOOL_USE if has_calls else messages_pb2.STOP_REASON_STOP
            )
        if not settled.HasField("timestamp"):
            settled.timestamp.GetCurrentTime()
        return settled

    async def _batch_may_finish(self, run: RunControl) -> bool:
        """After a batch: may the run finish (every call asked to terminate)?"""
        answer = await self._call(
            self._stub.GetOperation,
            pb.GetOperationRequest(lane_id=self.lane_id, operation_id=run.operation_id),
        )
        state = answer.state
        if state.cancel_requested:
            run.mark_cancelled("operation state")
        if state.phase == pb.RUN_PHASE_TOOLS:
            unplaced = [
                c.tool_call_id
                for c in state.tool_calls
                if c.status != pb.TOOL_CALL_STATUS_COMPLETED
            ]
            raise DriverError(f"the batch still has unplaced calls {unplaced}")
        return bool(state.may_finish)
