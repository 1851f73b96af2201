/**
 * @lane/client: the TypeScript client of the lane service.
 *
 * - `createLaneClient(address, { token })`: a typed LaneService client over gRPC (connect-es).
 * - `watchLane(client, laneId, opts)`: a resumable watch yielding folded snapshots.
 * - `apply` / `fold` / `isRebase`: the snapshot reducer (same rules as the Python client).
 * - `LaneError` / `laneErrorFrom`: the service's errors with their decoded ErrorInfo;
 *   `Reason` / `reasonOf`: their reasons as the contract's enum (shared with the Python client).
 * - The generated lane.v1 messages, enums and the LaneService descriptor.
 */
export { createLaneClient, type LaneClient, type LaneClientOptions } from "./client.js";
export { EVENT_KINDS, apply, fold, isRebase, type EventKind, type Reduction } from "./reducer.js";
export {
  LANE_ERROR_DOMAIN,
  LaneError,
  Reason,
  codeName,
  errorInfoOf,
  laneErrorFrom,
  reasonFromName,
  reasonName,
  reasonOf,
} from "./errors.js";
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
export * from "./gen/lane/v1/entries_pb.js";
export * from "./gen/lane/v1/events_pb.js";
export * from "./gen/lane/v1/lane_service_pb.js";
export * from "./gen/lane/v1/messages_pb.js";
export * from "./gen/lane/v1/snapshot_pb.js";
export { ErrorInfoSchema, type ErrorInfo } from "./gen/google/rpc/error_details_pb.js";
