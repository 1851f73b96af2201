/**
 * @lane/client for browsers and bundlers (the `browser` and `default` conditions of the
 * package's `exports`): what the Node entry has, except that clients speak Connect or gRPC-Web
 * to the service's HTTP port, since browsers cannot speak gRPC. `createLaneClient` is
 * `createLaneConnectClient` here, so `createLaneClient(url)` works in both builds; the Node
 * one takes a gRPC address instead.
 */
export * from "./core.js";
export {
  createLaneConnectClient,
  createLaneConnectClient as createLaneClient,
} from "./connect-client-web.js";
export type { LaneConnectClientOptions as LaneClientOptions } from "./connect-options.js";
