/**
 * @lane/client: the TypeScript client of the lane service. This is the Node entry (the `node`
 * condition of the package's `exports`); browsers and bundlers get `browser.ts`.
 *
 * - `createLaneClient(address, { token })`: a typed LaneService client over gRPC (connect-es);
 *   its calls carry the active OpenTelemetry trace (`traceContext`) when the application has one.
 * - `createLaneConnectClient(baseUrl, { token, protocol })`: the same client over Connect or
 *   gRPC-Web, for the service's HTTP port (as in browsers).
 * - `watchLane(client, laneId, opts)`: a resumable watch yielding folded snapshots.
 * - `watchLanes(client, opts)`: a live lane list (WatchLanes), listed again after a reconnect.
 * - `apply` / `fold` / `isRebase`: the snapshot reducer (same rules as the Python client).
 * - `LaneError` / `laneErrorFrom`: the service's errors with their decoded ErrorInfo;
 *   `Reason` / `reasonOf`: their reasons as the contract's enum (shared with the Python client);
 *   `ServiceUnreachable`: the service could not be reached (the address, the cause, the fix).
 * - `LaneClient` (`connectLane(address)`): the commands as typed methods, with request ids,
 *   retries and lease tokens (the Python facade's shape).
 * - `LaneSession`: the commands over one DriveLane stream (pipelined, resent after a break);
 *   `connectLane(address, { session: true })` sends every command of a `LaneClient` over one.
 * - `Driver`, `defineTool`, hooks, `ScriptedModel`: the driver SDK (Node only: Ajv compiles
 *   schemas to code).
 * - The generated lane.v1 messages, enums and the LaneService descriptor.
 */
export * from "./core.js";
export { createLaneClient, type LaneClientOptions } from "./client.js";
export { createLaneConnectClient, type LaneConnectNodeOptions } from "./connect-client.js";
export { traceContext } from "./tracing.js";
export { connectLane } from "./connect-lane.js";
export {
  LaneClient,
  userMessage,
  type CommandOptions,
  type LaneClientFacadeOptions,
  type Prompt,
  type RequestOf,
  type ResponseOf,
  type UnaryMethod,
} from "./lane-client.js";
export { givingUp, isRetryable, newRequestId, withRetries, type RetryOptions } from "./commands.js";
export {
  LaneSession,
  MAX_COMMANDS_IN_FLIGHT,
  SessionBroken,
  type LaneSessionOptions,
  type SessionCallOptions,
} from "./session.js";
export { Driver, DriverError, LeaseLost, MAX_RETRY_AFTER_MS, type DriverOptions, type RunResult } from "./driver.js";
export {
  Tool,
  ToolContext,
  defineTool,
  errorResult,
  textBlock,
  toResultProto,
  type JsonSchema,
  type ReplayPolicyName,
  type ToolOutput,
  type ToolResultLike,
  type ToolSpec,
} from "./tools.js";
export {
  deny,
  replaceArguments,
  type AfterToolEvent,
  type AfterToolHook,
  type AfterToolPatch,
  type BeforeToolDecision,
  type BeforeToolEvent,
  type BeforeToolHook,
  type Deny,
  type Hooks,
  type ReplaceArguments,
} from "./hooks.js";
export {
  ModelError,
  ScriptedModel,
  assistantMessage,
  type Model,
  type ModelRequest,
  type ScriptStep,
  type ScriptedCall,
} from "./model.js";
export type { AnyTool } from "./toolflow.js";
