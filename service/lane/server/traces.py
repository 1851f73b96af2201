"""OpenTelemetry traces of the service: off unless :func:`enable` d, and then free of the SDK.

A cross-cutting module like ``service/lane/server/metrics.py``: it imports nothing of the service,
and only the OpenTelemetry API, so every layer but the domain may use it. Off (the default), every
helper here returns at its first check, :data:`tracer` being None: no span object, no context
change, no SDK call on any path. ``service/lane/server/app/tracing.py`` builds the SDK's tracer
provider from the standard ``OTEL_*`` variables when ``LANE_OTEL=on`` and passes it to
:func:`enable`; tests pass one with an in-memory exporter.

Enabled, a connection of the store's pool checked out after :func:`enable` traces its
statements (``opentelemetry-instrumentation-psycopg``, one CLIENT span per statement, named
by its first keyword, with ``db.system`` and ``db.statement``), but only those run inside a
recording span: maintenance scans and the hub's polls make no root traces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

#: The instrumentation scope of the service's own spans.
SCOPE = "lane.service"

#: The service's tracer while traces are on; None (the default) when they are off.
tracer: Tracer | None = None

_provider: TracerProvider | None = None
_NULL: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def enable(provider: TracerProvider) -> None:
    """Trace with ``provider`` from now on (spans of RPCs, transactions, deliveries, and the
    statements of pool connections opened from now on)."""
    global tracer, _provider
    _provider = provider
    tracer = provider.get_tracer(SCOPE)


def disable() -> None:
    """Stop tracing (connections opened while on keep tracing their statements)."""
    global tracer, _provider
    tracer = None
    _provider = None


def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A span named ``name``, current inside the block, as a child of the current span; a
    context manager that does nothing while traces are off. Callers on hot paths check
    :data:`tracer` first, so that not even ``attributes`` is built while off."""
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=attributes)


def transaction(kind: str, namespace: str, lane_id: str) -> contextlib.AbstractContextManager[Any]:
    """The ``lane.transaction`` span of one of the store's writes to a lane (``kind``:
    ``command``, ``create``, ``delete``, ``import``), current inside the block; nothing while
    traces are off. A refusal (an exception with a ``reason``) names its reason in
    ``lane.reason`` and leaves the status unset: the store did its job; anything else is an
    error."""
    if tracer is None:
        return _NULL
    return _transaction(tracer, kind, namespace, lane_id)


@contextlib.contextmanager
def _transaction(tracer: Tracer, kind: str, namespace: str, lane_id: str) -> Iterator[None]:
    attributes = {"lane.transaction.kind": kind, "lane.namespace": namespace, "lane.id": lane_id}
    with tracer.start_as_current_span(
        "lane.transaction",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield
        except Exception as exc:
            reason = getattr(exc, "reason", None)
            if isinstance(reason, str):
                current.set_attribute("lane.reason", reason)
            else:
                current.record_exception(exc)
                current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def delivery(first: int, last: int, source: str) -> contextlib.AbstractContextManager[Any]:
    """The ``lane.watch.delivery`` span of one event group written to a watcher: revisions
    ``first`` to ``last``, from the lane's in-memory feed (``source`` ``feed``) or the event log
    (``log``). Nothing while traces are off."""
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(
        "lane.watch.delivery",
        kind=SpanKind.INTERNAL,
        attributes={
            "lane.revision.first": first,
            "lane.revision.last": last,
            "lane.source": source,
        },
    )


def statements(sql: str, count: int) -> contextlib.AbstractContextManager[Any]:
    """A CLIENT span around ``count`` statements written to PostgreSQL outside psycopg's
    cursors (the group committer's one write: ``sql`` is the first statement's text), as the
    psycopg instrumentation makes one for each statement it runs; nothing while traces are off
    or outside a recording span."""
    if tracer is None or not trace.get_current_span().is_recording():
        return _NULL
    return tracer.start_as_current_span(
        sql.split(None, 1)[0] if sql else "SQL",
        kind=SpanKind.CLIENT,
        attributes={"db.system": "postgresql", "db.statement": sql, "db.statements": count},
    )


def annotate(key: str, value: AttributeValue) -> None:
    """Set an attribute on the current span (nothing while traces are off)."""
    if tracer is not None:
        trace.get_current_span().set_attribute(key, value)


def current_span() -> Span | None:
    """The current span when traces are on and it records; else None."""
    if tracer is None:
        return None
    current = trace.get_current_span()
    return current if current.is_recording() else None


def instrument_connection(connection: Any) -> None:
    """Trace the statements of a new psycopg ``AsyncConnection`` while traces are on: each
    statement run inside a recording span gets a CLIENT span of its own (by
    ``opentelemetry-instrumentation-psycopg``); others run on a plain cursor."""
    provider = _provider
    if provider is None:
        return
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    plain = connection.cursor_factory
    PsycopgInstrumentor.instrument_connection(connection, tracer_provider=provider)
    traced = connection.cursor_factory
    connection.cursor_factory = _choosing(plain, traced)


def _choosing(plain: Any, traced: Any) -> Callable[..., Any]:
    # psycopg calls ``cursor_factory(connection, row_factory=...)``: a function serves as well
    # as a class, and picks per statement whether there is a trace to add it to.
    def cursor(connection: Any, **kwargs: Any) -> Any:
        kind = traced if trace.get_current_span().is_recording() else plain
        return kind(connection, **kwargs)

    return cursor
