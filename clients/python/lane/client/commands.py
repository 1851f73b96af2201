"""Calling the lane service's commands safely: request ids, retries, typed errors.

:func:`call` sends one unary request. A mutating request (one with a ``request_id`` field)
gets a fresh request id when it has none, and every retry reuses it, so a command whose answer
was lost commits once and the retry returns the first answer (docs/contract.md, Requests and
errors). Retried (:func:`is_retryable`): the transport failures UNAVAILABLE and
DEADLINE_EXCEEDED (a restarting or overloaded server) and RESOURCE_EXHAUSTED ``DATABASE_BUSY``
(every database connection of the server was busy; nothing was written), paced and bounded by
a :class:`~lane.client.retry.RetryPolicy`; each attempt may take ``attempt_timeout`` seconds.
Every other failure raises its :class:`~lane.client.errors.LaneError` at once; so does the last
failure once the policy gives up, saying how many attempts it made (``LaneError.gave_up``).
"""

from __future__ import annotations

import time
import uuid
from typing import TypeVar

import grpc
from google.protobuf.message import Message
from lane.client.errors import LaneError, lane_error, reason_name
from lane.client.retry import COMMAND_RETRY, RetryPolicy
from lane.v1 import reasons_pb2

__all__ = ["RETRYABLE_CODES", "call", "giving_up", "is_retryable", "new_request_id"]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")

#: Codes :func:`call` retries (with the same request id).
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: The refusal :func:`call` also retries: RESOURCE_EXHAUSTED, the server's database
#: connections were all busy.
_DATABASE_BUSY = reason_name(reasons_pb2.REASON_DATABASE_BUSY)


def new_request_id() -> str:
    """A fresh request id."""
    return uuid.uuid4().hex


def with_request_id(request: Message) -> bool:
    """Give ``request`` a fresh request id if it takes one and has none; whether it takes one."""
    if "request_id" not in request.DESCRIPTOR.fields_by_name:
        return False
    if not getattr(request, "request_id"):  # noqa: B009
        setattr(request, "request_id", new_request_id())  # noqa: B010
    return True


async def call(
    rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    *,
    retry: RetryPolicy = COMMAND_RETRY,
    retry_seconds: float | None = None,
    attempt_timeout: float | None = 30.0,
) -> Resp:
    """Send ``request`` through ``rpc``, retrying transport failures as ``retry`` says
    (``retry_seconds``, if given, replaces its timeout); see the module doc."""
    if retry_seconds is not None:
        retry = retry.with_timeout(retry_seconds)
    with_request_id(request)
    started = time.monotonic()
    deadline = retry.deadline()
    attempt = 0
    while True:
        try:
            return await rpc(request, timeout=attempt_timeout)
        except grpc.aio.AioRpcError as err:
            error = lane_error(err)
        attempt += 1
        if not is_retryable(error):
            raise error
        if retry.gives_up(attempt, deadline):
            raise giving_up(error, attempt, started)
        await retry.backoff(attempt, deadline)


def giving_up(error: LaneError, attempts: int, started: float) -> LaneError:
    """``error``, the last of ``attempts`` made since ``started`` (``time.monotonic()``),
    marked as the one a retry gave up on when there was more than one attempt: its text then
    says so (``... (gave up after 14 attempts in 30.0s)``)."""
    if attempts > 1:
        error.gave_up = (attempts, time.monotonic() - started)
    return error


def is_retryable(error: LaneError) -> bool:
    """Whether :func:`call` (and :class:`~lane.client.session.LaneSession`) sends a command
    refused with ``error`` again: a transport failure, or every database connection busy."""
    if error.code in RETRYABLE_CODES:
        return True
    return error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == _DATABASE_BUSY
