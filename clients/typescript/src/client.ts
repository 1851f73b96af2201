/**
 * A LaneService client over real gRPC (HTTP/2) for Node, from connect-es.
 */
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, type GrpcTransportOptions } from "@connectrpc/connect-node";
import { LaneService } from "./gen/lane/v1/lane_service_pb.js";
import type { LaneServiceClient } from "./lane-client.js";
import { nameEndpoint } from "./reach.js";
import { traceContext } from "./tracing.js";

/** Options of {@link createLaneClient}: the transport's, plus the service's bearer token. */
export type LaneClientOptions = Partial<GrpcTransportOptions> & {
  /** Sent as `authorization: Bearer <token>` with every call (services with auth on). */
  token?: string;
  /**
   * Send the active OpenTelemetry context (`traceparent`) with every call, when the
   * application has `@opentelemetry/api` and a propagator registered (default true).
   */
  tracing?: boolean;
};

/**
 * A client for the service at `address`: `host:port` (plain-text gRPC, as `./dev serve`
 * listens) or a full `http://` / `https://` base URL. `options` go to `createGrpcTransport`
 * (interceptors, TLS via `nodeOptions`, keepalive `pingIntervalMs`, …), except `token` and
 * `tracing`.
 */
export function createLaneClient(address: string, options: LaneClientOptions = {}): LaneServiceClient {
  const { token, tracing = true, ...transport } = options;
  const baseUrl = /^https?:\/\//.test(address) ? address : `http://${address}`;
  const interceptors = [...(transport.interceptors ?? [])];
  if (token) {
    interceptors.unshift(bearer(token));
  }
  if (tracing) {
    interceptors.unshift(traceContext());
  }
  const client = createClient(LaneService, createGrpcTransport({ ...transport, interceptors, baseUrl }));
  return nameEndpoint(client, { target: address, token: Boolean(token) });
}

function bearer(token: string): Interceptor {
  return (next) => (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
}
