"""DriveLane: a driver's session, many commands over one bidirectional stream.

A unary RPC costs the service a few hundred microseconds of gRPC and asyncio work besides the
command itself (a new call, its metadata, its handler task); a message on an open stream is one
read and one write (``bench.commit_throughput --sessions``: about 200 µs less service CPU per
command). DriveLane carries the same commands: each request holds the request message of
one unary RPC (its ``command`` oneof field is named as the method) and a ``sequence`` the
client chose; each answer holds the same sequence and the unary RPC's response in the field of
the same name, or the ``google.rpc.Status`` the unary RPC would have ended with (``error``).

One implementation per command: a command is served by its method's unary handler itself, the
function :func:`~lane.server.api.errors.unary` wraps
(:func:`~lane.server.api.errors.implementation`: validation, the typed command, the commands layer,
the result mapping), called with a :class:`Call` naming the method, so its request key, and so its
stored answer, is the unary call's. Its exceptions go through the same error table
(:func:`error_answer`), and a request is counted (:func:`check_counts`) before the handler sees it,
as :mod:`servicer` does for unary calls. Each command has the log scope and the
``lane_commands_total`` / ``lane_command_duration_seconds`` series of its method, as a unary call
does, and, with traces on, a span of its own, a child of the stream's span (``rpc_spans.py``).

The stream:

- **Auth** once, from the stream's metadata, with the servicer's :class:`Authenticator`: a
  refused token ends the stream with the unary status (UNAUTHENTICATED) before anything is
  read. Every command then runs in the token's namespace.
- **Order.** Commands naming the same ``lane_id`` run one at a time, in the order they were
  read; the next starts once the previous one is answered, so one lane's answers are also sent
  in order. Commands of different lanes (and ListLanes, which names none) run concurrently;
  answers are sent as each completes, with their sequence.
- **Bound.** At most :data:`MAX_COMMANDS_IN_FLIGHT` commands of a stream are in flight: read
  and not yet answered (their answer not yet handed to gRPC). The reader takes a slot before
  it reads the next message and a command gives its slot back once its answer is written, so
  past the bound the service reads nothing more and HTTP/2 flow control holds the client's
  writes back: nothing is buffered without bound.
- **Malformed** requests are answered, not fatal: bytes that do not decode as a
  DriveLaneRequest get INVALID_ARGUMENT ``MALFORMED_REQUEST`` under the sequence found in them
  (0 if none), a request naming no command INVALID_ARGUMENT ``MISSING_FIELD`` (``command``).
- **Size.** An answer whose frame would pass the 4 MiB message limit (an answer of the unary
  RPC close to the limit, plus the sequence) is replaced by RESOURCE_EXHAUSTED
  ``ANSWER_TOO_LARGE``: the command did run; the unary RPC with the same request id reads it.
- **End.** Half-closing ends the stream (OK) once every command read is answered. The
  stream's deadline bounds every command on it (gRPC cancels the handler, and the commands with
  it; a command's transaction still runs to its end, as for a unary call). On shutdown
  (:meth:`DriveSessions.close`) the service stops reading, answers every command it read, then
  ends the stream UNAVAILABLE ``SERVER_SHUTTING_DOWN``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server import logs, traces
from lane.server.api.auth import caller_namespace
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call, Context
from lane.server.api.encoded_counts import check_encoded_counts
from lane.server.api.errors import error_answer, implementation, rich_status, status_of
from lane.server.api.fair_shares import holding
from lane.server.api.framing import length_delimited, varint
from lane.server.api.instrument import MethodMetrics, bind_answer, bind_request, method_metrics
from lane.server.api.rpc_spans import start_command
from lane.server.api.validation import check_counts
from lane.server.domain.errors import InvalidArgument
from lane.server.domain.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

#: Commands of one stream read and not yet answered, at most; past it the stream is not read.
MAX_COMMANDS_IN_FLIGHT = 64

_SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
_REQUEST = pb.DriveLaneRequest.DESCRIPTOR
_RESPONSE = pb.DriveLaneResponse.DESCRIPTOR
#: The field number of DriveLaneResponse.error.
ERROR_FIELD = _RESPONSE.fields_by_name["error"].number
_SEQUENCE_FIELD = _RESPONSE.fields_by_name["sequence"].number
_LENGTH_DELIMITED = 2

Handler = Callable[[Any, Any, Call], Awaitable[Message]]


@dataclass(frozen=True, slots=True)
class _Command:
    """How one kind of command is served: its method, its handler, where its answer goes."""

    method: str
    handler: Handler
    #: The DriveLaneResponse field of its answer.
    answer_field: int
    #: Whether its request names a lane (its commands run in order per lane).
    addressed: bool
    metrics: MethodMetrics


def command_table(servicer_type: type[Any]) -> dict[str, _Command]:
    """Every command of DriveLaneRequest's ``command`` oneof → how it is served: the unary
    method whose request message the field holds, and the DriveLaneResponse field of the same
    name, which must hold that method's response message."""
    methods = {method.input_type.full_name: method for method in _SERVICE.methods}
    table: dict[str, _Command] = {}
    for field in _REQUEST.oneofs_by_name["command"].fields:
        request_type = field.message_type
        assert request_type is not None  # every field of the oneof is a message
        method = methods[request_type.full_name]
        answer = _RESPONSE.fields_by_name[field.name]
        if answer.message_type is not method.output_type or answer.number != field.number:
            raise TypeError(f"DriveLaneResponse.{field.name} is not {method.name}'s answer")
        table[field.name] = _Command(
            method=method.name,
            handler=implementation(getattr(servicer_type, method.name)),
            answer_field=answer.number,
            addressed="lane_id" in request_type.fields_by_name,
            metrics=method_metrics(method.name),
        )
    return table


