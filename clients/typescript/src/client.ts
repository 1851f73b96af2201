/**
 * A LaneService client over real gRPC (HTTP/2) for Node, from connect-es.
 */
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport, type GrpcTransportOptions } from "@connectrpc/connect-node";
import { LaneService } from "./gen/lane/v1/lane_service_pb.js";

export type LaneClient = Client<typeof LaneService>;

/**
 * A client for the service at `address`: `host:port` (plain-text gRPC, as `./dev serve`
 * listens) or a full `http://` / `https://` base URL. `options` go to `createGrpcTransport`
 * (interceptors, TLS via `nodeOptions`, keepalive `pingIntervalMs`, …).
 */
export function createLaneClient(
  address: string,
  options: Partial<GrpcTransportOptions> = {},
): LaneClient {
  const baseUrl = /^https?:\/\//.test(address) ? address : `http://${address}`;
  return createClient(LaneService, createGrpcTransport({ ...options, baseUrl }));
}
