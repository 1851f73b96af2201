"""Joining messages the service sent in parts (lane.v1.MessagePart).

A WatchLaneResponse or DriveLaneResponse over the service's message limit (4 MiB) comes as
consecutive messages of the same type holding only ``part``: the bytes of all parts joined are
the whole message's encoding, and every part but the last says it continues. :class:`PartJoiner`
takes the stream's messages one by one and hands back whole ones only, so a client folding the
stream never sees, let alone applies, part of an event group.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from google.protobuf.message import DecodeError, Message

__all__ = ["PartJoiner", "PartsError"]

M = TypeVar("M", bound=Message)


class PartsError(Exception):
    """The parts of a message broke the protocol: a message came between them, or they do not
    join into a message of their type."""


class PartJoiner(Generic[M]):
    """Joins the parts of one stream's messages (one joiner per stream)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    @property
    def pending(self) -> bool:
        """Some parts arrived and the message's last part has not."""
        return bool(self._parts)

    def take(self, message: M) -> M | None:
        """``message`` itself when it is whole; None for a part that continues; the joined
        message for the last part. Raises :class:`PartsError` when a whole message arrives
        while parts wait, or when the parts do not decode."""
        if not message.HasField("part"):
            if self._parts:
                raise PartsError(
                    f"a whole {message.DESCRIPTOR.name} arrived between the parts of another"
                )
            return message
        part = getattr(message, "part")  # noqa: B009 (typed per message type)
        if not part.data:
            raise PartsError(f"an empty part of a {message.DESCRIPTOR.name}")
        self._parts.append(part.data)
        if part.continues:
            return None
        data, self._parts = b"".join(self._parts), []
        whole = type(message)()
        try:
            whole.ParseFromString(data)
        except DecodeError as exc:
            raise PartsError(f"the parts of a {message.DESCRIPTOR.name} do not decode") from exc
        if whole.HasField("part"):
            raise PartsError(f"the parts of a {message.DESCRIPTOR.name} join into a part")
        return whole
