"""A provider SDK's exception as a :class:`~lane.client.model.ModelError`.

Both official SDKs raise an ``APIStatusError`` with ``status_code``, ``response`` (its headers)
and ``body`` for an HTTP error, an ``APIConnectionError`` when no answer came, and an
``APIError`` with ``body`` for an error event inside a stream. The mapping:

* retryable: HTTP 408, 409, 429 and 5xx (529 is Anthropic's "overloaded"), no answer at all,
  and a stream's error event whose type is an overload, a rate limit or a server error;
* ``retry_after``: the ``retry-after-ms`` header (milliseconds), else ``retry-after`` (seconds,
  or an HTTP date);
* the message: the provider's own (``error.message`` of the body), else the exception's text.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from lane.client.model import ModelError

__all__ = ["model_error", "retry_after", "stream_error"]

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


def model_error(err: BaseException, *, connection_error: type[BaseException]) -> ModelError:
    """``err`` (from a provider SDK) as a :class:`ModelError`; ``connection_error`` is the
    SDK's class for a request that got no answer."""
    message = provider_message(err)
    if isinstance(err, connection_error):
        return ModelError(message, retryable=True)
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
