/**
 * `connectLane`: a `LaneClient` over gRPC to a service address, in one call (Node).
 */
import { createLaneClient, type LaneClientOptions } from "./client.js";
import { LaneClient, type LaneClientFacadeOptions } from "./lane-client.js";

/**
 * A `LaneClient` for the service at `address` (`host:port` or an `http(s)://` URL) over gRPC;
 * `options` are `createLaneClient`'s (token, TLS, …) plus the facade's `retry` and `headers`.
 */
export function connectLane(address: string, options: LaneClientOptions & LaneClientFacadeOptions = {}): LaneClient {
  const { retry, headers, ...transport } = options;
  return new LaneClient(createLaneClient(address, transport), { retry, headers });
}
