"""Free-form JSON carried as text: validated, never re-encoded.

The contract carries tool arguments, details and custom data as JSON text so that every value
(including integers beyond 2^53) round-trips unchanged. The service only checks that the text
parses; it stores and streams the exact bytes it was given.
"""

from __future__ import annotations

import json

from lane.server.domain.errors import InvalidArgument


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str, field: str) -> object:
    """Parse ``text`` as strict JSON (no NaN/Infinity) or refuse naming ``field``."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(
            "INVALID_JSON", f"{field} is not valid JSON: {exc}", field=field
        ) from None


def require_json_object(text: str, field: str) -> None:
    """Refuse unless ``text`` is a JSON object."""
    if not isinstance(parse_json(text, field), dict):
        raise InvalidArgument("INVALID_JSON", f"{field} must be a JSON object", field=field)
