"""A driver session: the lane service's commands over one DriveLane stream.

::

    async with LaneSession(stub) as session:
        started = await session.call(pb.StartRunRequest(lane_id="lane-1", prompt=[...]))
        turn = await session.call(pb.StartTurnRequest(lane_id="lane-1", ...))

:meth:`LaneSession.call` takes the request message of any unary LaneService RPC but WatchLane
and returns that RPC's response, or raises the :class:`~lane.client.errors.LaneError` the
unary call would have raised: the service serves each command of the stream with the unary
handler itself. A unary call costs the service a few hundred microseconds of gRPC work besides
the command; a message on the open stream less (about 200 µs less per command in
``bench.commit_throughput --sessions``; a Python client saves less, grpc.aio's stream write and
read being nearly as costly as a unary call), and commands are pipelined: many may be in flight
at once (the service applies one lane's commands in the order they were sent, and runs
different lanes' concurrently).

Retries mirror :func:`lane.client.commands.call`: a request with a ``request_id`` field gets
a fresh request id when it has none; an answer UNAVAILABLE, DEADLINE_EXCEEDED (no answer
within ``attempt_timeout``) or RESOURCE_EXHAUSTED ``DATABASE_BUSY`` sends the command again,
with the same request id, paced and bounded by the session's
:class:`~lane.client.retry.RetryPolicy` (``retry``; ``retry_seconds`` replaces its timeout).
When the stream itself breaks (the connection drops, the server restarts or shuts down, or
cuts the stream off because its answers went unread for its write deadline) the session opens
a new one and sends every unanswered command again, in the order they were first sent:
commands with a request id (a retry returns the first answer: nothing is lost or done twice)
and reads (GetLaneSnapshot, ListLanes, GetOperation). The commands without a request id
(RenewLease and ReleaseLease, which have none, and every command of a session made with
``request_ids=False``) are not sent blindly a second time: they fail with UNAVAILABLE
(:class:`SessionBroken`). A stream refused as a whole (UNAUTHENTICATED) fails the
commands on it with that error.

Batches: the session's one writer task sends what is waiting each time it runs. One command
waiting goes at once in a message of its own (no window, no timer: a lone command is not
delayed); several — commands issued in the same event-loop turn (the progress reports of
parallel tools, a stage and the next report), or issued while the previous message was being
written — go as one message carrying them in its ``batch`` (at most the service's batch bound,
64, and 4 MiB a message). The service serves each command of a batch as if it came alone: its
own answer or refusal, in order with the other commands of its lane. Batches are sent only on a
stream whose service said it takes them (the ``lane-drive-batch`` header it sends when it
admits the stream); to an older service, or before the header came, every command goes alone.
Answers arrive one per message or several in one; each reaches its caller by its sequence.

An answer over the 4 MiB message limit (a large snapshot or run state) comes in parts
(lane.v1.MessagePart); the session joins them and hands the caller the whole answer. A request
too large for a DriveLane message (near the 4 MiB limit) goes through the unary RPC instead, and
so does a command an older service answered RESOURCE_EXHAUSTED ``ANSWER_TOO_LARGE`` (with its
request id: the answer recorded when the command ran comes back). So do the commands of a
stream the server refuses RESOURCE_EXHAUSTED ``TOO_MANY_SESSIONS`` (it serves as many DriveLane
streams as it will): nothing on it was run, and the session sends its commands unary until the
refusal's retry delay has passed, then opens a stream again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message
from lane.client.commands import call as unary_call
from lane.client.commands import giving_up, is_retryable, new_request_id
from lane.client.errors import LaneError, lane_error, reason_name, status_error
from lane.client.message_parts import PartJoiner, PartsError
from lane.client.retry import COMMAND_RETRY, RetryPolicy
from lane.limits import DRIVE_BATCH_HEADER, MAX_DRIVE_BATCH, MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import reasons_pb2

__all__ = ["LaneSession", "SessionBroken"]

_ANSWER_TOO_LARGE = reason_name(reasons_pb2.REASON_ANSWER_TOO_LARGE)
#: The service cut the stream off: the session took no answer for its write deadline (a loop
#: blocked that long). The stream broke; its commands are sent again as after any break.
_TOO_SLOW = reason_name(reasons_pb2.REASON_SESSION_TOO_SLOW)
_TOO_MANY_SESSIONS = reason_name(reasons_pb2.REASON_TOO_MANY_SESSIONS)
#: How long commands go unary after a TOO_MANY_SESSIONS refusal without a retry delay.
_UNARY_SECONDS = 2.0
#: What a DriveLaneRequest adds around a command: the sequence and the command's field header
#: (and, in a batch, the batch entry's header).
_FRAME_BYTES = 32
#: Reads: sent again on a new stream although they carry no request id.
_READS = frozenset({"GetLaneSnapshot", "ListLanes", "GetOperation"})
#: Stream-level codes that mean the stream broke, not that its commands were refused.
_BROKEN = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)


def _command_fields() -> dict[str, tuple[str, str]]:
    """Request message full name → (DriveLaneRequest field, method name)."""
    methods = pb.DESCRIPTOR.services_by_name["LaneService"].methods
    by_input = {method.input_type.full_name: method.name for method in methods}
    fields: dict[str, tuple[str, str]] = {}
    for item in pb.DriveLaneRequest.DESCRIPTOR.oneofs_by_name["command"].fields:
        assert item.message_type is not None
        name = item.message_type.full_name
        fields[name] = (item.name, by_input[name])
    return fields


_COMMANDS = _command_fields()


def _past(deadline: float | None, now: float) -> bool:
    return deadline is not None and now >= deadline


class SessionBroken(LaneError):
    """UNAVAILABLE: the stream broke before a command without a request id was answered (it
    may or may not have been applied), so it was not sent again."""


def _batch_bound(metadata: Any) -> int:
    """The most commands one message may carry on a stream whose service sent ``metadata``
    as its initial metadata: its ``lane-drive-batch`` header (capped at MAX_DRIVE_BATCH), or 1
    when it sent none (a service without batches)."""
    for key, value in metadata or ():
        if key == DRIVE_BATCH_HEADER:
            try:
                return max(1, min(int(value), MAX_DRIVE_BATCH))
            except ValueError:
                return 1
    return 1


class _Pending:
    """One command waiting for its answer."""

    __slots__ = (
        "answer_by",
        "command",
        "deadline",
        "future",
        "method",
        "request",
        "resend",
        "sends",
        "size",
    )

    def __init__(
        self,
        request: Message,
        size: int,
        command: str,
        method: str,
        resend: bool,
        deadline: float | None,
        future: asyncio.Future[Message],
    ) -> None:
        self.request = request
        #: The request's encoded size.
        self.size = size
        #: Its DriveLaneRequest field.
        self.command = command
        self.method = method
        #: Sent again on a new stream when the stream breaks.
        self.resend = resend
        self.deadline = deadline
        self.future = future
        #: Times it was written (the first stream, and again on each new one after a break).
        self.sends = 0
        #: The loop time by which this attempt must be answered (None: no bound), and how
        #: long that was (for the error).
        self.answer_by: tuple[float, float] | None = None


class LaneSession:
    """Commands over one DriveLane stream of ``stub`` (see the module doc). ``metadata`` goes
    with every stream opened (a channel of :func:`~lane.client.connect.open_channel` adds the
    bearer token itself). ``retry`` (its timeout replaced by ``retry_seconds`` when given)
    and ``attempt_timeout`` are the defaults of :meth:`call`; ``retry`` also paces reopening a
    broken stream. ``request_ids=False`` sends requests without a request id as they are (as
    the unary ``stub`` methods do; such a command is not sent again on a new stream). The
    stream is opened by the first command and again after a break; close the session with
    :meth:`aclose` (or ``async with``)."""

    def __init__(
        self,
        stub: Any,
        *,
        retry: RetryPolicy = COMMAND_RETRY,
        retry_seconds: float | None = None,
        attempt_timeout: float | None = 30.0,
        metadata: Sequence[tuple[str, str]] | None = None,
        request_ids: bool = True,
    ) -> None:
        self._stub = stub
        self.request_ids = request_ids
        self.retry = retry if retry_seconds is None else retry.with_timeout(retry_seconds)
        self.attempt_timeout = attempt_timeout
        self._metadata = tuple(metadata) if metadata else None
        #: Unanswered commands, in the order they were first submitted.
        self._pending: dict[_Pending, None] = {}
        #: Commands sent on the current stream, by sequence.
        self._sent: dict[int, _Pending] = {}
        self._outbox: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._sequences = itertools.count(1)
        self._stream: Any = None
        #: Commands one message may carry on the current stream (1 until its service says).
        self._batch = 1
        self._generation = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._reconnect: asyncio.Task[None] | None = None
        self._failures = 0
        self._closed = False
        #: Until then (monotonic time) commands go unary: the server refused a stream.
        self._unary_until = 0.0
        #: The one timer of the session's attempt deadlines (see :meth:`_sweep`) and when it
        #: fires (loop time).
        self._sweeper: asyncio.TimerHandle | None = None
        self._running_loop: asyncio.AbstractEventLoop | None = None
        self._sweep_at = 0.0
        #: Streams opened so far (the first, then one per break).
        self.streams_opened = 0
        #: Messages written (one per command, or one per batch) and commands sent in them.
        self.messages_sent = 0
        self.commands_sent = 0

    async def __aenter__(self) -> LaneSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- commands ----------------------------------------------------------------------------

    async def call(
        self,
        request: Message,
        *,
        retry: RetryPolicy | None = None,
        retry_seconds: float | None = None,
        attempt_timeout: float | None = -1.0,
    ) -> Any:
        """Send ``request`` (a unary RPC's request message) on the stream and return the
        RPC's response; raise its :class:`LaneError`. See the module doc for retries;
        ``retry`` replaces the session's policy for this command, ``retry_seconds`` its
        timeout."""
        if self._closed:
            raise RuntimeError("the session is closed")
        try:
            field_name, method = _COMMANDS[request.DESCRIPTOR.full_name]
        except KeyError:
            raise TypeError(f"{request.DESCRIPTOR.name} is not a DriveLane command") from None
        retry = self.retry if retry is None else retry
        if retry_seconds is not None:
            retry = retry.with_timeout(retry_seconds)
        timeout = self.attempt_timeout if attempt_timeout == -1.0 else attempt_timeout
        has_id = "request_id" in request.DESCRIPTOR.fields_by_name
        if has_id and not getattr(request, "request_id"):  # noqa: B009
            if self.request_ids:
                setattr(request, "request_id", new_request_id())  # noqa: B010
            else:
                has_id = False
        size = request.ByteSize()
        if size > MAX_MESSAGE_BYTES - _FRAME_BYTES or time.monotonic() < self._unary_until:
            return await self._unary(method, request, retry, timeout)
        resend = has_id or method in _READS
        started = time.monotonic()
        deadline = retry.deadline()
        attempt = sends = 0
        while True:
            future: asyncio.Future[Message] = self._loop().create_future()
            pending = _Pending(request, size, field_name, method, resend, deadline, future)
            try:
                return await self._answer(pending, timeout)
            except SessionBroken:
                raise
            except LaneError as err:
                error = err
            if error.reason == _TOO_MANY_SESSIONS:
                # The stream was refused before anything on it was read.
                wait = _UNARY_SECONDS if error.retry_after is None else error.retry_after
                self._unary_until = max(self._unary_until, time.monotonic() + wait)
            if error.reason in (_ANSWER_TOO_LARGE, _TOO_MANY_SESSIONS):
                return await self._unary(method, request, retry, timeout)
            attempt += 1
            sends += max(1, pending.sends)
            if not is_retryable(error):
                raise error
            if retry.gives_up(attempt, deadline):
                raise giving_up(error, sends, started)
            await retry.backoff(attempt, deadline)

    async def _unary(
        self, method: str, request: Message, retry: RetryPolicy, seconds: float | None
    ) -> Any:
        return await unary_call(
            getattr(self._stub, method), request, retry=retry, attempt_timeout=seconds
        )

    async def _answer(self, pending: _Pending, seconds: float | None) -> Message:
        """Submit ``pending`` and wait for its answer (at most ``seconds``: past it, it fails
        DEADLINE_EXCEEDED)."""
        self._pending[pending] = None
        self._outbox.append(pending)
        if self._stream is None and self._reconnect is None:
            self._open()
        self._wake.set()
        if seconds is not None:
            at = pending.future.get_loop().time() + seconds
            pending.answer_by = (at, seconds)
            if self._sweeper is None or at < self._sweep_at:
                self._arm(at)
        try:
            return await pending.future
        finally:
            self._pending.pop(pending, None)

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the session runs on (its streams' tasks are bound to it): looked up
        once, not per command (on Python 3.11 each look-up is a system call)."""
        loop = self._running_loop
        if loop is None or loop.is_closed():
            loop = self._running_loop = asyncio.get_running_loop()
        return loop

    def _arm(self, at: float) -> None:
        """Run :meth:`_sweep` at loop time ``at`` (instead of when it was due)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._sweep_at = at
        self._sweeper = self._loop().call_at(at, self._sweep)

    def _sweep(self) -> None:
        """Fail every command whose attempt is past its deadline, and set the timer for the
        next deadline. One timer for the session rather than one per command: a timer made and
        cancelled for each command costs more than the walk over the unanswered commands
        each time one is due."""
        self._sweeper = None
        now = self._loop().time()
        soonest: float | None = None
        for pending in self._pending:
            if pending.answer_by is None or pending.future.done():
                continue
            at, seconds = pending.answer_by
            if at <= now:
                pending.future.set_exception(
                    LaneError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        "",
                        f"no answer to {pending.method} within {seconds}s",
                    )
                )
            elif soonest is None or at < soonest:
                soonest = at
        if soonest is not None:
            self._arm(soonest)

    # -- the stream ----------------------------------------------------------------------------

    def _open(self) -> None:
        """Open a stream and send every unanswered command on it, in order."""
        self._generation += 1
        generation = self._generation
        self._sent.clear()
        self._batch = 1  # until this stream's service says it takes batches
        stream = self._stub.DriveLane(metadata=self._metadata)
        self._stream = stream
        self.streams_opened += 1
        self._outbox = deque(self._pending)
        self._wake.set()
        self._tasks = [
            asyncio.create_task(self._write(stream, generation), name="lane session writer"),
            asyncio.create_task(self._read(stream, generation), name="lane session reader"),
        ]

    async def _write(self, stream: Any, generation: int) -> None:
        try:
            while True:
                while self._outbox:
                    message = self._next_message()
                    if message is not None:
                        await stream.write(message)
                self._wake.clear()
                await self._wake.wait()
        except grpc.aio.AioRpcError as err:
            self._broken(generation, lane_error(err))
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as err:
            # Written after the call ended: the reader reports how it ended.
            self._broken(generation, LaneError(grpc.StatusCode.UNAVAILABLE, "", str(err)))

    def _next_message(self) -> pb.DriveLaneRequest | None:
        """The next message to write: the first unanswered command of the outbox, and as many
        after it as one message may carry (the stream's batch bound, 4 MiB); None if none is
        left."""
        taken: list[tuple[int, _Pending]] = []
        size = 0
        outbox = self._outbox
        while outbox and len(taken) < self._batch:
            pending = outbox[0]
            if pending not in self._pending:
                outbox.popleft()  # answered, timed out or given up meanwhile
                continue
            size += pending.size + _FRAME_BYTES
            if taken and size > MAX_MESSAGE_BYTES:
                break
            outbox.popleft()
            pending.sends += 1
            sequence = next(self._sequences)
            self._sent[sequence] = pending
            taken.append((sequence, pending))
        if not taken:
            return None
        self.messages_sent += 1
        self.commands_sent += len(taken)
        if len(taken) == 1:
            return _request(pb.DriveLaneRequest(), *taken[0])
        message = pb.DriveLaneRequest()
        for sequence, pending in taken:
            _request(message.batch.add(), sequence, pending)
        return message

    async def _read(self, stream: Any, generation: int) -> None:
        try:
            self._batch = _batch_bound(await stream.initial_metadata())
            if self._batch > 1:
                self._wake.set()  # what waits may go together now
            parts: PartJoiner[pb.DriveLaneResponse] = PartJoiner()
            while True:
                received = await stream.read()
                if received is grpc.aio.EOF:
                    break
                self._failures = 0
                # An answer over the message limit comes in parts: only whole ones are read.
                try:
                    answer = parts.take(received)
                except PartsError as exc:
                    self._broken(generation, LaneError(grpc.StatusCode.INTERNAL, "", str(exc)))
                    return
                if answer is None:
                    continue
                if answer.batch:
                    for item in answer.batch:
                        self._deliver(item)
                else:
                    self._deliver(answer)
        except grpc.aio.AioRpcError as err:
            self._broken(generation, lane_error(err))
            return
        self._broken(
            generation,
            LaneError(grpc.StatusCode.UNAVAILABLE, "", "the stream ended with commands unanswered"),
        )

    def _deliver(self, answer: pb.DriveLaneResponse) -> None:
        """Hand ``answer`` to the caller waiting for its sequence (none: given up on)."""
        pending = self._sent.pop(answer.sequence, None)
        if pending is None or pending.future.done() or pending not in self._pending:
            return
        which = answer.WhichOneof("answer")
        if which == "error":
            pending.future.set_exception(status_error(answer.error))
        elif which is not None:
            pending.future.set_result(getattr(answer, which))
        else:
            pending.future.set_exception(
                LaneError(grpc.StatusCode.UNKNOWN, "", "an answer with nothing in it")
            )

    def _broken(self, generation: int, error: LaneError) -> None:
        """The stream of ``generation`` ended with ``error``: fail or keep each unanswered
        command, and open a new stream (after a backoff) for those kept."""
        if generation != self._generation or self._stream is None:
            return
        self._drop_stream()
        self._failures += 1
        broken = (
            error.code in _BROKEN
            and (
                error.code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
                or not error.reason
            )
        ) or error.reason == _TOO_SLOW
        now = time.monotonic()
        for pending in list(self._pending):
            if pending.future.done():
                continue
            if not broken or _past(pending.deadline, now):
                pending.future.set_exception(error)
            elif not pending.resend:
                pending.future.set_exception(
                    SessionBroken(
                        grpc.StatusCode.UNAVAILABLE,
                        "",
                        f"the stream broke before {pending.method} was answered ({error}); it"
                        " has no request id, so it was not sent again",
                    )
                )
        if broken and not self._closed and any(not p.future.done() for p in self._pending):
            delay = self.retry.delay(self._failures)
            self._reconnect = asyncio.create_task(self._reopen(delay, error))

    async def _reopen(self, delay: float, error: LaneError) -> None:
        await asyncio.sleep(delay)
        self._reconnect = None
        now = time.monotonic()
        for pending in list(self._pending):
            if not pending.future.done() and _past(pending.deadline, now):
                pending.future.set_exception(error)
        if not self._closed and any(not p.future.done() for p in self._pending):
            self._open()

    def _drop_stream(self) -> None:
        """Forget the current stream: its tasks stop (but the one calling), the call ends."""
        stream, self._stream = self._stream, None
        self._generation += 1
        self._sent.clear()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._tasks = []
        if stream is not None:
            stream.cancel()

    # -- closing -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Half-close the stream (the service ends it once it answered everything it read),
        then stop. Commands still unanswered fail with CANCELLED."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._reconnect is not None:
            self._reconnect.cancel()
            self._reconnect = None
        stream, tasks = self._stream, list(self._tasks)
        if stream is not None and not self._pending:
            # Nothing unanswered: end the stream politely (the service sees EOF, not a cancel).
            with contextlib.suppress(Exception):
                await stream.done_writing()
                reader = tasks[1]
                async with asyncio.timeout(1.0):
                    await asyncio.shield(reader)
        self._drop_stream()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for pending in list(self._pending):
            if not pending.future.done():
                pending.future.set_exception(
                    LaneError(grpc.StatusCode.CANCELLED, "", "the session was closed")
                )


def _request(message: pb.DriveLaneRequest, sequence: int, pending: _Pending) -> pb.DriveLaneRequest:
    """``message`` made the DriveLaneRequest of ``pending`` under ``sequence``."""
    message.sequence = sequence
    getattr(message, pending.command).CopyFrom(pending.request)
    return message
