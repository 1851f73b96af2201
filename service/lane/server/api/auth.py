"""Bearer-token auth: each token admits its holder to one namespace's lanes.

Callers send ``authorization: Bearer <token>`` in the request metadata. Every LaneService call
is authenticated before its request is even decoded; the namespace it resolves to is the
caller's for the rest of the call (:func:`caller_namespace`), and every lane the call names is
looked up in that namespace only — so a lane of another namespace answers exactly as a lane that
does not exist. Without configured tokens every caller is in :data:`DEFAULT_NAMESPACE` (the app
layer allows that only on a loopback address).

Tokens are configured as ``namespace:token`` pairs (see :func:`parse_tokens`); the service keeps
only their SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import grpc
from google.rpc import code_pb2

from lane.server.api.errors import status_of
from lane.server.store import DEFAULT_NAMESPACE

NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")

_caller: ContextVar[str] = ContextVar("lane_caller_namespace")


class TokenError(ValueError):
    """A token configuration that cannot be used; the message says which pair and why."""


def parse_tokens(text: str) -> dict[str, str]:
    """``namespace:token`` pairs separated by whitespace, commas or newlines (``#`` starts a
    comment) → {token: namespace}. A token named twice must name one namespace."""
    tokens: dict[str, str] = {}
    for line_number, line in enumerate(text.splitlines(), start=1):
        for pair in line.split("#", 1)[0].replace(",", " ").split():
            namespace, colon, token = pair.partition(":")
            where = f"line {line_number}: " if "\n" in text.strip() else ""
            if not colon or not NAMESPACE_PATTERN.fullmatch(namespace):
                raise TokenError(
                    f"{where}expected namespace:token, the namespace being 1-64 letters, "
                    "digits, '.', '_' or '-' (starting with a letter or digit)"
                )
            if not TOKEN_PATTERN.fullmatch(token):
                raise TokenError(
                    f"{where}the token of namespace {namespace!r} must be 16-512 characters "
                    "of A-Z a-z 0-9 - . _ ~ + / ="
                )
            if tokens.setdefault(token, namespace) != namespace:
                raise TokenError(f"{where}one token is given to two namespaces")
    return tokens


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Authenticator:
    """Maps a call's bearer token to its namespace. Create with the ``{token: namespace}`` of
    :func:`parse_tokens`; an empty mapping turns auth off."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        # Only digests are kept: a dump of the process does not hand out tokens, and a dict
        # lookup by digest leaks nothing useful through its timing.
        self._namespaces = {_digest(token): namespace for token, namespace in tokens.items()}

    def namespace_of(self, metadata: Any) -> str | grpc.Status:
        """The namespace the call's token admits it to, or the UNAUTHENTICATED status."""
        if not self._namespaces:
            return DEFAULT_NAMESPACE
        values = [value for key, value in metadata or () if key == "authorization"]
        if not values:
            return _unauthenticated(
                "TOKEN_MISSING", "this service needs 'authorization: Bearer <token>' metadata"
            )
        scheme, _, token = str(values[0]).strip().partition(" ")
        namespace = self._namespaces.get(_digest(token.strip()))
        if len(values) > 1 or scheme.lower() != "bearer" or namespace is None:
            return _unauthenticated(
                "TOKEN_UNKNOWN", "the bearer token is not one this service knows"
            )
        return namespace

    def admit(self, metadata: Any) -> grpc.Status | None:
        """Authenticate a call: set its namespace for :func:`caller_namespace` (None), or
        return the UNAUTHENTICATED status to end it with."""
        namespace = self.namespace_of(metadata)
        if isinstance(namespace, str):
            _caller.set(namespace)
            return None
        return namespace


def caller_namespace() -> str:
    """The namespace of the call being served (set by :meth:`Authenticator.admit`)."""
    return _caller.get()


def _unauthenticated(reason: str, message: str) -> grpc.Status:
    return status_of(code_pb2.UNAUTHENTICATED, reason, message, {})