class DriveSessions:
    """The DriveLane streams one servicer serves; :meth:`close` ends them all (shutdown)."""

    def __init__(self) -> None:
        self._open: set[_Session] = set()
        self.closing = False

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Ask every stream to stop reading, answer what it read, and end UNAVAILABLE."""
        self.closing = True
        for session in list(self._open):
            session.close()


class DriveRpcs(ServicerBase):
    """The DriveLane RPC (module doc). A mixin of the servicer, beside the unary groups whose
    handlers it calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drive_sessions = DriveSessions()
        self._drive_commands = command_table(type(self))

    @holding("session_shares")  # TOO_MANY_SESSIONS past a cap
    async def DriveLane(self, requests: Any, context: Context) -> None:
        refusal = self.authenticator.admit(context.invocation_metadata())
        if refusal is not None:
            await context.abort_with_status(refusal)
        logs.bind(namespace=caller_namespace())
        session = _Session(self, self._drive_commands, context)
        sessions = self.drive_sessions
        if sessions.closing:
            session.close()
        sessions._open.add(session)
        try:
            shutting_down = await session.serve()
        finally:
            sessions._open.discard(session)
        if shutting_down:
            await context.abort_with_status(
                status_of(
                    code_pb2.UNAVAILABLE,
                    "SERVER_SHUTTING_DOWN",
                    "the server is shutting down; send unanswered commands again on a new stream",
                    {},
                )
            )


