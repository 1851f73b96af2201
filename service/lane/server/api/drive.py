"""DriveLane: a driver's session, many commands over one bidirectional stream.

A unary RPC costs the service a few hundred microseconds of gRPC and asyncio work besides the
command itself (a new call, its metadata, its handler task); a message on an open stream is one
read and one write (``bench.commit_throughput --sessions``: about 200 µs less service CPU per
command), and a message carrying a batch of commands one read for them all. DriveLane carries
the same commands: each request holds the request message of one unary RPC (its ``command``
oneof field is named as the method) and a ``sequence`` the client chose, or a ``batch`` of such
requests; each answer holds the same sequence and the unary RPC's response in the field of the
same name, or the ``google.rpc.Status`` the unary RPC would have ended with (``error``); an
answer message may carry a ``batch`` of answers.

One implementation per command: a command is served by its method's unary handler itself, the
function :func:`~lane.server.api.errors.unary` wraps
(:func:`~lane.server.api.errors.implementation`: validation, then the command), called with a
:class:`Call` naming the method, so its request key, and so its stored answer, is the unary
call's. Its exceptions go through the same error table
(:func:`error_answer`), and a request is counted (:func:`check_counts`) before the handler sees it,
as :mod:`servicer` does for unary calls. Each command has the log scope and the
``lane_commands_total`` / ``lane_command_duration_seconds`` series of its method, as a unary call
does, and, with traces on, a span of its own, a child of the stream's span (``rpc_spans.py``).
A command of a batch is served exactly as the same command in a message of its own.

The stream:

- **Auth** once, from the stream's metadata, with the servicer's :class:`Authenticator`: a
  refused token ends the stream with the unary status (UNAUTHENTICATED) before anything is
  read. Every command then runs in the token's namespace. An admitted stream is sent the
  header :data:`~lane.limits.DRIVE_BATCH_HEADER` (the batch bound) at once: clients send
  batches only after it, so a client never sends one to an older service.
- **Batches** (``drive_frames.py``): a message is read at its top level, and each request of
  its batch decoded, counted and served as a message of its own would be, in order. A request
  of a batch holding a batch itself, and a command beside a batch, are answered
  INVALID_ARGUMENT ``MALFORMED_REQUEST`` under their sequence; the others are served. A
  message carrying more than :data:`~lane.limits.MAX_DRIVE_BATCH` requests is not served at
  all: the stream answers what it read before and ends INVALID_ARGUMENT ``TOO_MANY_COMMANDS``
  (answering each of them would cost as much as the message's size allows, and no client
  that reads the header sends one).
- **Order.** Commands naming the same ``lane_id`` run one at a time, in the order they were
  read (inside a batch and across messages); the next starts once the previous one's answer
  is ready, so one lane's answers are also sent in order. One task serves a lane's commands
  while it has any waiting (:meth:`_Session._run_lane`), so a burst of one lane's commands
  costs one task, not one each. Commands of different lanes (and ListLanes, which names
  none) run concurrently; answers are sent as each completes, with their sequence.
- **Answers** go out through one writer task per stream (:meth:`_Session._write_answers`).
  To a client that has sent a batch, the answers ready when the writer runs — those
  completed in the same event-loop turn, and those that came while the previous write was
  in progress — go out as one message (at most MAX_DRIVE_BATCH answers and 4 MiB each;
  ``drive_frames.answer_messages``); a lone answer goes as a single message. A client that
  sends one command per message gets one answer per message.
- **Bound.** At most :data:`MAX_COMMANDS_IN_FLIGHT` commands of a stream are in flight: read
  and not yet answered (their answer not yet handed to gRPC), however they were framed. The
  reader waits for a free slot before it reads a message and before each further command of
  a batch, and a command gives its slot back once its answer is written, so past the bound
  the service reads nothing more and HTTP/2 flow control holds the client's writes back:
  nothing is buffered without bound. A batch larger than the free slots is served as slots
  free up: its first commands run while the reader waits for the next slot (the commands
  holding slots need nothing from the reader to finish), so a batch never deadlocks.
- **Write deadline.** An answer write that the client does not take for the servicer's write
  deadline (``LANE_WATCH_WRITE_DEADLINE_SECONDS``, shared with WatchLane; one sweep for both,
  ``write_deadline.py``) ends the stream RESOURCE_EXHAUSTED ``SESSION_TOO_SLOW``: the
  commands running then still commit (a transaction runs to its end when its caller goes,
  ``store/lane_store.py``), the answers waiting are dropped, and the stream's memory (at most
  its in-flight answers) is freed at once, whenever the client reads again.
- **Malformed** requests are answered, not fatal: bytes that do not decode as a
  DriveLaneRequest get INVALID_ARGUMENT ``MALFORMED_REQUEST`` under the sequence found in them
  (0 if none), a request naming no command INVALID_ARGUMENT ``MISSING_FIELD`` (``command``).
- **Size.** An answer over the 4 MiB message limit (a run's durable state, a snapshot) goes
  alone, in parts (lane.v1.MessagePart, ``message_parts.py``), each message at most the limit;
  the client joins them. Nothing is refused for its answer's size.
- **End.** Half-closing ends the stream (OK) once every command read is answered. The
  stream's deadline bounds every command on it (gRPC cancels the handler, and the commands with
  it; a command's transaction still runs to its end, as for a unary call). On shutdown
  (:meth:`DriveSessions.close`) the service stops reading, answers every command it read, then
  ends the stream UNAVAILABLE ``SERVER_SHUTTING_DOWN``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2
from lane.limits import (
    DRIVE_BATCH_HEADER,
    MAX_DRIVE_BATCH,
    MAX_DRIVE_COMMANDS_IN_FLIGHT,
    MAX_MESSAGE_BYTES,
)
from lane.v1 import lane_service_pb2 as pb

from lane.server import logs, metrics, traces
from lane.server.api.auth import caller_namespace
from lane.server.api.base import ServicerBase
from lane.server.api.call import Call, Context
from lane.server.api.drive_frames import (
    ERROR_FIELD,
    Answer,
    answer,
    answer_messages,
    read_request,
)
from lane.server.api.encoded_counts import check_encoded_counts
from lane.server.api.errors import error_answer, implementation, rich_status, status_of
from lane.server.api.fair_shares import holding
from lane.server.api.instrument import MethodMetrics, bind_answer, bind_request, method_metrics
from lane.server.api.message_parts import split_answer
from lane.server.api.rpc_spans import start_command
from lane.server.api.validation import check_counts
from lane.server.api.write_deadline import DeadlinePassed, WriteDeadline, end_cut_off
from lane.server.domain.errors import InvalidArgument

log = logging.getLogger(__name__)

#: Commands of one stream read and not yet answered, at most; past it the stream is not read.
MAX_COMMANDS_IN_FLIGHT = MAX_DRIVE_COMMANDS_IN_FLIGHT

_SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
_REQUEST = pb.DriveLaneRequest.DESCRIPTOR
_RESPONSE = pb.DriveLaneResponse.DESCRIPTOR
_BATCH_HEADER = ((DRIVE_BATCH_HEADER, str(MAX_DRIVE_BATCH)),)

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
        answer_field = _RESPONSE.fields_by_name[field.name]
        if (
            answer_field.message_type is not method.output_type
            or answer_field.number != field.number
        ):
            raise TypeError(f"DriveLaneResponse.{field.name} is not {method.name}'s answer")
        table[field.name] = _Command(
            method=method.name,
            handler=implementation(getattr(servicer_type, method.name)),
            answer_field=answer_field.number,
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


class _Ending(enum.Enum):
    """Why a stream stopped reading."""

    #: The client half-closed: every command read was answered.
    HALF_CLOSED = enum.auto()
    #: Shutdown: every command read was answered.
    SHUTDOWN = enum.auto()
    #: A message carried more than MAX_DRIVE_BATCH commands: every command read before it was
    #: answered.
    TOO_MANY_COMMANDS = enum.auto()
    #: The client took no answer for the write deadline.
    TOO_SLOW = enum.auto()


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
        await context.send_initial_metadata(_BATCH_HEADER)
        session = _Session(self, self._drive_commands, context, self.write_deadline)
        sessions = self.drive_sessions
        if sessions.closing:
            session.close()
        sessions._open.add(session)
        try:
            ending = await session.serve()
        finally:
            sessions._open.discard(session)
        if ending is _Ending.SHUTDOWN:
            await context.abort_with_status(
                status_of(
                    code_pb2.UNAVAILABLE,
                    "SERVER_SHUTTING_DOWN",
                    "the server is shutting down; send unanswered commands again on a new stream",
                    {},
                )
            )
        elif ending is _Ending.TOO_MANY_COMMANDS:
            await context.abort_with_status(
                status_of(
                    code_pb2.INVALID_ARGUMENT,
                    "TOO_MANY_COMMANDS",
                    f"a DriveLane message carried more than {MAX_DRIVE_BATCH} commands in its"
                    " batch, the most one may carry: none of them ran; the commands sent before"
                    " it were answered",
                    {"limit": str(MAX_DRIVE_BATCH)},
                )
            )
        elif ending is _Ending.TOO_SLOW:
            seconds = self.watch_settings.write_deadline_seconds
            await end_cut_off(
                context,
                status_of(
                    code_pb2.RESOURCE_EXHAUSTED,
                    "SESSION_TOO_SLOW",
                    f"the client took no answer for {seconds:g}s; the stream is ended (the"
                    " commands that were running still commit): send the unanswered commands"
                    " again, with their request ids, on a new stream",
                    {"deadlineSeconds": f"{seconds:g}"},
                ),
            )


#: A command waiting for its turn: its sequence, how it is served, its request.
_Queued = tuple[int, _Command, Message]


class _Session:
    """One DriveLane stream being served."""

    def __init__(
        self,
        servicer: Any,
        commands: dict[str, _Command],
        context: Context,
        deadline: WriteDeadline,
    ) -> None:
        self._servicer = servicer
        self._commands = commands
        self._context = context
        self._deadline = deadline
        #: Commands read and not yet answered (their answer not yet written).
        self._in_flight = 0
        #: Set when an answer was written (a slot freed) and when the stream stops answering.
        self._answered = asyncio.Event()
        #: The commands of each lane that has a task serving them, waiting for their turn.
        self._lanes: dict[str, deque[_Queued]] = {}
        self._running: set[asyncio.Task[None]] = set()
        #: Answers ready and not yet written, in the order they became ready.
        self._answers: list[Answer] = []
        self._answer_ready = asyncio.Event()
        #: The client has sent a batch: answers ready together go out as one message.
        self._batching = False
        self._stop = asyncio.Event()
        self._too_slow = False

    def close(self) -> None:
        self._stop.set()

    async def serve(self) -> _Ending:
        """Read and answer until the client half-closes, :meth:`close`, a message over the
        batch bound, or the write deadline; say which."""
        writer = asyncio.create_task(self._write_answers())
        writer.add_done_callback(self._writer_ended)
        reader = asyncio.create_task(self._read())
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait((reader, stop), return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                ending = _Ending.SHUTDOWN
            else:
                ending = _Ending.HALF_CLOSED if reader.result() else _Ending.TOO_MANY_COMMANDS
            # Every command read is answered (unless the client stopped taking answers).
            while self._in_flight and not writer.done():
                self._answered.clear()
                await self._answered.wait()
            if self._too_slow:
                return _Ending.TOO_SLOW
            if writer.done():
                writer.result()  # the writer's failure, if it failed
                raise RuntimeError("the DriveLane answer writer stopped")
            return ending
        finally:
            stop.cancel()
            reader.cancel()
            writer.cancel()
            for task in self._running:
                task.cancel()

    def _writer_ended(self, _: asyncio.Task[None]) -> None:
        """The writer stops only when the client is cut off (or on a bug): stop serving."""
        self._answered.set()
        self._stop.set()

    # -- reading -----------------------------------------------------------------------------

    async def _read(self) -> bool:
        """Read and start serving every message; True at the client's half-close, False at a
        message over the batch bound."""
        read = self._context.read
        frames = metrics.current.drive_frames
        while True:
            await self._free_slot()  # past the bound: wait for an answer before reading
            data = await read()
            if data is grpc.aio.EOF:
                return True
            message = read_request(data)
            if not message.batch or message.malformed:
                frames.read_single.inc()
                self._dispatch(data, message.sequence, message.malformed)
                continue
            if message.too_many:
                return False
            frames.read_batch.inc()
            self._batching = True
            if message.command:
                self._refuse(
                    message.sequence,
                    InvalidArgument(
                        "MALFORMED_REQUEST",
                        "a DriveLaneRequest holds a command beside its batch: put the command"
                        " in the batch",
                    ),
                )
            view = memoryview(data)
            for start, end in message.batch:
                if self._in_flight >= MAX_COMMANDS_IN_FLIGHT:
                    await self._free_slot()
                self._dispatch(view[start:end], 0, False, inner=True)

    async def _free_slot(self) -> None:
        while self._in_flight >= MAX_COMMANDS_IN_FLIGHT:
            self._answered.clear()
            await self._answered.wait()

    def _dispatch(
        self,
        data: bytes | memoryview,
        sequence: int,
        malformed: bool,
        *,
        inner: bool = False,
    ) -> None:
        """Start serving one request: a message read at its top level (its ``sequence``,
        whether it is ``malformed``), or a request of a batch (``inner``: read here); a
        command, in its lane's order, or its refusal. Takes a slot."""
        try:
            if inner:
                # Read at its top level first: a batch inside is refused before anything in
                # it is decoded (its requests are counted only as a batch's own).
                inside = read_request(data)
                sequence, malformed = inside.sequence, inside.malformed
                if inside.batch or inside.too_many:
                    raise InvalidArgument(
                        "MALFORMED_REQUEST",
                        "a request of a batch holds a batch itself; a batch holds single requests",
                    )
            if malformed:
                raise _malformed()
            # A large request's counts are read from its bytes first: decoding costs per element.
            check_encoded_counts(data, pb.DriveLaneRequest)
            try:
                request = pb.DriveLaneRequest.FromString(data)  # type: ignore[arg-type]  # any buffer
            except DecodeError:
                raise _malformed() from None
        except InvalidArgument as refused:
            self._refuse(sequence, refused)
            return
        which = request.WhichOneof("command")
        if which is None:
            error = InvalidArgument(
                "MISSING_FIELD",
                "command is required (one of the oneof's request messages)",
                field="command",
            )
            self._refuse(request.sequence, error)
            return
        command = self._commands[which]
        body: Message = getattr(request, which)
        queued = (request.sequence, command, body)
        self._in_flight += 1
        if not command.addressed:
            self._start(self._run_one(queued))
            return
        lane_id: str = body.lane_id  # type: ignore[attr-defined]
        waiting = self._lanes.get(lane_id)
        if waiting is not None:
            waiting.append(queued)  # the lane's task serves it after those before it
            return
        waiting = self._lanes[lane_id] = deque((queued,))
        self._start(self._run_lane(lane_id, waiting))

    def _start(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _refuse(self, sequence: int, error: InvalidArgument) -> None:
        """Answer a request that names no command it can serve (counted as DriveLane's)."""
        self._in_flight += 1
        status = rich_status(code_pb2.INVALID_ARGUMENT, error.reason, error.message, error.metadata)
        method_metrics("DriveLane").answered("INVALID_ARGUMENT", error.reason, 0.0)
        self._ready(answer(sequence, ERROR_FIELD, status.SerializeToString()))

    # -- serving -----------------------------------------------------------------------------

    async def _run_lane(self, lane_id: str, waiting: deque[_Queued]) -> None:
        """Serve the commands of ``lane_id`` one after the other while any wait."""
        try:
            while waiting:
                self._ready(await self._answer(*waiting.popleft()))
        finally:
            # No await between the last look at ``waiting`` and here: a command read after
            # it finds no task for its lane and starts one.
            if self._lanes.get(lane_id) is waiting:
                del self._lanes[lane_id]

    async def _run_one(self, queued: _Queued) -> None:
        self._ready(await self._answer(*queued))

    async def _answer(self, sequence: int, command: _Command, request: Message) -> Answer:
        """The command served as its unary RPC would be."""
        with logs.request_scope(command.method):
            start = time.perf_counter()
            code, reason = "UNKNOWN", ""
            span = None if traces.tracer is None else start_command(command.method, sequence)
            try:
                bind_request(request)
                check_counts(request)
                response = await command.handler(
                    self._servicer, request, Call(command.method, self._context, framed=True)
                )
                bind_answer(response)
                code = "OK"
                ready = answer(sequence, command.answer_field, response.SerializeToString())
            except asyncio.CancelledError:
                code = "CANCELLED"  # the stream ended (client gone, deadline, shutdown)
                raise
            except Exception as exc:
                status, reason = error_answer(exc)
                code = code_pb2.Code.Name(status.code)
                ready = answer(sequence, ERROR_FIELD, status.SerializeToString())
            finally:
                command.metrics.answered(code, reason, time.perf_counter() - start)
                if span is not None:
                    span.finish(code, reason)
            return ready

    # -- writing -----------------------------------------------------------------------------

    def _ready(self, ready: Answer) -> None:
        """Hand an answer to the writer."""
        self._answers.append(ready)
        self._answer_ready.set()

    async def _write_answers(self) -> None:
        """Write the answers as they become ready (module doc, Answers); each written answer
        frees its slot."""
        frames = metrics.current.drive_frames
        while True:
            await self._answer_ready.wait()
            self._answer_ready.clear()
            while self._answers:
                answers, self._answers = self._answers, []
                if self._batching:
                    messages = answer_messages(answers)
                else:
                    messages = ((ready.message(), 1) for ready in answers)
                for message, count in messages:
                    (frames.written_single if count == 1 else frames.written_batch).inc()
                    try:
                        if len(message) <= MAX_MESSAGE_BYTES:
                            await self._deadline.write(self._context, message)
                        else:
                            # An answer over the limit (always alone): in parts.
                            for part in split_answer(message):
                                await self._deadline.write(self._context, part)
                    except DeadlinePassed:
                        self._cut_off()
                        return
                    except Exception as exc:
                        # A stream that can no longer be written to ends on its own (gRPC
                        # cancels the handler), so a failed write is only logged.
                        log.warning("DriveLane: an answer could not be sent: %r", exc)
                    self._in_flight -= count
                    self._answered.set()

    def _cut_off(self) -> None:
        """The client took no answer for the write deadline: stop reading and answering (the
        writer returns); the answers waiting are dropped."""
        self._too_slow = True
        self._answers = []


def _malformed() -> InvalidArgument:
    return InvalidArgument("MALFORMED_REQUEST", "the message is not a valid DriveLaneRequest")
