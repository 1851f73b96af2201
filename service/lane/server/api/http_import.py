"""ImportLane over the HTTP port, for browsers: the export file as a plain upload.

ImportLane is client-streaming, which a browser cannot send (fetch has no streaming request
body over HTTP/1.1, and Connect has no client streams over it), so the HTTP port answers it
unimplemented on its Connect path. Instead it takes the file at :data:`UPLOAD_PATH`:

    POST /upload/lane.v1.LaneService/ImportLane?lane_id=NEW_LANE
    authorization: Bearer TOKEN
    content-type: application/octet-stream

    <the export file, as ExportLane wrote it>

and answers the ImportLaneResponse in protobuf's JSON mapping, or a refusal as a Connect error
(its JSON body, HTTP status and ErrorInfo), exactly as the gRPC port would. The body is fed,
piece by piece as it arrives, to the very handler the gRPC port registers for ImportLane
(``servicer._method_handlers``: its log scope and metrics, its authentication, the transfer
shares of the namespace, the 64 MiB bound counted as the pieces come, the whole file checked
before anything is written). Before a byte of the body is read, the call's Host and Origin are
checked (auth off) and its token, as for every call of the port (``connect_admission.py``); a
``content-length`` over the bound is refused at once. The HTTP port gives the body its deadline
(``LANE_HTTP_BODY_TIMEOUT_SECONDS``) and reads what is left of a refused one before answering.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import grpc
from connectrpc._protocol import ConnectWireError
from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError
from google.protobuf import json_format
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.connect import HttpContext
from lane.server.api.connect_errors import refusal_error, status_message
from lane.server.api.errors import error_answer
from lane.server.api.host_check import HostCheck
from lane.server.api.servicer import LaneServicer, _method_handlers
from lane.server.api.transfer_rpcs import MAX_IMPORT_BYTES
from lane.server.api.validation import payload_too_large

#: Where the HTTP port takes an export file to import.
UPLOAD_PATH = "/upload/lane.v1.LaneService/ImportLane"


class _BodyCut(asyncio.CancelledError):
    """The upload's body failed to arrive (its deadline passed, or the client left): the import
    stops as a call whose client cancelled stops, and the caller answers ``error``.

    A CancelledError, so the handler's error table (which answers any Exception) lets it
    through: a file cut short must never be taken for a whole one."""

    def __init__(self, error: ConnectError) -> None:
        super().__init__(error.message)
        self.error = error


class ImportUpload:
    """The ASGI application of :data:`UPLOAD_PATH` (module docstring)."""

    def __init__(self, servicer: LaneServicer, hosts: HostCheck) -> None:
        handler: Any = _method_handlers(servicer)["ImportLane"].stream_unary
        self._import: Callable[[AsyncIterator[bytes], Any], Awaitable[Any]] = handler
        self._authenticator = servicer.authenticator
        self._hosts = hosts

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """Answer one upload."""
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            body = b"method not allowed: POST the export file\n"
            plain = [(b"content-type", b"text/plain; charset=utf-8"), (b"allow", b"POST")]
            await _answer(send, 405, plain, body)
            return
        metadata = [
            (key.decode("latin-1").lower(), value.decode("latin-1"))
            for key, value in scope["headers"]
        ]
        headers = dict(metadata)
        refusal = self._hosts.refusal(headers.get("host"), headers.get("origin"))
        if refusal is None:
            namespace = self._authenticator.namespace_of(metadata)
            refusal = None if isinstance(namespace, str) else namespace
        if refusal is not None:
            await _refused(send, refusal_error(status_message(refusal)))
            return
        size = headers.get("content-length", "")
        if size.isdigit() and int(size) > MAX_IMPORT_BYTES:
            too_large = payload_too_large("data", int(size), MAX_IMPORT_BYTES)
            await _refused(send, refusal_error(error_answer(too_large)[0]))
            return
        query = parse_qs(scope["query_string"].decode("latin-1"))
        lane_id = (query.get("lane_id") or [""])[0]
        context = HttpContext(metadata, None)
        try:
            answer = await self._import(_pieces(receive, lane_id), context)
        except _BodyCut as cut:
            await _refused(send, cut.error)
            return
        except grpc.aio.AbortError:
            await _refused(send, context.connect_error())
            return
        except Exception as exc:  # the handler answers through its context; this is a fault
            await _refused(send, refusal_error(error_answer(exc)[0]))
            return
        text = json_format.MessageToJson(answer, indent=None, ensure_ascii=False)
        await _answer(send, 200, [(b"content-type", b"application/json")], text.encode())


async def _pieces(receive: ASGIReceiveCallable, lane_id: str) -> AsyncIterator[bytes]:
    """The body as encoded ImportLaneRequests: the first names the lane, each carries the
    bytes as they arrived."""
    first = True
    while True:
        try:
            message: Any = await receive()
        except ConnectError as error:  # the body's deadline (http_server._RequestBody)
            raise _BodyCut(error) from None
        if message["type"] == "http.disconnect":
            raise _BodyCut(ConnectError(ConnectCode.CANCELED, "the client left mid-upload"))
        data = message.get("body", b"")
        if first or data:
            piece = pb.ImportLaneRequest(lane_id=lane_id if first else "", data=data)
            yield piece.SerializeToString()
        first = False
        if not message.get("more_body", False):
            return


async def _refused(send: ASGISendCallable, error: ConnectError) -> None:
    wire = ConnectWireError.from_exception(error)
    status = int(wire.to_http_status().code)
    await _answer(send, status, [(b"content-type", b"application/json")], wire.to_json_bytes())


async def _answer(
    send: ASGISendCallable, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
