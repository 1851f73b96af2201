"""The OpenTelemetry SDK for ``LANE_OTEL=on``, configured by the standard ``OTEL_*`` variables.

The service reads no tracing setting of its own but the switch: what the SDK's autoconfiguration
reads, it reads here the same way.

- ``OTEL_TRACES_EXPORTER``: comma-separated exporter names, each an installed
  ``opentelemetry_traces_exporter`` entry point (``otlp_proto_grpc``, ``otlp_proto_http``,
  ``console``, ...), or ``otlp``, which is ``otlp_proto_grpc`` unless
  ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` says
  ``http/protobuf``; ``none`` exports nothing. Default ``otlp``.
- The exporters read their own variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...), the tracer
  provider the sampler's (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``; default
  ``parentbased_always_on``: a caller's sampling decision is kept), the batch processor its
  ``OTEL_BSP_*``, the API the propagators (``OTEL_PROPAGATORS``, default
  ``tracecontext,baggage``).
- The resource: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``; the service name is
  ``lane-service`` when neither names one.
- ``OTEL_SDK_DISABLED=true`` turns traces off whatever ``LANE_OTEL`` says.

A name no installed exporter has, or an unknown OTLP protocol, is a configuration error (exit
2), as is ``LANE_OTEL=on`` without the SDK installed (the ``otel`` extra).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lane.server import traces
from lane.server.app.config import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

_log = logging.getLogger(__name__)

_DEFAULT_SERVICE_NAME = "lane-service"
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The trace exporters ``OTEL_TRACES_EXPORTER`` names, as entry point names."""
    given = environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    if given.lower() == "none":
        return []
    names = []
    for name in (part.strip() for part in given.split(",")):
        if name == "otlp":
            variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
            if not environ.get(variable, "").strip():
                variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
            protocol = environ.get(variable, "").strip() or "grpc"
            if protocol not in _OTLP_BY_PROTOCOL:
                raise ConfigError(
                    variable, protocol, "the OTLP trace exporter speaks grpc or http/protobuf"
                )
            name = _OTLP_BY_PROTOCOL[protocol]
        if name:
            names.append(name)
    return names


def check_tracing(environ: Mapping[str, str]) -> list[str]:
    """What :func:`start_tracing` would refuse, found without starting anything (so a
    supervisor stops at once instead of starting workers that cannot): the SDK missing, an
    exporter not installed, an unknown OTLP protocol. Returns the exporters' names."""
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        raise ConfigError(
            "LANE_OTEL",
            "on",
            "traces need the OpenTelemetry SDK: pip install 'lane-service[otel]'",
        )
    names = exporter_names(environ)
    for name in names:
        _exporter_entry(name, environ)
    return names


def _exporter_entry(name: str, environ: Mapping[str, str]) -> importlib.metadata.EntryPoint:
    found = importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name=name)
    for entry in found:
        return entry
    raise ConfigError(
        "OTEL_TRACES_EXPORTER",
        environ.get("OTEL_TRACES_EXPORTER", "otlp"),
        f"no trace exporter named {name} is installed (otlp, console or none)",
    )


def start_tracing(environ: Mapping[str, str]) -> TracerProvider | None:
    """Build the SDK's tracer provider from ``environ`` (its ``OTEL_*`` variables), make it the
    process's global one and the service's (:func:`lane.server.traces.enable`), and return it
    (shut it down on exit: it flushes what is left). None when ``OTEL_SDK_DISABLED`` is true.

    Raises :class:`ConfigError` for a bad ``OTEL_*`` value or a missing SDK."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        _log.info("LANE_OTEL=on but OTEL_SDK_DISABLED=true: no traces")
        return None
    names = check_tracing(environ)
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter_entry(name, environ).load() for name in names]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: _DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    trace.set_tracer_provider(provider)
    traces.enable(provider)
    _log.info(
        "traces on: exporting to %s as %s",
        ", ".join(names) or "nothing (OTEL_TRACES_EXPORTER=none)",
        resource.attributes.get(SERVICE_NAME),
    )
    return provider


def stop_tracing(provider: TracerProvider | None) -> None:
    """Stop tracing and flush the spans not yet exported."""
    if provider is None:
        return
    traces.disable()
    provider.shutdown()
