/**
 * Trace context on the client's calls: when the application uses OpenTelemetry, every call
 * carries the active context (W3C `traceparent`, and whatever else the application's
 * propagators write), so the service's span of the RPC joins the application's trace.
 *
 * `@opentelemetry/api` is an optional peer dependency: it is looked up once, at the first call,
 * and without it (or without a registered propagator, which the OpenTelemetry SDK for Node
 * sets up) calls go out as they are. `createLaneClient` adds this interceptor unless
 * `tracing: false`.
 */
import type { Interceptor } from "@connectrpc/connect";

type OtelApi = typeof import("@opentelemetry/api");

let api: Promise<OtelApi | undefined> | undefined;

function otelApi(): Promise<OtelApi | undefined> {
  api ??= import("@opentelemetry/api").then(
    (module) => module,
    () => undefined, // not installed: nothing to propagate
  );
  return api;
}

/** An interceptor that injects the active OpenTelemetry context into each call's headers. */
export function traceContext(): Interceptor {
  return (next) => async (request) => {
    const otel = await otelApi();
    if (otel !== undefined) {
      otel.propagation.inject(otel.context.active(), request.header, {
        set: (carrier, key, value) => carrier.set(key, value),
      });
    }
    return next(request);
  };
}
