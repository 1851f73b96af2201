"""Fair shares: concurrent holders of one kind of slot, capped per process and per namespace.

A WatchLane stream, a DriveLane session, an ExportLane or ImportLane call each hold a slot of
their kind for as long as they run. Without a cap per namespace, one tenant's streams (stalled
watchers, a burst of exports) could take every slot of the process and lock the others out of
their own lanes. With it, a namespace at its cap is refused on its own account, and the
process's other slots stay for the other namespaces: one namespace at its cap never refuses
another, as long as the namespace cap is below the process's (the app layer sets it so only
when the tokens name two or more namespaces; otherwise the process cap is the only one).

A refusal is RESOURCE_EXHAUSTED with the kind's reason (``TOO_MANY_WATCHERS``,
``TOO_MANY_SESSIONS``, ``TOO_MANY_TRANSFERS``), metadata ``scope`` (``namespace`` or
``process``), the count held and the limit, and a ``google.rpc.RetryInfo`` delay. Counting is
plain arithmetic on the event loop: no lock, no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from lane.limits import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_NAMESPACE,
    DEFAULT_MAX_TRANSFERS,
    DEFAULT_MAX_TRANSFERS_PER_NAMESPACE,
)

from lane.server.api.auth import Authenticator
from lane.server.api.call import Call
from lane.server.api.errors import lane_error_status
from lane.server.domain.errors import ResourceExhausted

#: How long a refused caller is asked to wait before trying again (google.rpc.RetryInfo).
DEFAULT_RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class ShareLimits:
    """The caps of one kind of slot."""

    per_process: int
    per_namespace: int


@dataclass(frozen=True)
class ShareSettings:
    """The caps of DriveLane sessions and of ExportLane/ImportLane calls (transfers); the
    watchers' are in ``WatchSettings``."""

    sessions: ShareLimits = ShareLimits(DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SESSIONS_PER_NAMESPACE)
    transfers: ShareLimits = ShareLimits(DEFAULT_MAX_TRANSFERS, DEFAULT_MAX_TRANSFERS_PER_NAMESPACE)
    retry_seconds: float = DEFAULT_RETRY_SECONDS


class Share:
    """A held slot; :meth:`release` (or leaving its ``with`` block) gives it back, once."""

    __slots__ = ("_namespace", "_shares")

    def __init__(self, shares: FairShares, namespace: str) -> None:
        self._shares: FairShares | None = shares
        self._namespace = namespace

    def release(self) -> None:
        """Give the slot back (again: nothing)."""
        shares, self._shares = self._shares, None
        if shares is not None:
            shares._release(self._namespace)

    def __enter__(self) -> Share:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class FairShares:
    """The slots of one kind (``noun``: ``watchers``, ``sessions``, ...) held in this process,
    counted per namespace; :meth:`acquire` refuses past either cap with ``reason``."""

    def __init__(
        self,
        noun: str,
        reason: str,
        limits: ShareLimits,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> None:
        self.noun = noun
        self.reason = reason
        self.limits = limits
        self.retry_seconds = retry_seconds
        self._held = 0
        self._by_namespace: dict[str, int] = {}

    def held(self, namespace: str | None = None) -> int:
        """Slots held in this process (of one namespace, or in all)."""
        if namespace is None:
            return self._held
        return self._by_namespace.get(namespace, 0)

    def acquire(self, namespace: str, **metadata: object) -> Share:
        """A slot for ``namespace``, or the refusal raised (``metadata`` goes into it)."""
        refusal = self.refusal(namespace, **metadata)
        if refusal is not None:
            raise refusal
        self._held += 1
        self._by_namespace[namespace] = self._by_namespace.get(namespace, 0) + 1
        return Share(self, namespace)

    def refusal(self, namespace: str, **metadata: object) -> ResourceExhausted | None:
        """The refusal :meth:`acquire` would raise now, or None when a slot is free."""
        held = self._by_namespace.get(namespace, 0)
        per_namespace = self.limits.per_namespace
        if held >= per_namespace and per_namespace < self.limits.per_process:
            scope, count, limit = "namespace", held, per_namespace
            where = f"namespace {namespace} has {count} {self.noun} on this server, its limit"
        elif self._held >= self.limits.per_process or held >= per_namespace:
            scope, count, limit = "process", self._held, self.limits.per_process
            where = f"this server has {count} {self.noun}, its limit"
        else:
            return None
        refusal = ResourceExhausted(
            self.reason,
            f"{where}; retry later or on another server",
            **metadata,
            scope=scope,
            **{self.noun: count},
            limit=limit,
        )
        refusal.retry_after_seconds = self.retry_seconds
        return refusal

    def _release(self, namespace: str) -> None:
        self._held -= 1
        left = self._by_namespace[namespace] - 1
        if left:
            self._by_namespace[namespace] = left
        else:
            del self._by_namespace[namespace]


S = TypeVar("S", bound=Any)
R = TypeVar("R")
#: An RPC method: ``(self, request or requests, Call or context)``.
Method = Callable[[S, Any, Any], Awaitable[R]]


def holding(shares: str) -> Callable[[Method[S, R]], Method[S, R]]:
    """Decorate an RPC method ``(self, request or requests, Call or context)`` of a servicer
    to hold a slot of its :class:`FairShares` attribute ``shares`` for the call's namespace
    while it runs; a call over a cap is ended with the refusal before the method runs. A call
    without a valid token holds nothing: the method itself refuses it (auth comes first)."""

    def decorate(method: Method[S, R]) -> Method[S, R]:
        @functools.wraps(method)
        async def held(self: S, first: Any, second: Any) -> R:
            context = second.context if isinstance(second, Call) else second
            authenticator: Authenticator = self.authenticator
            namespace = authenticator.namespace_of(context.invocation_metadata())
            if not isinstance(namespace, str):
                return await method(self, first, second)
            kind: FairShares = getattr(self, shares)
            refusal = kind.refusal(namespace)
            if refusal is not None:
                await context.abort_with_status(lane_error_status(refusal))
            with kind.acquire(namespace):
                return await method(self, first, second)

        return held

    return decorate
