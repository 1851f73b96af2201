"""A provider SDK's exception as a :class:`~lane.client.model.ModelError`, and the timeouts
every adapter sets.

Both official SDKs raise an ``APIStatusError`` with ``status_code``, ``response`` (its headers)
and ``body`` for an HTTP error, an ``APIConnectionError`` (``APITimeoutError``) when no answer
came, and an ``APIError`` with ``body`` for an error event inside a stream. While a stream is
read, they also let through their HTTP library's own errors (``httpx2``'s or ``httpx``'s
``RemoteProtocolError`` for a connection dropped mid-answer, ``ReadTimeout`` for a provider
that went silent) and a chunk that is not JSON (``JSONDecodeError``). The mapping:

* retryable: HTTP 408, 409, 429 and 5xx (529 is Anthropic's "overloaded"); every transport
  fault — no connection, a connect or read timeout, a connection dropped mid-stream, an
  incomplete body, a malformed stream chunk — with a message saying which; and a stream's
  error event whose type is an overload, a rate limit or a server error;
* not retried: every other HTTP error (400, 401, 403, 404, 422, ...), with the provider's
  message;
* ``retry_after``: the ``retry-after-ms`` header (milliseconds), else ``retry-after`` (seconds,
  or an HTTP date); the driver fails a run whose provider asks for more than its cap
  (``Driver(max_retry_after=...)``, 60 s by default);
* the message: the provider's own (``error.message`` of the body), else the exception's text.

:class:`Timeouts`: how long an adapter waits to connect to the provider (10 s by default) and
for the next chunk of an answer (60 s of silence), passed with every request, so the SDKs'
defaults (10 minutes a read) never freeze an agent.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import importlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lane.client.model import ModelError

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "READ_TIMEOUT_SECONDS",
    "Timeouts",
    "fault",
    "model_error",
    "provider_errors",
    "retry_after",
    "stream_error",
]


#: Seconds an adapter waits for a connection to its provider.
CONNECT_TIMEOUT_SECONDS = 10.0
#: Seconds of silence in a provider's answer (before its headers, or between two chunks) after
#: which an adapter gives the attempt up: long enough for a model thinking before it streams.
READ_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long an adapter waits: ``connect`` seconds for a connection to the provider,
    ``read`` seconds of silence between two chunks of its answer (or before its headers)."""

    connect: float = CONNECT_TIMEOUT_SECONDS
    read: float = READ_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not (self.connect > 0 and self.read > 0):
            raise ValueError("timeouts are seconds > 0")

    def sdk(self, timeout_class: Any) -> Any:
        """As the SDK's ``Timeout`` (an ``httpx`` one): ``read`` also bounds a write and the
        wait for a pooled connection."""
        return timeout_class(self.read, connect=self.connect)


@functools.cache
def _http_errors() -> tuple[type[BaseException], ...]:
    """The request errors of the HTTP libraries the SDKs use (``httpx2``, ``httpx``), those
    installed."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found.append(module.RequestError)
    return tuple(found)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from (``raise ... from``: the SDKs keep the HTTP
    library's error so), outermost first. Not the ones merely being handled when it was raised:
    an HTTP error whose body did not parse is the HTTP error."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__
    return seen


@contextlib.contextmanager
def provider_errors(
    *,
    api_error: type[BaseException],
    connection_error: type[BaseException],
    timeouts: Timeouts | None = None,
) -> Iterator[None]:
    """Raise what the block raises as a :class:`ModelError`: the SDK's ``api_error`` (as
    :func:`model_error` maps it) and every transport fault or malformed chunk (:func:`fault`);
    anything else as it is."""
    try:
        yield
    except ModelError:
        raise
    except Exception as err:
        if isinstance(err, api_error):
            raise model_error(err, connection_error=connection_error, timeouts=timeouts) from err
        failure = fault(err, timeouts)
        if failure is None:
            raise
        raise failure from err


def fault(err: BaseException, timeouts: Timeouts | None = None) -> ModelError | None:
    """``err`` as a retryable :class:`ModelError` when it is a transport fault (of the HTTP
    library, anywhere in its chain) or a malformed stream chunk; None otherwise."""
    for cause in _chain(err):
        kind = type(cause).__name__
        if isinstance(cause, (json.JSONDecodeError, UnicodeDecodeError)):
            message = f"the provider sent a malformed stream chunk ({cause})"
            return ModelError(message, retryable=True)
        if not isinstance(cause, _http_errors()):
            continue
        detail = str(cause) or kind
        if kind == "ReadTimeout":
            after = f" for {timeouts.read:g}s" if timeouts else ""
            return ModelError(f"the provider sent nothing{after} (read timeout)", retryable=True)
        if kind == "ConnectTimeout":
            within = f" within {timeouts.connect:g}s" if timeouts else ""
            return ModelError(
                f"could not connect to the provider{within} (connect timeout)", retryable=True
            )
        if "Timeout" in kind:
            return ModelError(f"the provider timed out ({kind})", retryable=True)
        return ModelError(f"the connection to the provider failed: {detail}", retryable=True)
    return None


_RETRYABLE_STATUS = frozenset({408, 409, 429})
_RETRYABLE_TYPES = frozenset(
    {
        "overloaded_error",
        "rate_limit_error",
        "api_error",
        "server_error",
        "rate_limit_exceeded",
        "timeout_error",
    }
)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the provider asks to wait, from its response headers; None when it says not."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_object(body: Any) -> Mapping[str, Any] | None:
    if isinstance(body, Mapping):
        inner = body.get("error")
        return inner if isinstance(inner, Mapping) else body
    return None


def provider_message(err: BaseException) -> str:
    """The provider's explanation of ``err``."""
    error = _error_object(getattr(err, "body", None))
    if error is not None:
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    return str(err) or type(err).__name__


def model_error(
    err: BaseException,
    *,
    connection_error: type[BaseException],
    timeouts: Timeouts | None = None,
) -> ModelError:
    """``err`` (from a provider SDK) as a :class:`ModelError`; ``connection_error`` is the
    SDK's class for a request that got no answer (a transport fault: :func:`fault` says
    which, when the SDK kept the HTTP library's error as its cause)."""
    message = provider_message(err)
    if isinstance(err, connection_error):
        return fault(err, timeouts) or ModelError(message, retryable=True)
    status = getattr(err, "status_code", None)
    response = getattr(err, "response", None)
    headers = getattr(response, "headers", None)
    error = _error_object(getattr(err, "body", None)) or {}
    kind = error.get("type") or error.get("code")
    if isinstance(status, int) and status >= 400:
        retryable = status in _RETRYABLE_STATUS or status >= 500 or kind in _RETRYABLE_TYPES
        return ModelError(
            message, retryable=retryable, retry_after=retry_after(headers), status=status
        )
    # An error event inside a stream (the HTTP answer itself was 200).
    return ModelError(message, retryable=kind in _RETRYABLE_TYPES)


def stream_error(message: str, kind: str | None = None) -> ModelError:
    """An error a stream reported in an event of its own (of type or code ``kind``), or a
    stream that ended before its final event (retryable: the answer was cut short)."""
    return ModelError(message, retryable=kind is None or kind in _RETRYABLE_TYPES)
