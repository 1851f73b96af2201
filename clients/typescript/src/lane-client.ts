/**
 * `LaneClient`: the lane service's commands as typed async methods, the shape of the Python
 * facade `lane.client.LaneClient`.
 *
 * ```ts
 * const lanes = new LaneClient(createLaneClient("127.0.0.1:50051"));   // or connectLane(…)
 * await lanes.createLane("lane-1");
 * const started = await lanes.startRun("lane-1", "Hello", { driverId: "worker-7" });
 * const turn = await lanes.startTurn("lane-1", started.operationId);
 * for await (const update of lanes.watch("lane-1")) { … }
 * ```
 *
 * Each method sends one command as `commands.ts` says: a fresh request id (kept across
 * retries, so a command whose answer was lost commits once), retries of UNAVAILABLE,
 * DEADLINE_EXCEEDED and `DATABASE_BUSY`, each attempt bounded. A refusal throws its
 * `LaneError` (`error.reasonCode === Reason.STALE_LEASE`, …).
 *
 * Lease tokens are handled: the token of a run this client leased (`startRun` or
 * `acquireOperation` with a `driverId`) goes on every later command of that run that carries
 * none, until the run ends, the lease is released, or the service says the token is stale.
 *
 * It works over any transport: gRPC (`createLaneClient` in Node) or Connect and gRPC-Web
 * (`createLaneConnectClient`). `Driver` drives runs with tools and a model on top of it.
 *
 * Sessions (gRPC in Node): with `{ session: true }` every command goes over one DriveLane
 * stream the client owns (`session.ts`: the same answers and errors, pipelined, resent on a new
 * stream after a break; `close()` ends it); `{ session: aLaneSession }` shares one, and a call's
 * `{ session }` option picks one (or `false`: unary) for that call alone.
 *
 * Failing fast (`reach.ts`): the first command, watch or driven run checks within
 * `connectTimeoutMs` (5 s by default) that the service answers, and otherwise throws
 * `ServiceUnreachable` naming the address, the cause (connection refused, unknown host, TLS
 * against a plaintext service or the reverse, an untrusted certificate) and the fix; a refused
 * token throws UNAUTHENTICATED saying how to pass one. Once the service answered, a connection
 * that drops is ridden out by the retries; when they give up, the error is a
 * `ServiceUnreachable` too, saying how many attempts they made.
 */