class _Session:
    """One DriveLane stream being served."""

    def __init__(self, servicer: Any, commands: dict[str, _Command], context: Context) -> None:
        self._servicer = servicer
        self._commands = commands
        self._context = context
        self._slots = asyncio.Semaphore(MAX_COMMANDS_IN_FLIGHT)
        self._write_lock = asyncio.Lock()
        #: The last command read of each lane id: the next one of the lane runs after it.
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()

    def close(self) -> None:
        self._closed.set()

    async def serve(self) -> bool:
        """Read and answer until the client half-closes (False) or :meth:`close` (True)."""
        reader = asyncio.create_task(self._read())
        closed = asyncio.create_task(self._closed.wait())
        try:
            await asyncio.wait((reader, closed), return_when=asyncio.FIRST_COMPLETED)
            shutting_down = not reader.done()
            if shutting_down:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            else:
                reader.result()  # the client half-closed: read everything
            while self._running:  # every command read is answered
                await asyncio.wait(tuple(self._running))
            return shutting_down
        finally:
            closed.cancel()
            reader.cancel()
            for task in self._running:
                task.cancel()

    async def _read(self) -> None:
        while True:
            await self._slots.acquire()  # past the bound: wait for an answer before reading
            data = await self._context.read()
            if data is grpc.aio.EOF:
                self._slots.release()
                return
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        """Start serving one message: a command, in its lane's order; or its refusal."""
        try:
            # A large message's counts are read from its bytes first: decoding costs per element.
            check_encoded_counts(data, pb.DriveLaneRequest)
            try:
                request = pb.DriveLaneRequest.FromString(data)
            except DecodeError:
                raise InvalidArgument(
                    "MALFORMED_REQUEST", "the message is not a valid DriveLaneRequest"
                ) from None
        except InvalidArgument as refused:
            self._start(self._refuse(_sequence_of(data), refused), None)
            return
        which = request.WhichOneof("command")
        if which is None:
            error = InvalidArgument(
                "MISSING_FIELD",
                "command is required (one of the oneof's request messages)",
                field="command",
            )
            self._start(self._refuse(request.sequence, error), None)
            return
        command = self._commands[which]
        inner: Message = getattr(request, which)
        lane_id: str | None = inner.lane_id if command.addressed else None  # type: ignore[attr-defined]
        previous = None if lane_id is None else self._tails.get(lane_id)
        self._start(self._run(request.sequence, command, inner, previous), lane_id)

    def _start(self, work: Awaitable[None], lane_id: str | None) -> None:
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if lane_id is not None:
            self._tails[lane_id] = task
            task.add_done_callback(functools.partial(self._untail, lane_id))

    def _untail(self, lane_id: str, task: asyncio.Task[None]) -> None:
        if self._tails.get(lane_id) is task:
            del self._tails[lane_id]

    async def _run(
        self,
        sequence: int,
        command: _Command,
        request: Message,
        previous: asyncio.Task[None] | None,
    ) -> None:
        try:
            if previous is not None and not previous.done():
                await asyncio.wait((previous,))  # the lane's earlier command, answered
            frame = await self._answer(sequence, command, request)
            await self._send(frame)
        finally:
            self._slots.release()

    async def _send(self, frame: bytes) -> None:
        """Write one answer; a stream that can no longer be written to ends on its own (the
        handler is cancelled), so a failed write is only logged."""
        try:
            async with self._write_lock:
                await self._context.write(frame)
        except Exception as exc:
            log.warning("DriveLane: an answer could not be sent: %r", exc)

    async def _answer(self, sequence: int, command: _Command, request: Message) -> bytes:
        """The command served as its unary RPC would be, as an encoded DriveLaneResponse."""
        with logs.request_scope(command.method):
            start = time.perf_counter()
            code, reason = "UNKNOWN", ""
            span = None if traces.tracer is None else start_command(command.method, sequence)
            try:
                bind_request(request)
                check_counts(request)
                answer = await command.handler(
                    self._servicer, request, Call(command.method, self._context)
                )
                bind_answer(answer)
                code = "OK"
                frame = _frame(sequence, command.answer_field, answer.SerializeToString())
            except asyncio.CancelledError:
                code = "CANCELLED"  # the stream ended (client gone, deadline, shutdown)
                raise
            except Exception as exc:
                status, reason = error_answer(exc)
                code = code_pb2.Code.Name(status.code)
                frame = _frame(sequence, ERROR_FIELD, status.SerializeToString())
            finally:
                command.metrics.answered(code, reason, time.perf_counter() - start)
                if span is not None:
                    span.finish(code, reason)
            if len(frame) > MAX_MESSAGE_BYTES:
                frame = _too_large(sequence, command.method, len(frame))
            return frame

    async def _refuse(self, sequence: int, error: InvalidArgument) -> None:
        """Answer a message that names no command it can serve (counted as DriveLane's)."""
        try:
            status = rich_status(
                code_pb2.INVALID_ARGUMENT, error.reason, error.message, error.metadata
            )
            method_metrics("DriveLane").answered("INVALID_ARGUMENT", error.reason, 0.0)
            await self._send(_frame(sequence, ERROR_FIELD, status.SerializeToString()))
        finally:
            self._slots.release()


def _too_large(sequence: int, method: str, size: int) -> bytes:
    status = rich_status(
        code_pb2.RESOURCE_EXHAUSTED,
        "ANSWER_TOO_LARGE",
        f"the answer to {method} is {size} bytes as a DriveLane message, more than one message"
        f" carries ({MAX_MESSAGE_BYTES}); the command ran: call {method} itself, with the same"
        " request_id, to read its answer",
        {"method": method, "bytes": str(size), "limit": str(MAX_MESSAGE_BYTES)},
    )
    return _frame(sequence, ERROR_FIELD, status.SerializeToString())


# -- wire format --------------------------------------------------------------------------------


_SEQUENCE_TAG = varint(_SEQUENCE_FIELD << 3)


def _frame(sequence: int, field: int, body: bytes) -> bytes:
    """An encoded DriveLaneResponse: ``sequence`` and the encoded message ``body`` in the
    answer field ``field``. Built around the answer's bytes rather than by copying the answer
    into a DriveLaneResponse message and encoding that."""
    head = _SEQUENCE_TAG + varint(sequence) if sequence else b""
    return head + length_delimited(field, body)


def _sequence_of(data: bytes) -> int:
    """The ``sequence`` of a message that does not decode as a whole: the last varint field 1
    among the top-level fields read before the first one that cannot be (0 if none)."""
    sequence, at, end = 0, 0, len(data)

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            if at >= end or shift > 63:
                raise ValueError("truncated varint")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    try:
        while at < end:
            tag = varint()
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                value = varint()
                if number == _SEQUENCE_FIELD:
                    sequence = value & 0xFFFF_FFFF_FFFF_FFFF
            elif wire == 1:
                at += 8
            elif wire == _LENGTH_DELIMITED:
                at += varint()
            elif wire == 5:
                at += 4
            else:
                break
    except ValueError:
        pass
    return sequence
