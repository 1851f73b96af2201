"""LaneService over the Connect protocol and gRPC-Web: an ASGI application (``connectrpc``).

No RPC is implemented twice. Each method runs the very handler the gRPC port registers for it
(``servicer._method_handlers``: the log scope and metrics, authentication, decoding and the
count limits, the servicer's method with its validation, command and error table), called with
a :class:`HttpContext` in place of grpc.aio's ServicerContext. The adapter only moves bytes
and statuses between the two:

- request headers become the call's metadata (``authorization: Bearer ...`` included), and
  the Connect deadline the context's ``time_remaining()``;
- a binary request is handed over as the bytes gRPC would hand over; a JSON one is converted
  to those bytes first (a JSON body that does not parse is refused as gRPC refuses undecodable
  bytes: INVALID_ARGUMENT ``MALFORMED_REQUEST``, after the token is checked);
- ``context.abort_with_status`` ends the call with a ``ConnectError`` of the same code,
  message and details (the google.rpc.ErrorInfo, and RetryInfo when there is one);
- a server stream's ``context.write`` hands each message (or pre-encoded frame) to the HTTP
  response and returns once it was sent, so a watcher holds one message in flight as on gRPC.

Client-streaming methods (DriveLane, ImportLane) are not served here: browsers cannot stream a
request body, and the gRPC port serves them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from lane.v1 import lane_service_pb2 as pb
from protobuf.wkt import Any as ConnectAny

from lane.server.api.errors import error_answer, rich_status
from lane.server.api.instrument import method_metrics
from lane.server.api.servicer import SERVICE_NAME, LaneServicer, _method_handlers

#: Request messages larger than this are refused RESOURCE_EXHAUSTED, as on the gRPC port.
MAX_REQUEST_BYTES = 4 * 1024 * 1024

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


# -- codecs -------------------------------------------------------------------------------


#: JSON bodies up to this size are parsed on the event loop (a few milliseconds at most);
#: larger ones in a worker thread.
JSON_ON_LOOP_BYTES = 64 * 1024


def _json_to_bytes(text: bytes, request_type: type[Message]) -> bytes:
    message = json_format.Parse(text, request_type(), ignore_unknown_fields=True)
    return bytes(message.SerializeToString())


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
        details = [value for key, value in self._trailing if key == _STATUS_DETAILS_KEY]
        return _connect_error(status.code, status.details or "", details[0] if details else None)

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


def _connect_error(code: Any, message: str, details_bin: Any) -> ConnectError:
    """A Connect error of gRPC status ``code`` (a grpc.StatusCode or its number) carrying the
    details of the serialized google.rpc.Status ``details_bin``."""
    number = code.value[0] if isinstance(code, grpc.StatusCode) else int(code)
    name = code_pb2.Code.Name(number) if number in code_pb2.Code.values() else "UNKNOWN"
    connect_code = ConnectCode.CANCELED if name == "CANCELLED" else ConnectCode(name.lower())
    details: list[ErrorDetail] = []
    if isinstance(details_bin, bytes):
        for detail in status_pb2.Status.FromString(details_bin).details:
            details.append(ErrorDetail(ConnectAny(type_url=detail.type_url, value=detail.value)))
    return ConnectError(connect_code, message, details)


def _refusal_error(status: status_pb2.Status) -> ConnectError:
    return _connect_error(status.code, status.message, status.SerializeToString())


# -- the endpoints ------------------------------------------------------------------------


def _metadata(ctx: RequestContext[Any, Any]) -> list[tuple[str, str]]:
    return [(key.lower(), value) for key, value in ctx.request_headers.allitems()]


def _deadline(ctx: RequestContext[Any, Any]) -> float | None:
    remaining = ctx.timeout_ms
    return None if remaining is None else time.monotonic() + remaining / 1000


class _Method:
    """One LaneService method over HTTP: its shared handler and message types."""

    def __init__(self, descriptor: MethodDescriptor, handler: Any, authenticator: Any) -> None:
        self.name = descriptor.name
        self.request_type: type[Message] = message_factory.GetMessageClass(descriptor.input_type)
        self.response_type: type[Message] = message_factory.GetMessageClass(descriptor.output_type)
        self.handler = handler
        self.authenticator = authenticator
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
        request raises the refusal the gRPC port gives undecodable bytes (the token first)."""
        if isinstance(payload, bytes):
            return payload
        try:
            if len(payload.text) <= JSON_ON_LOOP_BYTES:
                return _json_to_bytes(payload.text, self.request_type)
            # protobuf's JSON parser is Python: a few microseconds per JSON object, seconds for
            # a large body of empty objects. In a thread the event loop keeps getting turns.
            return await asyncio.to_thread(_json_to_bytes, payload.text, self.request_type)
        except Exception:  # whatever the JSON holds, the answer is a refusal, never a crash
            pass
        start = time.perf_counter()
        refusal = self.authenticator.namespace_of(context.invocation_metadata())
        if isinstance(refusal, str):
            status = rich_status(
                code_pb2.INVALID_ARGUMENT,
                "MALFORMED_REQUEST",
                f"the request is not a valid {self.request_type.DESCRIPTOR.name}",
                {},
            )
        else:
            status = _status_message(refusal)
        method_metrics(self.name).answered(
            code_pb2.Code.Name(status.code), _reason_of(status), time.perf_counter() - start
        )
        raise _refusal_error(status)

    async def unary(self, payload: bytes | _JsonRequest, ctx: RequestContext[Any, Any]) -> Any:
        context = HttpContext(_metadata(ctx), _deadline(ctx))
        data = await self.request_bytes(payload, context)
        try:
            answer = await self.handler(data, context)
        except grpc.aio.AbortError:
            raise context.connect_error() from None
        except Exception as exc:
            raise _refusal_error(error_answer(exc)[0]) from None
        return _Answer(answer, self.response_type)

    async def stream(
        self, payload: bytes | _JsonRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[Any]:
        context = HttpContext(_metadata(ctx), _deadline(ctx))
        data = await self.request_bytes(payload, context)
        # The handler runs as its own task, writing into the context's outbox; this generator
        # sends each message and only then lets its write return.
        task = asyncio.create_task(self.handler(data, context))
        task.add_done_callback(lambda _: context.outbox.put_nowait(_END))
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
                raise _refusal_error(error_answer(exc)[0]) from None
        finally:
            context.close()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def _status_message(status: grpc.Status) -> status_pb2.Status:
    """The google.rpc.Status a grpc.Status carries in its trailing metadata."""
    for key, value in status.trailing_metadata or ():
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return status_pb2.Status(code=status.code.value[0], message=status.details or "")


def _reason_of(status: status_pb2.Status) -> str:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


class LaneServiceApp(ConnectASGIApplication[LaneServicer]):
    """lane.v1.LaneService's unary and server-streaming methods over Connect (JSON or binary,
    HTTP/1.1 or HTTP/2) and gRPC-Web, served by ``servicer``'s gRPC handlers."""

    def __init__(self, servicer: LaneServicer) -> None:
        super().__init__(
            service=servicer,
            endpoints=_endpoints,
            read_max_bytes=MAX_REQUEST_BYTES,
            codecs=[_BinaryCodec(), _JsonCodec()],
        )

    @property
    def path(self) -> str:
        """The URL path the service's methods are under."""
        return f"/{SERVICE_NAME}"


def _endpoints(servicer: LaneServicer) -> dict[str, Any]:
    handlers = _method_handlers(servicer)
    endpoints: dict[str, Any] = {}
    for descriptor in pb.DESCRIPTOR.services_by_name["LaneService"].methods:
        if descriptor.client_streaming:
            continue  # DriveLane, ImportLane: the gRPC port's (see the module docstring)
        handler = handlers[descriptor.name]
        path = f"/{SERVICE_NAME}/{descriptor.name}"
        if descriptor.server_streaming:
            method = _Method(descriptor, handler.unary_stream, servicer.authenticator)
            endpoints[path] = Endpoint.server_stream(method.info, method.stream)
        else:
            method = _Method(descriptor, handler.unary_unary, servicer.authenticator)
            endpoints[path] = Endpoint.unary(method.info, method.unary)
    return endpoints
