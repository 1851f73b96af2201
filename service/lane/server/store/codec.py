"""Protobuf bodies in bytea columns: encode once, decode on read."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    """Deterministic bytes, so equal messages store equal bodies."""
    return message.SerializeToString(deterministic=True)


def decode(kind: type[M], body: bytes | None) -> M:
    """Parse ``body`` as ``kind`` (an empty message for NULL)."""
    message = kind()
    if body:
        message.ParseFromString(body)
    return message


def decode_optional(kind: type[M], body: bytes | None) -> M | None:
    """Parse ``body`` as ``kind``, or None for NULL."""
    return None if body is None else decode(kind, body)
