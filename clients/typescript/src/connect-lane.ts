/**
 * `connectLane`: a `LaneClient` over gRPC to a service address, in one call (Node).
 */
import { createLaneClient, type LaneClientOptions } from "./client.js";
import { LaneClient, type LaneClientFacadeOptions } from "./lane-client.js";

/**
 * A `LaneClient` for the service at `address` (`host:port` or an `http(s)://` URL) over gRPC;
 * `options` are `createLaneClient`'s (token, TLS, …) plus the facade's `retry`, `headers`,
 * `session` (`true`: every command over one DriveLane stream; `close()` ends it) and
 * `connectTimeoutMs` (how long the first call waits for the service: `reach.ts`).
 */
export function connectLane(address: string, options: LaneClientOptions & LaneClientFacadeOptions = {}): LaneClient {
  const { retry, headers, session, connectTimeoutMs, target, ...transport } = options;
  return new LaneClient(createLaneClient(address, transport), { retry, headers, session, connectTimeoutMs, target });
}
