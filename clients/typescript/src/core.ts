/**
 * Everything of the client that needs no transport: the reducer, the watcher, the errors and
 * the generated lane.v1 code. Both entry points (`index.ts` for Node, `browser.ts` for
 * browsers and bundlers) re-export it, each with its own `createLaneClient`.
 */
export { EVENT_KINDS, apply, fold, isRebase, type EventKind, type Reduction } from "./reducer.js";
export {
  DEFAULT_ORPHAN_SECONDS,
  LANE_ERROR_DOMAIN,
  LaneError,
  Reason,
  codeName,
  errorInfoOf,
  freeingHint,
  laneErrorFrom,
  reasonFromName,
  reasonName,
  reasonOf,
} from "./errors.js";
export {
  CONNECT_TIMEOUT_MS,
  ServiceUnreachable,
  diagnose,
  endpointOf,
  explained,
  isTransportFailure,
  reach,
  type Endpoint,
} from "./reach.js";
export {
  WATCHER_TOO_SLOW,
  WatchProtocolError,
  backoffDelay,
  watchLane,
  type RetryInfo,
  type WatchClient,
  type WatchOptions,
  type WatchUpdate,
} from "./watch.js";
export { PartJoiner, PartsError } from "./message-parts.js";
export {
  watchLanes,
  type LanesUpdate,
  type WatchLanesClient,
  type WatchLanesOptions,
} from "./watch-lanes.js";
export type { LaneServiceClient } from "./lane-client.js";
export { bearer, type HttpProtocol, type LaneConnectClientOptions } from "./connect-options.js";
export * from "./gen/lane/v1/entries_pb.js";
export * from "./gen/lane/v1/events_pb.js";
export * from "./gen/lane/v1/lane_service_pb.js";
export * from "./gen/lane/v1/messages_pb.js";
export * from "./gen/lane/v1/snapshot_pb.js";
export { ErrorInfoSchema, type ErrorInfo } from "./gen/google/rpc/error_details_pb.js";
