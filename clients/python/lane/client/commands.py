"""Calling the lane service's commands safely: request ids, retries, typed errors.

:func:`call` sends one unary request. A mutating request (one with a ``request_id`` field)
gets a fresh request id when it has none, and every retry reuses it, so a command whose answer
was lost commits once and the retry returns the first answer (docs/contract.md). Retried: the
transport failures UNAVAILABLE and DEADLINE_EXCEEDED (a restarting or overloaded server) and
RESOURCE_EXHAUSTED ``DATABASE_BUSY`` (every database connection of the server was busy; nothing
was written), with capped exponential backoff, until ``retry_seconds`` have passed; each
attempt may take ``attempt_timeout`` seconds. Every other failure raises
:class:`~lane.client.errors.LaneError` at once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import TypeVar

import grpc
from google.protobuf.message import Message
from lane.client.errors import LaneError, lane_error

__all__ = ["RETRYABLE_CODES", "call", "is_retryable", "new_request_id"]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")

#: Codes :func:`call` retries (with the same request id).
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: The ErrorInfo reason of a refusal :func:`call` also retries: RESOURCE_EXHAUSTED, the server's
#: database connections were all busy.
DATABASE_BUSY = "DATABASE_BUSY"


def new_request_id() -> str:
    """A fresh request id."""
    return uuid.uuid4().hex


async def call(
    rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    *,
    retry_seconds: float = 30.0,
    attempt_timeout: float | None = 30.0,
) -> Resp:
    """Send ``request`` through ``rpc``, retrying transport failures; see the module doc."""
    fields = request.DESCRIPTOR.fields_by_name
    if "request_id" in fields and not getattr(request, "request_id"):  # noqa: B009
        setattr(request, "request_id", new_request_id())  # noqa: B010
    deadline = time.monotonic() + retry_seconds
    attempt = 0
    while True:
        try:
            return await rpc(request, timeout=attempt_timeout)
        except grpc.aio.AioRpcError as err:
            error = lane_error(err)
        attempt += 1
        if not is_retryable(error) or time.monotonic() >= deadline:
            raise error
        delay = min(2.0, 0.1 * 2 ** min(attempt - 1, 8)) * (0.5 + random.random() / 2)
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))


def is_retryable(error: LaneError) -> bool:
    """Whether :func:`call` (and :class:`~lane.client.session.LaneSession`) sends a command
    refused with ``error`` again: a transport failure, or every database connection busy."""
    if error.code in RETRYABLE_CODES:
        return True
    return error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == DATABASE_BUSY


def is_reason(error: BaseException, code: grpc.StatusCode, *reasons: str) -> bool:
    """Whether ``error`` is a :class:`LaneError` with ``code`` and one of ``reasons``."""
    return isinstance(error, LaneError) and error.code == code and error.reason in reasons
