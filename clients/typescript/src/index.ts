/**
 * @lane/client: the TypeScript client of the lane service. This is the Node entry (the `node`
 * condition of the package's `exports`); browsers and bundlers get `browser.ts`.
 *
 * - `createLaneClient(address, { token })`: a typed LaneService client over gRPC (connect-es);
 *   its calls carry the active OpenTelemetry trace (`traceContext`) when the application has one.
 * - `createLaneConnectClient(baseUrl, { token, protocol })`: the same client over Connect or
 *   gRPC-Web, for the service's HTTP port (as in browsers).
 * - `watchLane(client, laneId, opts)`: a resumable watch yielding folded snapshots.
 * - `apply` / `fold` / `isRebase`: the snapshot reducer (same rules as the Python client).
 * - `LaneError` / `laneErrorFrom`: the service's errors with their decoded ErrorInfo;
 *   `Reason` / `reasonOf`: their reasons as the contract's enum (shared with the Python client).
 * - The generated lane.v1 messages, enums and the LaneService descriptor.
 */
export * from "./core.js";
export { createLaneClient, type LaneClient, type LaneClientOptions } from "./client.js";
export { createLaneConnectClient, type LaneConnectNodeOptions } from "./connect-client.js";
export { traceContext } from "./tracing.js";
