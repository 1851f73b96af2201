"""Idempotent requests: a retried request id returns the first answer and commits nothing.

The stored answer is written in the same transaction as the command it answers, so a request
id is recorded if and only if its command committed. The store keeps answers in a recorded form
(a message) that the command gives it with the key (:class:`Recording`); it never builds one.

A request answered in more than one commit (StageToolOutcome: staging, then placement) records
each later step under its own key, :meth:`RequestKey.step`: the request id, U+001F (the
ASCII unit separator) and the step's name, e.g. ``"<id>\x1fplace"``. A request id is printable
(service/lane/server/api/validation.py), so no request id a client sends can be a step's key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from psycopg import AsyncConnection

from lane.server.domain.errors import AlreadyExists
from lane.server.store.codec import decode, encode
from lane.server.store.lane_ref import LaneRef

R = TypeVar("R", bound=Message)
A = TypeVar("A")

#: Between a request id and a step's name in the key of a later step's answer (never printable,
#: so never in a request id).
STEP_SEPARATOR = "\x1f"


@dataclass(frozen=True)
class RequestKey:
    """A mutating request's identity: its id, its method, and a digest of its content."""

    request_id: str
    method: str
    digest: bytes

    @classmethod
    def of(cls, method: str, request: Message, request_id: str) -> RequestKey | None:
        """The key of ``request`` (None without a request id). The id itself is not hashed."""
        if not request_id:
            return None
        content = type(request)()
        content.CopyFrom(request)
        content.ClearField("request_id")
        digest = hashlib.sha256(encode(content)).digest()
        return cls(request_id=request_id, method=method, digest=digest)

    def step(self, name: str) -> RequestKey:
        """The key of this request's step ``name``: a later commit of the same request, whose
        answer is kept apart from the first one's (same method and content digest)."""
        return RequestKey(f"{self.request_id}{STEP_SEPARATOR}{name}", self.method, self.digest)


@dataclass(frozen=True)
class Recording(Generic[A]):
    """How a command's answer of type ``A`` is kept under its request's key: as a message of
    type ``form``, made by ``encode`` and read back by ``decode``."""

    key: RequestKey
    form: type[Message]
    encode: Callable[[A], Message]
    decode: Callable[[Message], A]


async def replayed_answer(
    conn: AsyncConnection[Any], lane: LaneRef, key: RequestKey, answer_type: type[R]
) -> R | None:
    """The stored answer for ``key``, None when the id is new; refuses a reused id."""
    cur = await conn.execute(
        "SELECT method, request_hash, response FROM requests"
        " WHERE namespace = %(ns)s AND lane_id = %(lane)s AND request_id = %(request)s",
        {**lane.params, "request": key.request_id},
    )
    row = await cur.fetchone()
    if row is None:
        return None
    method, digest, response = row
    if method != key.method or bytes(digest) != key.digest:
        raise AlreadyExists(
            "REQUEST_ID_REUSED",
            f"request id {key.request_id} was already used for a different request",
            requestId=key.request_id,
            method=method,
        )
    return decode(answer_type, response)


async def earlier_answer(
    conn: AsyncConnection[Any], lane: LaneRef, request: Recording[A] | None
) -> tuple[A] | None:
    """The answer a retried request got the first time, in a 1-tuple (an answer may be
    anything); None without a request id or when the id is new. Refuses a reused id."""
    if request is None:
        return None
    replay = await replayed_answer(conn, lane, request.key, request.form)
    return None if replay is None else (request.decode(replay),)
