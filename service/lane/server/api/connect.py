"""LaneService over the Connect protocol and gRPC-Web: an ASGI application (``connectrpc``).

No RPC is implemented twice. Each method runs the very handler the gRPC port registers for it
(``servicer._method_handlers``: the log scope and metrics, authentication, decoding and the
count limits, the servicer's method with its validation, command and error table), called with
a :class:`HttpContext` in place of grpc.aio's ServicerContext. The adapter only moves bytes
and statuses between the two:

- before the body is read, the call's Host, Origin and token are checked from its headers
  (``connect_admission.py``): a call refused there costs no decompression and no parsing;
- request headers become the call's metadata (``authorization: Bearer ...`` included), and
  the Connect deadline the context's ``time_remaining()``;
- a binary request is handed over as the bytes gRPC would hand over; a JSON one is converted
  to those bytes first, a large one counted before it is parsed and parsed in a thread, a few
  per namespace at a time (``json_parses.py``); a JSON body that does not parse is refused as
  gRPC refuses undecodable bytes: INVALID_ARGUMENT ``MALFORMED_REQUEST``;
- ``context.abort_with_status`` ends the call with a ``ConnectError`` of the same code,
  message and details (the google.rpc.ErrorInfo, and RetryInfo when there is one);
- a server stream's ``context.write`` hands each message (or pre-encoded frame) to the HTTP
  response and returns once the connection took it, so a watcher holds one message in flight
  and its write deadline holds as on gRPC; once the handler has ended, a send still waiting
  for a client that stopped reading is let go and the status queues behind it
  (``response_writes.py``).

Client-streaming methods (DriveLane, ImportLane) are not served here: browsers cannot stream a
request body, and the gRPC port serves them. ImportLane takes a plain upload on this port
instead (``http_import.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from google.rpc import code_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.auth import Authenticator
from lane.server.api.connect_admission import Admission
from lane.server.api.connect_errors import (
    STATUS_DETAILS_KEY,
    connect_error,
    refusal_error,
    refused_before_handler,
)
from lane.server.api.errors import error_answer, rich_status
from lane.server.api.host_check import HostCheck
from lane.server.api.json_parses import JsonParses
from lane.server.api.response_writes import current_response
from lane.server.api.servicer import SERVICE_NAME, LaneServicer, _method_handlers
from lane.server.domain.errors import LaneError

#: Request messages larger than this are refused RESOURCE_EXHAUSTED, as on the gRPC port.
MAX_REQUEST_BYTES = 4 * 1024 * 1024


# -- codecs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _JsonRequest:
    """A JSON request body, parsed only once the call is authenticated."""

    text: bytes


@dataclass(frozen=True, slots=True)
class _Answer:
    """A response for the codec: a message, or the encoded bytes of one (a pre-encoded watch
    frame), with the method's response type to read such bytes as for JSON."""

    message: Message | bytes
    type: type[Message]


class _BinaryCodec:
    """``proto``: requests stay bytes for the shared handler, frames pass through as they are."""

    def name(self) -> str:
        return "proto"

    def encode(self, answer: _Answer) -> bytes:
        message = answer.message
        return message if isinstance(message, bytes) else message.SerializeToString()

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> bytes:
        return bytes(data)


class _JsonCodec:
    """``json``: protobuf's canonical JSON mapping (camelCase names, 64-bit integers as
    strings), as every Connect client speaks it."""

    def name(self) -> str:
        return "json"

    def encode(self, answer: _Answer) -> bytes:
        message = answer.message
        if isinstance(message, bytes):
            message = answer.type.FromString(message)
        text: str = json_format.MessageToJson(message, indent=None, ensure_ascii=False)
        return text.encode()

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> _JsonRequest:
        return _JsonRequest(bytes(data))


# -- the context --------------------------------------------------------------------------


class _Aborted(grpc.aio.AbortError):
    """Raised by :meth:`HttpContext.abort_with_status`, as grpc.aio raises its AbortError (a
    subclass of it, so the servicer's ``except grpc.aio.AbortError`` treats it alike)."""


_END = object()


