"""Structured logs: the request a log line belongs to, and the two log formats.

A cross-cutting module like ``service/lane/server/metrics.py``: it imports nothing of the service.
The api layer opens a :func:`request_scope` around every RPC and :func:`bind` s the lane, namespace
and operation ids once the request is decoded; :class:`RequestFields` then adds them to every log
record emitted while the RPC is served (in its task and in tasks it starts), as the record
attributes ``rpc``, ``namespace``, ``lane_id`` and ``operation_id`` — each only when known.

``LANE_LOG_FORMAT=json`` (:func:`configure`) writes one JSON object per line: ``time`` (ISO 8601,
UTC), ``level``, ``logger``, ``message``, those request attributes, any ``extra=`` values of the
call, and ``exc_info`` for exceptions. ``text`` (the default) is the classic
``time level logger: message`` line with the request attributes appended in brackets.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, fields

from pythonjsonlogger.json import JsonFormatter

#: The values of ``LANE_LOG_FORMAT``.
LOG_FORMATS = ("text", "json")


@dataclass(slots=True)
class Request:
    """What is known about the request being served; empty strings are unknown."""

    rpc: str
    namespace: str = ""
    lane_id: str = ""
    operation_id: str = ""

    def items(self) -> Iterator[tuple[str, str]]:
        """The known fields as (record attribute, value)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value:
                yield f.name, value


_current: ContextVar[Request | None] = ContextVar("lane_request", default=None)


class request_scope:  # lower case: used like the function it was
    """Mark log records emitted inside the block (and in tasks started in it) as serving
    ``rpc``; :func:`bind` adds the ids once they are known. A class rather than a generator
    context manager: it runs around every RPC, and costs a third as much."""

    __slots__ = ("_request", "_token")

    def __init__(self, rpc: str) -> None:
        self._request = Request(rpc)

    def __enter__(self) -> Request:
        self._token = _current.set(self._request)
        return self._request

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


def bind(*, namespace: str = "", lane_id: str = "", operation_id: str = "") -> None:
    """Record ids of the request being served (empty values leave a field as it is). Outside
    a :func:`request_scope` it does nothing."""
    request = _current.get()
    if request is None:
        return
    request.namespace = namespace or request.namespace
    request.lane_id = lane_id or request.lane_id
    request.operation_id = operation_id or request.operation_id


def current() -> Request | None:
    """The request being served, if any."""
    return _current.get()


class RequestFields(logging.Filter):
    """Adds the served request's fields to each record (never overriding an ``extra=``).

    Install it on handlers: a logger's filters do not see records propagated from its children.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        request = _current.get()
        if request is not None:
            for name, value in request.items():
                if not hasattr(record, name):
                    setattr(record, name, value)
        return True


class TextFormatter(logging.Formatter):
    """``time level logger: message``, then ``[rpc=... lane_id=...]`` when serving a request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        known = [(f.name, getattr(record, f.name, "")) for f in fields(Request)]
        context = " ".join(f"{name}={value}" for name, value in known if value)
        if not context:
            return line
        first, newline, rest = line.partition("\n")  # keep a traceback below the context
        return f"{first} [{context}]{newline}{rest}"


def json_formatter() -> logging.Formatter:
    """One JSON object per record; see the module docstring."""
    return JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )


def configure(log_format: str = "text", level: int = logging.INFO) -> None:
    """Log ``level`` and above to stderr in ``log_format`` (``text`` or ``json``), with request
    fields, unless the application configured logging already (the root has handlers)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(json_formatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestFields())
    logging.basicConfig(level=level, handlers=[handler])
