"""Identifiers: time-ordered UUIDv7, as the lane model mints them.

Transitions never call this themselves; callers pass ``new_id`` in, so tests can use a
deterministic factory.
"""

from __future__ import annotations

import uuid6


def new_id() -> str:
    """A fresh time-ordered id (UUIDv7)."""
    return str(uuid6.uuid7())
