"""What the HTTP port checks of a call from its headers alone, before its body is read.

connectrpc reads, decompresses and decodes a request body before it calls a method; only a
metadata interceptor at the front of its chain runs earlier (:class:`Admission`). There,
before a byte of the body is read, the call's ``Host`` and ``Origin`` are checked (auth off:
``host_check.py``) and its bearer token: a call without a valid one is answered
UNAUTHENTICATED ``TOKEN_MISSING`` / ``TOKEN_UNKNOWN``, as on the gRPC port, and its body is
never decompressed nor parsed.

The same interceptor gives connectrpc's own refusals of a body the reasons the service
documents: a message over the 4 MiB limit — as sent, or once decompressed, which connectrpc
stops one byte past the limit — is RESOURCE_EXHAUSTED ``REQUEST_TOO_LARGE``, a body it cannot
decompress or unframe INVALID_ARGUMENT ``MALFORMED_REQUEST``.
"""

from __future__ import annotations

import time
from typing import Any

from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError
from connectrpc.method import StreamType
from connectrpc.request import RequestContext
from google.rpc import code_pb2, status_pb2
from lane.limits import MAX_MESSAGE_BYTES

from lane.server.api.auth import Authenticator
from lane.server.api.connect_errors import refused_before_handler, status_message
from lane.server.api.errors import rich_status
from lane.server.api.host_check import HostCheck


class Admission:
    """A connectrpc metadata interceptor: Host, Origin and token before the body is read."""

    def __init__(self, authenticator: Authenticator, hosts: HostCheck) -> None:
        self._authenticator = authenticator
        self._hosts = hosts

    async def on_start(self, ctx: RequestContext[Any, Any]) -> float:
        """Refuse a call of a host not served or without a valid token; else its start time."""
        started = time.perf_counter()
        headers = ctx.request_headers
        refusal = self._hosts.refusal(headers.get("host"), headers.get("origin"))
        if refusal is None:
            metadata = [("authorization", value) for value in headers.getall("authorization")]
            namespace = self._authenticator.namespace_of(metadata)
            refusal = None if isinstance(namespace, str) else namespace
        if refusal is not None:
            raise _refused(ctx, status_message(refusal), started)
        return started

    async def on_end(
        self, started: float, ctx: RequestContext[Any, Any], error: Exception | None
    ) -> None:
        """Give connectrpc's refusals of a body (they carry no details) the service's reason."""
        if not isinstance(error, ConnectError) or error.details:
            return
        if error.code == ConnectCode.RESOURCE_EXHAUSTED:
            status = rich_status(
                code_pb2.RESOURCE_EXHAUSTED,
                "REQUEST_TOO_LARGE",
                f"the request message is larger than {MAX_MESSAGE_BYTES} bytes "
                "(once decompressed); it was not read further",
                {"limit": str(MAX_MESSAGE_BYTES)},
            )
        elif error.code == ConnectCode.INVALID_ARGUMENT:
            status = rich_status(
                code_pb2.INVALID_ARGUMENT,
                "MALFORMED_REQUEST",
                f"the request body cannot be read: {error.message}",
                {},
            )
        else:
            return
        raise _refused(ctx, status, started)


def _refused(
    ctx: RequestContext[Any, Any], status: status_pb2.Status, started: float
) -> ConnectError:
    method = ctx.method
    return refused_before_handler(
        method.name, method.stream_type == StreamType.UNARY, status, started
    )