import { create, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import type { CallOptions, Client } from "@connectrpc/connect";
import type { DescMethodUnary } from "@bufbuild/protobuf";
import { newRequestId, withRetries, type RetryOptions } from "./commands.js";
import { Reason, type LaneError } from "./errors.js";
import { CONNECT_TIMEOUT_MS, endpointOf, explained, reach } from "./reach.js";
import { LaneSession, type LaneSessionOptions } from "./session.js";
import {
  LaneService,
  type AcquireOperationResponse,
  type CreateLaneResponse,
  type EndRunResponse,
  type EnqueueMessageResponse,
  type ListLanesResponse,
  type OperationState,
  type RenewLeaseResponse,
  type ReplayToolCallResponse,
  type RunSettings,
  type SettleAssistantMessageResponse,
  type StageToolOutcomeResponse,
  type StartRunResponse,
  type StartToolCallResponse,
  type StartTurnResponse,
  type UpdateToolCallResponse,
  type AbortOperationResponse,
  type ExecutedOutcome,
  type SyntheticOutcome,
  ReplayPolicy,
} from "./gen/lane/v1/lane_service_pb.js";
import {
  AgentMessageSchema,
  type AgentMessage,
  type AssistantMessage,
  type ToolResult,
} from "./gen/lane/v1/messages_pb.js";
import {
  QueueKind,
  type LaneConfiguration,
  type LaneSnapshot,
  type OperationError,
  type OperationResultStatus,
} from "./gen/lane/v1/snapshot_pb.js";
import { WatchProtocolError, watchLane, type WatchOptions, type WatchUpdate } from "./watch.js";

/** The raw connect-es client of the LaneService (what `createLaneClient` returns). */
export type LaneServiceClient = Client<typeof LaneService>;

type Methods = typeof LaneService.method;
/** The names of the LaneService's unary methods (`startRun`, `stageToolOutcome`, …). */
export type UnaryMethod = {
  [K in keyof Methods]: Methods[K] extends DescMethodUnary ? K : never;
}[keyof Methods];
/** The request of unary method `K`, as a message or its init shape. */
export type RequestOf<K extends UnaryMethod> =
  Methods[K] extends DescMethodUnary<infer I extends DescMessage> ? MessageInitShape<I> : never;
/** The response of unary method `K`. */
export type ResponseOf<K extends UnaryMethod> =
  Methods[K] extends DescMethodUnary<DescMessage, infer O extends DescMessage> ? MessageShape<O> : never;

/** A prompt: a text (one user message), a message, or several. */
export type Prompt = string | AgentMessage | readonly AgentMessage[];

/** Options of `new LaneClient(…)`. */
export interface LaneClientFacadeOptions {
  /** How every method retries (`timeoutMs` total, `attemptTimeoutMs` per attempt). */
  retry?: RetryOptions;
  /** Extra headers sent with every call. */
  headers?: CallOptions["headers"];
  /**
   * Send commands over a DriveLane session: `true` opens one the client owns (on the first
   * command; `close()` ends it), a `LaneSession` is shared (not closed by the client). Default:
   * unary RPCs. gRPC in Node only (Connect and gRPC-Web have no bidirectional streams).
   */
  session?: boolean | LaneSession;
  /** How long the first call waits for the service before it throws `ServiceUnreachable`
   *  (default 5 s; 0: no check). */
  connectTimeoutMs?: number;
  /** The service's address, as messages name it (default: what `createLaneClient` was given). */
  target?: string;
}

/** Per-call options of `LaneClient.call`. */
export interface CommandOptions {
  /** Replaces the client's retry options for this call. */
  retry?: RetryOptions;
  /** Stops the retries (the call in flight is cancelled). */
  signal?: AbortSignal;
  /** Send this call over `session`, or as a unary RPC (`false`), whatever the client's own. */
  session?: LaneSession | false;
}

/** A user message with one text block, time-stamped now. */
export function userMessage(text: string): AgentMessage {
  return create(AgentMessageSchema, {
    message: {
      case: "user",
      value: { content: [{ block: { case: "text", value: { text } } }], timestamp: timestampNow() },
    },
  });
}

function messagesOf(prompt: Prompt): AgentMessage[] {
  if (typeof prompt === "string") {
    return [userMessage(prompt)];
  }
  return Array.isArray(prompt) ? [...(prompt as readonly AgentMessage[])] : [prompt as AgentMessage];
}

const runKey = (laneId: string, operationId: string): string => `${laneId}\u0000${operationId}`;

/** The lane service's commands as typed async methods (see the module comment). */
export class LaneClient {
  /** The raw client the commands go through. */
  readonly service: LaneServiceClient;
  /** How every method retries. */
  readonly retry: RetryOptions;
  private readonly headers: CallOptions["headers"];
  /** Lease tokens of runs this client leased: lane id + operation id → token. */
  private readonly leases = new Map<string, bigint>();

  /** The service's address, as messages name it. */
  readonly target: string;
  /** How long the first call waits for the service (0: no check). */
  readonly connectTimeoutMs: number;
  private readonly token: boolean;
  /** The first contact, once made (or under way). */
  private reaching: Promise<void> | undefined;

  /** The session every command goes over (undefined: unary RPCs), and whether it is ours. */
  private session_: LaneSession | undefined;
  private readonly ownsSession: boolean;

  constructor(service: LaneServiceClient, options: LaneClientFacadeOptions = {}) {
    this.service = service;
    this.retry = options.retry ?? {};
    this.headers = options.headers;
    const endpoint = endpointOf(service);
    this.target = options.target ?? endpoint?.target ?? "";
    this.token = endpoint?.token ?? false;
    this.connectTimeoutMs = options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    this.ownsSession = options.session === true;
    if (options.session instanceof LaneSession) {
      this.session_ = options.session;
    } else if (options.session === true) {
      this.session_ = this.openSession();
    }
  }

  /** The session this client's commands go over, if any. */
  get session(): LaneSession | undefined {
    return this.session_;
  }

  /**
   * A new `LaneSession` on this client's transport, headers and retry options (its stream
   * opens with the first command). The caller closes it; pass it per call (`{ session }`), to
   * a `LaneClient` or to a `Driver`.
   */
  openSession(options: LaneSessionOptions = {}): LaneSession {
    return new LaneSession(this.service, { retry: this.retry, headers: this.headers, ...options });
  }

  /** End the session the client opened itself (`{ session: true }`); commands after it go
   *  unary. A shared session is left open. */
  async close(): Promise<void> {
    const session = this.session_;
    if (this.ownsSession) {
      this.session_ = undefined;
      await session?.close();
    }
  }

  /**
   * Wait until the service answers, at most `connectTimeoutMs`; throw `ServiceUnreachable`
   * (the address, the cause, the fix), or UNAUTHENTICATED saying how to pass a token, when it
   * does not. Once it answered, this returns at once. Every command, `watch` and the `Driver`
   * call it first.
   */
  ready(): Promise<void> {
    if (this.connectTimeoutMs <= 0) {
      return Promise.resolve();
    }
    if (this.reaching === undefined) {
      this.reaching = reach(this.service, this.target, this.connectTimeoutMs, { headers: this.headers });
      this.reaching.catch(() => {
        this.reaching = undefined; // the next call tries again
      });
    }
    return this.reaching;
  }

  /** `error` saying what to do about it (`reach.ts`'s `explained`). */
  explained(error: unknown): LaneError {
    return explained(error, this.target, this.token);
  }

  /** The token this client holds for the run, if it leased it. */
  leaseToken(laneId: string, operationId: string): bigint | undefined {
    return this.leases.get(runKey(laneId, operationId));
  }

  /**
   * Send the request of any unary LaneService method and return its response: request id,
   * lease token and retries as the typed methods do.
   */
  async call<K extends UnaryMethod>(
    method: K,
    init: RequestOf<K>,
    options: CommandOptions = {},
  ): Promise<ResponseOf<K>> {
    const desc = LaneService.method[method] as DescMethodUnary;
    const request = create(desc.input, init as MessageInitShape<DescMessage>) as Record<string, unknown>;
    const fields = new Set(desc.input.fields.map((field) => field.localName));
    if (fields.has("requestId") && !request["requestId"]) {
      request["requestId"] = newRequestId();
    }
    const key =
      typeof request["laneId"] === "string" && typeof request["operationId"] === "string"
        ? runKey(request["laneId"], request["operationId"])
        : undefined;
    if (key !== undefined && fields.has("leaseToken") && !request["leaseToken"]) {
      const token = this.leases.get(key);
      if (token !== undefined) {
        request["leaseToken"] = token;
      }
    }
    const send = this.service[method] as unknown as (
      request: unknown,
      options: CallOptions,
    ) => Promise<ResponseOf<K>>;
    const session = options.session === undefined ? this.session_ : options.session || undefined;
    await this.ready();
    let response: ResponseOf<K>;
    try {
      response =
        session !== undefined
          ? await session.call(method, request as RequestOf<K>, { retry: options.retry ?? this.retry, signal: options.signal })
          : await withRetries(
              (timeoutMs) =>
                send.call(this.service, request, { timeoutMs, signal: options.signal, headers: this.headers }),
              options.retry ?? this.retry,
              options.signal,
            );
    } catch (error) {
      const reason = (error as { reasonCode?: Reason }).reasonCode;
      if (key !== undefined && reason === Reason.STALE_LEASE) {
        this.leases.delete(key);
      }
      if (session !== undefined || reason !== Reason.ANSWER_TOO_LARGE) {
        throw this.explained(error);
      }
      // A unary answer over one message (a large run state): DriveLane sends it in parts. A
      // command ran already; its request id brings back the answer recorded then.
      const once = this.openSession();
      try {
        response = await once.call(method, request as RequestOf<K>, {
          retry: options.retry ?? this.retry,
          signal: options.signal,
        });
      } catch (retried) {
        throw this.explained(retried);
      } finally {
        await once.close();
      }
    }
    this.learn(method, request, response as Record<string, unknown>, key);
    return response;
  }

  /** Keep the lease a response grants; forget it once the run ends or lets it go. */
  private learn(
    method: UnaryMethod,
    request: Record<string, unknown>,
    response: Record<string, unknown>,
    key: string | undefined,
  ): void {
    if (method === "startRun") {
      key = runKey(request["laneId"] as string, response["operationId"] as string);
    }
    if (key === undefined) {
      return;
    }
    if (method === "endRun" || method === "releaseLease") {
      this.leases.delete(key);
      return;
    }
    const lease = response["lease"] as { token: bigint } | undefined;
    if (lease !== undefined) {
      this.leases.set(key, lease.token);
    }
  }

  // -- lanes ---------------------------------------------------------------------------------

  /** Create `laneId` (a retry returns the first answer). */
  createLane(laneId: string, options: { configuration?: LaneConfiguration } = {}): Promise<CreateLaneResponse> {
    return this.call("createLane", { laneId, configuration: options.configuration });
  }

  /** The lane now (GetLaneSnapshot; a lane over 4 MiB is refused: watch it instead). */
  async snapshot(laneId: string): Promise<LaneSnapshot> {
    const response = await this.call("getLaneSnapshot", { laneId });
    if (response.snapshot === undefined) {
      throw new Error(`GetLaneSnapshot of ${laneId} answered no snapshot`);
    }
    return response.snapshot;
  }

  /** One page of the caller's lanes (`nextPageToken` names the next one). */
  listLanes(options: { pageSize?: number; pageToken?: string } = {}): Promise<ListLanesResponse> {
    return this.call("listLanes", { pageSize: options.pageSize ?? 0, pageToken: options.pageToken ?? "" });
  }

  /** Queue a message in the lane's inbox (a string: a user message). */
  enqueue(
    laneId: string,
    message: string | AgentMessage,
    options: { kind?: QueueKind } = {},
  ): Promise<EnqueueMessageResponse> {
    const [item] = messagesOf(message);
    return this.call("enqueueMessage", {
      laneId,
      kind: options.kind ?? QueueKind.FOLLOW_UP,
      item: { case: "message", value: item! },
    });
  }

  /** Follow the lane live: `watchLane` on this client's transport, after `ready()`. */
  async *watch(laneId: string, options: WatchOptions = {}): AsyncGenerator<WatchUpdate, void, undefined> {
    await this.ready();
    try {
      yield* watchLane(this.service, laneId, { headers: this.headers, target: this.target, ...options });
    } catch (error) {
      throw error instanceof WatchProtocolError ? error : this.explained(error);
    }
  }

  // -- runs ----------------------------------------------------------------------------------

  /** Open a run with `prompt`; with `driverId` it is leased to it and its token kept. */
  startRun(
    laneId: string,
    prompt: Prompt = [],
    options: { operationId?: string; settings?: RunSettings; driverId?: string; leaseSeconds?: number } = {},
  ): Promise<StartRunResponse> {
    return this.call("startRun", {
      laneId,
      operationId: options.operationId ?? "",
      prompt: messagesOf(prompt),
      settings: options.settings,
      driverId: options.driverId ?? "",
      leaseSeconds: options.leaseSeconds ?? 0,
    });
  }

  /** Ask the open operation to stop (its driver winds it down). Anybody may. */
  abort(laneId: string, operationId: string): Promise<AbortOperationResponse> {
    return this.call("abortOperation", { laneId, operationId });
  }

  /** End the run COMPLETED, ABORTED or FAILED (with `error`). */
  endRun(
    laneId: string,
    operationId: string,
    status: OperationResultStatus,
    options: { error?: OperationError } = {},
  ): Promise<EndRunResponse> {
    return this.call("endRun", { laneId, operationId, status, error: options.error });
  }

  /** Begin a turn (the model is asked next). */
  startTurn(laneId: string, operationId: string, options: { turnId?: string } = {}): Promise<StartTurnResponse> {
    return this.call("startTurn", { laneId, operationId, turnId: options.turnId ?? "" });
  }

  /** Commit the model's answer; its tool calls become the turn's batch. */
  settleAssistantMessage(
    laneId: string,
    operationId: string,
    turnId: string,
    message: AssistantMessage,
  ): Promise<SettleAssistantMessageResponse> {
    return this.call("settleAssistantMessage", { laneId, operationId, turnId, message });
  }

  // -- tool calls ----------------------------------------------------------------------------

  /** Commit a call's intent with its effective arguments (JSON text). */
  startToolCall(
    laneId: string,
    operationId: string,
    toolCallId: string,
    argumentsJson: string,
    options: { replay?: ReplayPolicy } = {},
  ): Promise<StartToolCallResponse> {
    return this.call("startToolCall", {
      laneId,
      operationId,
      toolCallId,
      argumentsJson,
      replay: options.replay ?? ReplayPolicy.NEVER,
    });
  }

  /** Replace a running call's progress (`checkpoint`: also its recovery point). */
  updateToolCall(
    laneId: string,
    operationId: string,
    toolCallId: string,
    partialResult: ToolResult,
    options: { checkpoint?: boolean } = {},
  ): Promise<UpdateToolCallResponse> {
    return this.call("updateToolCall", {
      laneId,
      operationId,
      toolCallId,
      partialResult,
      checkpoint: options.checkpoint ?? false,
    });
  }

  /** Stage a call's final outcome; the service places the batch's ready prefix. */
  stageToolOutcome(
    laneId: string,
    operationId: string,
    toolCallId: string,
    outcome: { executed: ExecutedOutcome } | { synthetic: SyntheticOutcome },
  ): Promise<StageToolOutcomeResponse> {
    return this.call("stageToolOutcome", {
      laneId,
      operationId,
      toolCallId,
      outcome:
        "executed" in outcome
          ? { case: "executed", value: outcome.executed }
          : { case: "synthetic", value: outcome.synthetic },
    });
  }

  /** Execute a replay-safe call of a taken-over run again (its stored arguments). */
  replayToolCall(laneId: string, operationId: string, toolCallId: string): Promise<ReplayToolCallResponse> {
    return this.call("replayToolCall", { laneId, operationId, toolCallId });
  }

  // -- ownership -----------------------------------------------------------------------------

  /** Take a run over (refused `LEASE_HELD` while another driver's lease is live); the new
   *  token is kept for the run's later commands. */
  acquireOperation(
    laneId: string,
    operationId: string,
    options: { driverId: string; leaseSeconds?: number },
  ): Promise<AcquireOperationResponse> {
    return this.call("acquireOperation", {
      laneId,
      operationId,
      driverId: options.driverId,
      leaseSeconds: options.leaseSeconds ?? 0,
    });
  }

  /** Extend this client's lease on the run. */
  renewLease(laneId: string, operationId: string, options: { leaseSeconds?: number } = {}): Promise<RenewLeaseResponse> {
    return this.call("renewLease", { laneId, operationId, leaseSeconds: options.leaseSeconds ?? 0 });
  }

  /** Give the run up: another driver may acquire it at once. */
  async releaseLease(laneId: string, operationId: string): Promise<void> {
    await this.call("releaseLease", { laneId, operationId });
  }

  /** The open run's durable state (refused `OPERATION_NOT_OPEN` once it ended). */
  async getOperation(laneId: string, operationId: string): Promise<OperationState> {
    const response = await this.call("getOperation", { laneId, operationId });
    if (response.state === undefined) {
      throw new Error(`GetOperation of ${operationId} answered no state`);
    }
    return response.state;
  }
}