class HttpContext(grpc.aio.ServicerContext[Any, Any]):
    """What a LaneService handler needs of grpc.aio's ServicerContext, for a call that came
    over HTTP: its metadata and deadline, its ending status, and its response stream."""

    def __init__(self, metadata: Sequence[tuple[str, str]], deadline: float | None) -> None:
        self._metadata = tuple(metadata)
        self._deadline = deadline
        self._status: grpc.Status | None = None
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()
        #: Messages a stream wrote and the futures their writers wait on (see :meth:`write`).
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._gone = False

    # The parts handlers use.

    def invocation_metadata(self) -> Any:
        return self._metadata

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        self._status = status
        self._trailing = tuple(status.trailing_metadata or ())
        raise _Aborted()

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        await self.abort_with_status(_GrpcStatus(code, details, tuple(trailing_metadata)))

    def code(self) -> Any:
        return None if self._status is None else self._status.code

    def details(self) -> str:
        return "" if self._status is None else self._status.details or ""

    def trailing_metadata(self) -> Any:
        return self._trailing

    def time_remaining(self) -> Any:  # None without a deadline, as grpc.aio answers
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def write(self, message: Any) -> None:
        """Hand ``message`` to the HTTP response; return once it was sent."""
        if self._gone:
            raise ConnectionError("the client is gone")
        sent = asyncio.get_running_loop().create_future()
        self.outbox.put_nowait((message, sent))
        await sent

    def close(self) -> None:
        """The response ended: fail the writes still waiting (their client is gone)."""
        self._gone = True
        while not self.outbox.empty():
            item = self.outbox.get_nowait()
            if item is not _END and not item[1].done():
                item[1].set_exception(ConnectionError("the client is gone"))

    def connect_error(self) -> ConnectError:
        """The status the handler aborted with, as a Connect error."""
        status = self._status
        if status is None:
            return ConnectError(ConnectCode.INTERNAL, "internal error; see the service log")
        details = [value for key, value in self._trailing if key == STATUS_DETAILS_KEY]
        return connect_error(status.code, status.details or "", details[0] if details else None)

    # The rest of the interface, which no LaneService handler uses over HTTP.

    async def read(self) -> Any:
        raise NotImplementedError("request streams are served on the gRPC port")

    async def send_initial_metadata(self, initial_metadata: Any) -> None:
        return None

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._trailing = tuple(trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        return None

    def set_details(self, details: str) -> None:
        return None

    def set_compression(self, compression: grpc.Compression) -> None:
        return None

    def disable_next_message_compression(self) -> None:
        return None

    def peer(self) -> str:
        return ""

    def peer_identities(self) -> None:
        return None

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> Mapping[str, Any]:
        return {}


@dataclass(frozen=True)
class _GrpcStatus(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


# -- the endpoints ------------------------------------------------------------------------


def _metadata(ctx: RequestContext[Any, Any]) -> list[tuple[str, str]]:
    return [(key.lower(), value) for key, value in ctx.request_headers.allitems()]


def _deadline(ctx: RequestContext[Any, Any]) -> float | None:
    remaining = ctx.timeout_ms
    return None if remaining is None else time.monotonic() + remaining / 1000


class _Method:
    """One LaneService method over HTTP: its shared handler and message types."""

    def __init__(
        self,
        descriptor: MethodDescriptor,
        handler: Any,
        authenticator: Authenticator,
        parses: JsonParses,
    ) -> None:
        self.name = descriptor.name
        self.request_type: type[Message] = message_factory.GetMessageClass(descriptor.input_type)
        self.response_type: type[Message] = message_factory.GetMessageClass(descriptor.output_type)
        self.handler = handler
        self.authenticator = authenticator
        self.parses = parses
        self.unary_method = not descriptor.server_streaming
        self.info = MethodInfo(
            name=descriptor.name,
            service_name=SERVICE_NAME,
            input=self.request_type,
            output=self.response_type,
            idempotency_level=IdempotencyLevel.UNKNOWN,
            stream_type=StreamType.SERVER_STREAM
            if descriptor.server_streaming
            else StreamType.UNARY,
        )

    async def request_bytes(self, payload: bytes | _JsonRequest, context: HttpContext) -> bytes:
        """The request as the bytes the gRPC handler decodes. A JSON body that is not a valid
        request raises the refusal the gRPC port gives undecodable bytes; one over a count
        limit, the refusal the gRPC port gives those counts."""
        if isinstance(payload, bytes):
            return payload
        start = time.perf_counter()
        # Admission let the call in (connect_admission.py): its token names a namespace.
        namespace = self.authenticator.namespace_of(context.invocation_metadata())
        try:
            return await self.parses.to_bytes(payload.text, self.request_type, str(namespace))
        except LaneError as error:  # a count over its limit, or too many waiting parses
            status = rich_status(
                code_pb2.Code.Value(error.code.value),
                error.reason,
                error.message,
                error.metadata,
                error.retry_after_seconds,
            )
        except Exception:  # whatever the JSON holds, the answer is a refusal, never a crash
            status = rich_status(
                code_pb2.INVALID_ARGUMENT,
                "MALFORMED_REQUEST",
                f"the request is not a valid {self.request_type.DESCRIPTOR.name}",
                {},
            )
        raise refused_before_handler(self.name, self.unary_method, status, start)

    async def unary(self, payload: bytes | _JsonRequest, ctx: RequestContext[Any, Any]) -> Any:
        context = HttpContext(_metadata(ctx), _deadline(ctx))
        data = await self.request_bytes(payload, context)
        try:
            answer = await self.handler(data, context)
        except grpc.aio.AbortError:
            raise context.connect_error() from None
        except Exception as exc:
            raise refusal_error(error_answer(exc)[0]) from None
        return _Answer(answer, self.response_type)

    async def stream(
        self, payload: bytes | _JsonRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[Any]:
        context = HttpContext(_metadata(ctx), _deadline(ctx))
        data = await self.request_bytes(payload, context)
        response = current_response.get()
        # The handler runs as its own task, writing into the context's outbox; this generator
        # sends each message and only then lets its write return.
        task = asyncio.create_task(self.handler(data, context))

        def ended(_: asyncio.Task[Any]) -> None:
            context.outbox.put_nowait(_END)
            if response is not None:
                response.release()  # a send still waiting for the client goes behind

        task.add_done_callback(ended)
        try:
            while (item := await context.outbox.get()) is not _END:
                message, sent = item
                yield _Answer(message, self.response_type)
                if not sent.done():
                    sent.set_result(None)
            try:
                task.result()
            except grpc.aio.AbortError:
                raise context.connect_error() from None
            except Exception as exc:
                raise refusal_error(error_answer(exc)[0]) from None
        finally:
            context.close()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


class LaneServiceApp(ConnectASGIApplication[LaneServicer]):
    """lane.v1.LaneService's unary and server-streaming methods over Connect (JSON or binary,
    HTTP/1.1 or HTTP/2) and gRPC-Web, served by ``servicer``'s gRPC handlers; ``hosts``: the
    Host and Origin it serves (``host_check.py``)."""

    def __init__(self, servicer: LaneServicer, hosts: HostCheck) -> None:
        self._parses = JsonParses()
        super().__init__(
            service=servicer,
            endpoints=lambda served: _endpoints(served, self._parses),
            interceptors=[Admission(servicer.authenticator, hosts)],
            read_max_bytes=MAX_REQUEST_BYTES,
            codecs=[_BinaryCodec(), _JsonCodec()],
        )

    @property
    def path(self) -> str:
        """The URL path the service's methods are under."""
        return f"/{SERVICE_NAME}"

    def close(self) -> None:
        """Let the JSON parse threads go (at shutdown)."""
        self._parses.close()


def _endpoints(servicer: LaneServicer, parses: JsonParses) -> dict[str, Any]:
    handlers = _method_handlers(servicer)
    endpoints: dict[str, Any] = {}
    for descriptor in pb.DESCRIPTOR.services_by_name["LaneService"].methods:
        if descriptor.client_streaming:
            continue  # DriveLane, ImportLane: the gRPC port's (see the module docstring)
        handler = handlers[descriptor.name]
        path = f"/{SERVICE_NAME}/{descriptor.name}"
        if descriptor.server_streaming:
            method = _Method(descriptor, handler.unary_stream, servicer.authenticator, parses)
            endpoints[path] = Endpoint.server_stream(method.info, method.stream)
        else:
            method = _Method(descriptor, handler.unary_unary, servicer.authenticator, parses)
            endpoints[path] = Endpoint.unary(method.info, method.unary)
    return endpoints
