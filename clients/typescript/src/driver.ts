/**
 * The driver SDK: run an agent on a lane, committing every step to the lane service. The port
 * of the Python SDK's `lane.client.driver.Driver`, with the same contract.
 *
 * ```ts
 * const lanes = connectLane("127.0.0.1:50051");
 * const driver = new Driver(lanes, "lane-1", [shell, readFile], { driverId: "worker-7", model });
 * const result = await driver.run("List the files.");            // a RunResult
 * const again = await driver.recover(operationId);                // take a run over after a crash
 * ```
 *
 * A run: `StartRun` leased to this driver (the lease is renewed in the background every third
 * of its length and its fencing token goes on every command), then turns until the model
 * answers without tool calls, then `EndRun` COMPLETED (FAILED `tool_use_without_calls` when the
 * model stops to use tools but names none). Each turn: `StartTurn`, the model is asked with the
 * lane's durable transcript, `SettleAssistantMessage`; its tool calls form a batch, run as the
 * tool flow (`toolflow.ts`). The driver reads the lane from one WatchLane subscription per run
 * (the snapshot, then every commit folded in), so a turn costs no snapshot read.
 *
 * Abort: whoever calls `AbortOperation` (`lane abort`, Escape in `lane watch`, the web view,
 * `driver.abort()`), the driver sees it in a command's answer (`cancelRequested`), a lease
 * renewal, or the lane's watch. From then on it starts nothing new: planned calls get CANCELLED
 * results, running tools see `ctx.signal` fire and finish with their real result (or, after
 * `abortGraceMs`, get an INTERRUPTED result), afterTool hooks are skipped, and the run ends
 * ABORTED.
 *
 * Every command carries a request id and is retried with the same id on UNAVAILABLE,
 * DEADLINE_EXCEEDED or `DATABASE_BUSY` (`LaneClient`). A refusal `STALE_LEASE` means another
 * driver took the run over: `LeaseLost` is thrown and nothing more is committed.
 *
 * Failing fast: `run` and `recover` first wait for the service (`LaneClient.ready`: an
 * unreachable service throws `ServiceUnreachable` within the client's connect timeout, saying
 * why), and their errors say what to do: a refused token how to pass one, a busy lane
 * (LANE_BUSY) how to free it. A model's retry-after beyond `maxRetryAfterMs` (60 s) fails the
 * run with the provider's message.
 *
 * Recovery (`recover`): `AcquireOperation` (waiting for a live lease of a dead driver to lapse),
 * then the open batch is finished as docs/recovery.md says — staged calls are left to the
 * service's placement, effect_pending calls of tools declared `replay: "safe"` (and started
 * SAFE) are replayed (`ReplayToolCall`, executed again), other effect_pending calls get an
 * INTERRUPTED result, planned calls run the ordinary flow — then the run continues as usual.
 *
 * Commands travel over one DriveLane stream per run (`LaneSession`, `session.ts`: the same
 * answers and refusals as the unary RPCs, for less service CPU; a broken stream is replaced and
 * its unanswered commands sent again with their request ids), as the Python driver's do.
 * `session: false` sends each command as its unary RPC instead; `session:` a `LaneSession` of
 * your own shares it (the driver does not close it); a `LaneClient` made with a session of its
 * own (`connectLane(address, { session: true })`) lends the driver that one. The lane's watch is
 * its own stream either way.
 */
import { hostname } from "node:os";
import { Reason, laneErrorFrom } from "./errors.js";
import { sleep } from "./commands.js";
import {
  RunPhase,
  ToolCallStatus,
  type OperationState,
  type RunSettings,
} from "./gen/lane/v1/lane_service_pb.js";
import { StopReason, type AgentMessage, type AssistantMessage } from "./gen/lane/v1/messages_pb.js";
import {
  OperationResultStatus,
  OperationStatus,
  type LaneSnapshot,
  type OperationError,
  type OperationResult,
} from "./gen/lane/v1/snapshot_pb.js";
import type { Hooks } from "./hooks.js";
import { userMessage, type LaneClient, type Prompt, type RequestOf, type ResponseOf, type UnaryMethod } from "./lane-client.js";
import { ModelError, type Model, type ModelRequest } from "./model.js";
import { LaneSession } from "./session.js";
import { LeaseLost, RunControl, ToolFlow, messageOf, type AnyTool, type BatchCall } from "./toolflow.js";
import { watchLane } from "./watch.js";

export { LeaseLost };

/** The driver cannot go on (no model to continue a recovered run, a broken batch, …). */
export class DriverError extends Error {
  override readonly name = "DriverError";
}

/** How a driven run ended. */
export interface RunResult {
  readonly operationId: string;
  /** COMPLETED, ABORTED or FAILED. */
  readonly status: OperationResultStatus;
  /** The service's record of the ended run. */
  readonly result: OperationResult | undefined;
  /** Turns this driver took. */
  readonly turns: number;
}

/** Options of `new Driver(…)`. */
export interface DriverOptions {
  /** This driver's id in leases (default: host, pid and a random suffix). */
  driverId?: string;
  /** The lease length, renewed every third of it (default 30, 1–3600). */
  leaseSeconds?: number;
  hooks?: Hooks;
  /** Settings of new runs (parallel tool execution by default). */
  settings?: Partial<Pick<RunSettings, "toolExecution" | "steeringMode" | "followUpMode">>;
  /** A run taking more turns ends FAILED `max_turns` (default 50). */
  maxTurns?: number;
  /** After an abort, how long a running tool may take before it gets an INTERRUPTED result
   *  (undefined: wait for it). */
  abortGraceMs?: number;
  /** How long a command is retried while the service is unavailable (default 30 s). */
  retryMs?: number;
  /** See an abort at once in the lane's watch (default true); else at the next command. */
  watchAbort?: boolean;
  /** The default model of `run` and `recover`. */
  model?: Model;
  /** Retries of a retryable model error: how many (default 4) and the first backoff (1 s,
   *  doubling to 30 s) when the provider named no delay. */
  modelRetry?: { retries?: number; initialMs?: number; maxMs?: number };
  /** The longest wait a provider's retry-after may ask for (default 60 s): a longer one fails
   *  the run with the provider's message instead. */
  maxRetryAfterMs?: number;
  /** Where the driver's log lines go (default: nowhere). */
  log?: (line: string) => void;
  /**
   * How commands travel: `true` (default) over a DriveLane session per run (the client's own,
   * if it has one), `false` as unary RPCs, or over the given `LaneSession` (left open).
   */
  session?: boolean | LaneSession;
}

/** The model failed, or answered with an error: the run ends FAILED. */
class ModelFailed extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** The longest wait a provider's retry-after may ask for, by default: a longer one fails the
 *  run with the provider's message (a quota reset hours away is not worth an agent waiting). */
export const MAX_RETRY_AFTER_MS = 60_000;

function defaultDriverId(): string {
  return `${hostname().slice(0, 64)}-${process.pid}-${crypto.randomUUID().slice(0, 8)}`;
}

/** The lane's active tool names; undefined when the lane names none (every tool is active). */
function activeTools(snapshot: LaneSnapshot): ReadonlySet<string> | undefined {
  const names = snapshot.configuration?.activeToolNames ?? [];
  return names.length > 0 ? new Set(names) : undefined;
}

/**
 * The lane as one WatchLane subscription shows it: the transcript and configuration a turn
 * asks the model with, and the run's abort. One subscription per run instead of a snapshot
 * read per turn: a turn reads the lane without a round trip, however large the lane.
 */
class LaneFollower {
  private snapshot: LaneSnapshot | undefined;
  private failure: unknown;
  private waiters: (() => void)[] = [];
  private readonly stopper = new AbortController();
  private done: Promise<void> | undefined;

  constructor(
    private readonly lanes: LaneClient,
    private readonly laneId: string,
  ) {}

  /** Follow the lane until `close()`; with `watchAbort`, mark `run` cancelled once the lane
   *  shows its abort. */
  start(run: RunControl, watchAbort: boolean): void {
    this.done = (async () => {
      try {
        for await (const update of watchLane(this.lanes.service, this.laneId, {
          signal: this.stopper.signal,
          backoff: { maxMs: 2_000 },
          connectTimeoutMs: 0, // the run's commands reached the service: ride outages out
        })) {
          this.snapshot = update.snapshot;
          const operation = update.snapshot.operation;
          if (watchAbort && operation?.id === run.operationId && operation.status === OperationStatus.ABORTING) {
            run.markCancelled("lane watch");
          }
          this.wake();
        }
      } catch (error) {
        this.failure = error;
        this.wake();
      }
    })();
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) {
      wake();
    }
  }

  /** The lane at `revision` or later (read-only: the watch's own snapshot). */
  async at(revision: bigint): Promise<LaneSnapshot> {
    for (;;) {
      if (this.snapshot !== undefined && this.snapshot.revision >= revision) {
        return this.snapshot;
      }
      if (this.failure !== undefined) {
        throw new DriverError(`cannot follow lane ${this.laneId}: ${messageOf(this.failure)}`);
      }
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
  }

  async close(): Promise<void> {
    this.stopper.abort();
    await this.done;
  }
}

/** Drives runs of one lane with a set of tools (see the module comment). */
export class Driver {
  readonly lanes: LaneClient;
  readonly laneId: string;
  readonly tools: ReadonlyMap<string, AnyTool>;
  readonly driverId: string;
  readonly leaseSeconds: number;
  readonly settings: DriverOptions["settings"];
  readonly maxTurns: number;
  readonly retryMs: number;
  readonly watchAbort: boolean;
  readonly model: Model | undefined;
  private readonly modelRetry: Required<NonNullable<DriverOptions["modelRetry"]>>;
  private readonly maxRetryAfterMs: number;
  private readonly log: (line: string) => void;
  /** How commands travel (`DriverOptions.session`). */
  readonly session: boolean | LaneSession;
  private readonly flow: ToolFlow;
  private run_: RunControl | undefined;
  /** What this run's commands go over: a session, unary (`false`), or the client's choice. */
  private commands_: LaneSession | false | undefined;

  constructor(lanes: LaneClient, laneId: string, tools: readonly AnyTool[] = [], options: DriverOptions = {}) {
    const leaseSeconds = options.leaseSeconds ?? 30;
    if (!(leaseSeconds >= 1 && leaseSeconds <= 3600)) {
      throw new RangeError("leaseSeconds must be between 1 and 3600");
    }
    const byName = new Map<string, AnyTool>();
    for (const tool of tools) {
      if (byName.has(tool.name)) {
        throw new Error(`two tools are named ${tool.name}`);
      }
      byName.set(tool.name, tool);
    }
    this.lanes = lanes;
    this.laneId = laneId;
    this.tools = byName;
    this.driverId = options.driverId ?? defaultDriverId();
    this.leaseSeconds = leaseSeconds;
    this.settings = options.settings;
    this.maxTurns = options.maxTurns ?? 50;
    this.retryMs = options.retryMs ?? 30_000;
    this.watchAbort = options.watchAbort ?? true;
    this.model = options.model;
    this.modelRetry = { retries: 4, initialMs: 1_000, maxMs: 30_000, ...options.modelRetry };
    this.maxRetryAfterMs = options.maxRetryAfterMs ?? MAX_RETRY_AFTER_MS;
    this.log = options.log ?? (() => undefined);
    this.session = options.session ?? true;
    this.flow = new ToolFlow(laneId, byName, options.hooks ?? {}, options.abortGraceMs, this.command, this.log);
  }

  /** The run this driver holds now, if any. */
  get operationId(): string | undefined {
    return this.run_?.operationId;
  }

  /**
   * Start a run with `prompt` (the lane is created if needed) and drive it to its end. Throws
   * `LeaseLost` if another driver takes the run over, and a `LaneError` when the service
   * refuses or stays unreachable.
   */
  async run(prompt: Prompt, options: { model?: Model; operationId?: string } = {}): Promise<RunResult> {
    const model = this.chooseModel(options.model);
    if (this.run_ !== undefined) {
      throw new DriverError(`this driver already drives operation ${this.run_.operationId}`);
    }
    await this.lanes.ready();
    return this.withCommands(() => this.start(prompt, model, options.operationId));
  }

  private async start(prompt: Prompt, model: Model, operationId: string | undefined): Promise<RunResult> {
    const messages: AgentMessage[] =
      typeof prompt === "string" ? [userMessage(prompt)] : Array.isArray(prompt) ? [...(prompt as AgentMessage[])] : [prompt as AgentMessage];
    await this.command("createLane", { laneId: this.laneId });
    const started = await this.command("startRun", {
      laneId: this.laneId,
      operationId: operationId ?? "",
      prompt: messages,
      settings: this.settings ?? {},
      driverId: this.driverId,
      leaseSeconds: this.leaseSeconds,
    });
    const run = new RunControl(
      started.operationId,
      started.lease?.token ?? 0n,
      { $typeName: "lane.v1.RunSettings", toolExecution: 0, steeringMode: 0, followUpMode: 0, ...this.settings },
      started.revision,
      this.log,
    );
    this.log(`lane ${this.laneId}: run ${run.operationId} started`);
    return this.supervise(run, model, undefined);
  }

  /**
   * Take the open run `operationId` over and drive it to its end. Waits up to `waitMs` (default
   * 60 s) for another driver's live lease to lapse; then finishes the open batch (safe replay,
   * interruption, or the ordinary flow) and continues the run.
   */
  async recover(operationId: string, options: { model?: Model; waitMs?: number } = {}): Promise<RunResult> {
    if (this.run_ !== undefined) {
      throw new DriverError(`this driver already drives operation ${this.run_.operationId}`);
    }
    await this.lanes.ready();
    return this.withCommands(() => this.takeOver(operationId, options));
  }

  private async takeOver(operationId: string, options: { model?: Model; waitMs?: number }): Promise<RunResult> {
    const deadline = Date.now() + (options.waitMs ?? 60_000);
    let taken: ResponseOf<"acquireOperation">;
    for (;;) {
      try {
        taken = await this.command("acquireOperation", {
          laneId: this.laneId,
          operationId,
          driverId: this.driverId,
          leaseSeconds: this.leaseSeconds,
        });
        break;
      } catch (error) {
        if (laneErrorFrom(error).reasonCode !== Reason.LEASE_HELD || Date.now() >= deadline) {
          throw error;
        }
        this.log(`operation ${operationId}: leased to another driver; waiting`);
        await sleep(250);
      }
    }
    const state = taken.state;
    if (state === undefined) {
      // The run ended meanwhile: report how.
      const snapshot = await this.lanes.snapshot(this.laneId);
      const last = snapshot.lastResult;
      return { operationId, status: last?.status ?? OperationResultStatus.UNSPECIFIED, result: last, turns: 0 };
    }
    const run = new RunControl(operationId, taken.lease?.token ?? 0n, state.settings, taken.revision, this.log);
    this.log(`lane ${this.laneId}: took over run ${operationId} (lease token ${run.leaseToken})`);
    return this.supervise(run, options.model ?? this.model, state);
  }

  /** Ask the service to abort the run this driver holds; false if it holds none. */
  async abort(): Promise<boolean> {
    const run = this.run_;
    if (run === undefined) {
      return false;
    }
    await this.command("abortOperation", { laneId: this.laneId, operationId: run.operationId });
    run.markCancelled("AbortOperation");
    return true;
  }

  // -- commands ------------------------------------------------------------------------------

  /** Run `body` (one run() or recover()) with its commands going as `DriverOptions.session`
   *  asks: over a session opened for it and closed after it, unless one is lent or refused. */
  private async withCommands<T>(body: () => Promise<T>): Promise<T> {
    let opened: LaneSession | undefined;
    if (this.session === false) {
      this.commands_ = false;
    } else if (this.session instanceof LaneSession) {
      this.commands_ = this.session;
    } else if (this.lanes.session !== undefined) {
      this.commands_ = undefined; // the client's own
    } else {
      opened = this.lanes.openSession({ retry: { timeoutMs: this.retryMs } });
      this.commands_ = opened;
    }
    try {
      return await body();
    } finally {
      this.commands_ = undefined;
      await opened?.close();
    }
  }

  /** Send a command of the current run: its lease token, a request id, retries, and the
   *  `cancelRequested` of its answer. */
  private readonly command = async <K extends UnaryMethod>(method: K, init: RequestOf<K>): Promise<ResponseOf<K>> => {
    const run = this.run_;
    const request = init as Record<string, unknown>;
    if (run !== undefined) {
      if (run.lost !== undefined) {
        throw new LeaseLost(run.lost.message);
      }
      if (request["operationId"] === run.operationId && method !== "acquireOperation") {
        request["leaseToken"] = run.leaseToken;
      }
    }
    let answer: ResponseOf<K>;
    try {
      answer = await this.lanes.call(method, init, { retry: { timeoutMs: this.retryMs }, session: this.commands_ });
    } catch (thrown) {
      const error = laneErrorFrom(thrown);
      if (error.reasonCode === Reason.STALE_LEASE) {
        run?.markLost(error);
        throw new LeaseLost(error.message, { cause: error });
      }
      if (run !== undefined && error.reasonCode === Reason.OPERATION_CANCELLED) {
        run.markCancelled("refused command");
      }
      throw error;
    }
    if (run !== undefined && (answer as { cancelRequested?: boolean }).cancelRequested === true) {
      run.markCancelled("command answer");
    }
    return answer;
  };

  private chooseModel(model: Model | undefined): Model {
    const chosen = model ?? this.model;
    if (chosen === undefined) {
      throw new DriverError("no model: pass one to run()/recover() or to new Driver(…, { model })");
    }
    return chosen;
  }

  // -- supervision ---------------------------------------------------------------------------

  /** Drive `run` with the lease renewer and the lane's watch running beside it. */
  private async supervise(run: RunControl, model: Model | undefined, state: OperationState | undefined): Promise<RunResult> {
    this.run_ = run;
    const lane = new LaneFollower(this.lanes, this.laneId);
    lane.start(run, this.watchAbort);
    const renewing = new AbortController();
    const renewer = this.renew(run, renewing.signal);
    try {
      return await this.drive(run, lane, model, state);
    } catch (error) {
      if (error instanceof LeaseLost || run.lost !== undefined) {
        throw error instanceof LeaseLost ? error : new LeaseLost(run.lost!.message, { cause: run.lost });
      }
      // Leave the run to another driver (or the service's reconciliation) at once.
      await this.release(run);
      throw error;
    } finally {
      this.run_ = undefined;
      renewing.abort();
      run.stop.abort();
      await Promise.all([renewer, lane.close()]);
    }
  }

  private async release(run: RunControl): Promise<void> {
    try {
      await this.lanes.call(
        "releaseLease",
        { laneId: this.laneId, operationId: run.operationId, leaseToken: run.leaseToken },
        { retry: { timeoutMs: 2_000, attemptTimeoutMs: 5_000 }, session: this.commands_ },
      );
    } catch {
      // Best effort: the lease lapses on its own.
    }
  }

  /** Renew the lease every third of its length; watch the answers for an abort. */
  private async renew(run: RunControl, signal: AbortSignal): Promise<void> {
    const interval = Math.max(200, (this.leaseSeconds * 1000) / 3);
    for (;;) {
      await sleep(interval, signal);
      if (signal.aborted) {
        return;
      }
      try {
        const answer = await this.lanes.call(
          "renewLease",
          { laneId: this.laneId, operationId: run.operationId, leaseToken: run.leaseToken, leaseSeconds: this.leaseSeconds },
          { retry: { timeoutMs: interval, attemptTimeoutMs: Math.max(interval, 1_000) }, signal, session: this.commands_ },
        );
        if (answer.cancelRequested) {
          run.markCancelled("lease renewal");
        }
      } catch (thrown) {
        const error = laneErrorFrom(thrown);
        if (error.reasonCode === Reason.STALE_LEASE) {
          this.log(`operation ${run.operationId}: lease lost: ${error.message}`);
          run.markLost(error);
          return;
        }
        if (error.reasonCode === Reason.OPERATION_NOT_OPEN) {
          return; // the run ended
        }
        if (!signal.aborted) {
          this.log(`operation ${run.operationId}: lease renewal failed: ${error.message}`);
        }
      }
    }
  }

  // -- the run -------------------------------------------------------------------------------

  private async drive(run: RunControl, lane: LaneFollower, model: Model | undefined, state: OperationState | undefined): Promise<RunResult> {
    try {
      let mayFinish = false;
      if (state !== undefined) {
        if (state.cancelRequested) {
          run.markCancelled("operation state");
        }
        mayFinish = await this.resume(run, lane, model, state);
      }
      for (;;) {
        if (run.cancelled) {
          return await this.end(run, OperationResultStatus.ABORTED);
        }
        if (mayFinish) {
          return await this.end(run, OperationResultStatus.COMPLETED);
        }
        if (run.turns >= this.maxTurns) {
          throw new ModelFailed("max_turns", `the run took ${run.turns} turns`);
        }
        let turn: ResponseOf<"startTurn">;
        try {
          turn = await this.command("startTurn", { laneId: this.laneId, operationId: run.operationId });
        } catch (error) {
          if (laneErrorFrom(error).reasonCode === Reason.OPERATION_CANCELLED) {
            continue; // marked cancelled: end ABORTED
          }
          throw error;
        }
        run.turns += 1;
        mayFinish = await this.turn(run, lane, this.chooseModel(model), turn.turnId, turn.revision);
      }
    } catch (error) {
      if (!(error instanceof ModelFailed)) {
        throw error;
      }
      this.log(`operation ${run.operationId}: ${error.code}: ${error.message}`);
      return await this.end(run, OperationResultStatus.FAILED, {
        $typeName: "lane.v1.OperationError",
        code: error.code,
        message: error.message,
      });
    }
  }

  /** Continue a taken-over run from its durable phase; whether it may finish. */
  private async resume(run: RunControl, lane: LaneFollower, model: Model | undefined, state: OperationState): Promise<boolean> {
    if (run.cancelled) {
      return false; // EndRun settles whatever is unfinished
    }
    if (state.phase === RunPhase.TOOLS) {
      const content = state.assistant?.content ?? [];
      const calls: BatchCall[] = state.toolCalls.map((c) => {
        const block = content[c.sourceIndex]?.block;
        return {
          toolCallId: c.toolCallId,
          toolName: c.toolName,
          sourceIndex: c.sourceIndex,
          resultEntryId: c.resultEntryId,
          sourceArguments: block?.case === "toolCall" ? block.value.argumentsJson : "{}",
          status: c.status,
          replay: c.replay,
          persistedArguments: c.argumentsJson,
        };
      });
      const active = activeTools(await lane.at(run.revision));
      await this.flow.runBatch(run, state.turnId, state.assistant!, calls, active);
      return this.batchMayFinish(run);
    }
    if (state.phase === RunPhase.TURN_OPEN) {
      run.turns += 1;
      return this.turn(run, lane, this.chooseModel(model), state.turnId, run.revision);
    }
    return state.mayFinish;
  }

  private async end(run: RunControl, status: OperationResultStatus, error?: OperationError): Promise<RunResult> {
    const ended = await this.command("endRun", { laneId: this.laneId, operationId: run.operationId, status, error });
    const result: RunResult = {
      operationId: run.operationId,
      status: ended.result?.status ?? status,
      result: ended.result,
      turns: run.turns,
    };
    this.log(`lane ${this.laneId}: run ${run.operationId} ended ${OperationResultStatus[result.status]}`);
    return result;
  }

  /** One turn after StartTurn (committed at `revision`): ask the model (again after a
   *  retryable failure), settle, run the batch. Whether the run may finish now. */
  private async turn(run: RunControl, lane: LaneFollower, model: Model, turnId: string, revision: bigint): Promise<boolean> {
    const snapshot = await lane.at(revision);
    const active = activeTools(snapshot);
    const retry = snapshot.operation?.retry;
    if (retry?.nextAttemptTime !== undefined) {
      // Taken over while a retry was scheduled: start it when it is due.
      const due = Number(retry.nextAttemptTime.seconds) * 1000 + retry.nextAttemptTime.nanos / 1e6;
      if (!(await this.startRetry(run, turnId, due - Date.now()))) {
        return false;
      }
    }
    const entries = [...snapshot.transcript];
    const messages = entries.flatMap((entry) =>
      entry.payload.case === "message" && entry.payload.value.message !== undefined ? [entry.payload.value.message] : [],
    );
    const request: ModelRequest = {
      laneId: this.laneId,
      operationId: run.operationId,
      turnId,
      messages,
      entries,
      tools: [...this.tools.values()].filter((tool) => active === undefined || active.has(tool.name)),
      signal: run.stop.signal,
    };
    let assistant: AssistantMessage | undefined;
    for (let failures = 1; ; failures++) {
      try {
        assistant = await this.generate(run, model, request);
        break;
      } catch (error) {
        if (!(error instanceof ModelError && error.retryable)) {
          throw error;
        }
        const delay = await this.scheduleRetry(run, turnId, error, failures);
        if (!(await this.startRetry(run, turnId, delay))) {
          return false;
        }
      }
    }
    if (assistant === undefined) {
      return false; // aborted while the model was answering
    }
    const settled = await this.command("settleAssistantMessage", {
      laneId: this.laneId,
      operationId: run.operationId,
      turnId,
      message: assistant,
    });
    if (assistant.stopReason === StopReason.ERROR) {
      throw new ModelFailed("assistant_error", assistant.errorMessage || "the assistant stopped with an error");
    }
    if (settled.toolCalls.length === 0) {
      if (assistant.stopReason === StopReason.TOOL_USE) {
        // The service will not complete a run on it (docs/contract.md, Tool calls).
        throw new ModelFailed("tool_use_without_calls", "the assistant stopped to use tools but named none");
      }
      return true;
    }
    const calls: BatchCall[] = settled.toolCalls.map((p) => {
      const block = assistant.content[p.sourceIndex]?.block;
      return {
        toolCallId: p.toolCallId,
        toolName: p.toolName,
        sourceIndex: p.sourceIndex,
        resultEntryId: p.resultEntryId,
        sourceArguments: block?.case === "toolCall" ? block.value.argumentsJson : "{}",
        status: ToolCallStatus.PLANNED,
        replay: 0,
        persistedArguments: undefined,
      };
    });
    await this.flow.runBatch(run, turnId, assistant, calls, active);
    return this.batchMayFinish(run);
  }

  /** The model's answer, normalized; undefined when the run's abort came first. Throws a
   *  retryable `ModelError` as is, any other failure as `ModelFailed`. */
  private async generate(run: RunControl, model: Model, request: ModelRequest): Promise<AssistantMessage | undefined> {
    if (run.cancelled) {
      return undefined;
    }
    const answer = model(request);
    answer.catch(() => undefined); // given up on when the abort comes first
    const aborted = new Promise<undefined>((resolve) => {
      if (run.stop.signal.aborted) {
        resolve(undefined);
      }
      run.stop.signal.addEventListener("abort", () => resolve(undefined), { once: true });
    });
    let message: AssistantMessage | undefined;
    try {
      message = await Promise.race([answer, aborted]);
    } catch (error) {
      if (error instanceof ModelError) {
        if (error.retryable) {
          throw error;
        }
        throw new ModelFailed(error.code, error.message);
      }
      throw new ModelFailed("model_error", messageOf(error));
    }
    if (run.lost !== undefined) {
      throw new LeaseLost(run.lost.message, { cause: run.lost });
    }
    if (message === undefined || run.cancelled) {
      return undefined;
    }
    if (message.$typeName !== "lane.v1.AssistantMessage") {
      throw new ModelFailed("model_error", "the model did not return a lane.v1.AssistantMessage");
    }
    const settled: AssistantMessage = { ...message, content: [...message.content] };
    if (settled.stopReason === StopReason.UNSPECIFIED || settled.stopReason === StopReason.PENDING) {
      const hasCalls = settled.content.some((block) => block.block.case === "toolCall");
      settled.stopReason = hasCalls ? StopReason.TOOL_USE : StopReason.STOP;
    }
    if (settled.timestamp === undefined) {
      const now = Date.now();
      settled.timestamp = { $typeName: "google.protobuf.Timestamp", seconds: BigInt(Math.floor(now / 1000)), nanos: (now % 1000) * 1e6 };
    }
    return settled;
  }

  /** ScheduleRetry for failure number `failures` of this turn; the delay. Throws ModelFailed
   *  once the retries are spent. */
  private async scheduleRetry(run: RunControl, turnId: string, error: ModelError, failures: number): Promise<number> {
    const { retries, initialMs, maxMs } = this.modelRetry;
    if (retries < 1) {
      throw new ModelFailed(error.code, error.message);
    }
    const asked = error.retryAfterMs === undefined ? undefined : Math.max(0, error.retryAfterMs);
    if (asked !== undefined && asked > this.maxRetryAfterMs) {
      throw new ModelFailed(
        error.code,
        `${error.message} (the provider asks to retry after ${asked / 1000}s, longer than the ` +
          `${this.maxRetryAfterMs / 1000}s this driver waits)`,
      );
    }
    const delay = asked ?? Math.min(maxMs, initialMs * 2 ** (failures - 1));
    try {
      await this.command("scheduleRetry", {
        laneId: this.laneId,
        operationId: run.operationId,
        turnId,
        maxAttempts: retries + 1,
        delayMs: BigInt(Math.round(delay)),
        errorMessage: error.message,
      });
    } catch (thrown) {
      if (laneErrorFrom(thrown).reasonCode === Reason.RETRIES_EXHAUSTED) {
        throw new ModelFailed(error.code, `${error.message} (gave up after ${retries + 1} attempts)`);
      }
      throw thrown;
    }
    this.log(`operation ${run.operationId}: model failed (${error.message}); next attempt in ${delay} ms`);
    return delay;
  }

  /** Wait `delayMs` (less if the run is aborted), then StartRetry; false when aborted instead. */
  private async startRetry(run: RunControl, turnId: string, delayMs: number): Promise<boolean> {
    if (delayMs > 0) {
      await sleep(delayMs, run.stop.signal);
    }
    if (run.cancelled) {
      return false;
    }
    try {
      await this.command("startRetry", { laneId: this.laneId, operationId: run.operationId, turnId });
    } catch (error) {
      if (laneErrorFrom(error).reasonCode === Reason.OPERATION_CANCELLED) {
        return false;
      }
      throw error;
    }
    return true;
  }

  /** After a batch: may the run finish (every call asked to terminate)? */
  private async batchMayFinish(run: RunControl): Promise<boolean> {
    const answer = await this.command("getOperation", { laneId: this.laneId, operationId: run.operationId });
    const state = answer.state;
    if (state?.cancelRequested) {
      run.markCancelled("operation state");
    }
    if (state?.phase === RunPhase.TOOLS) {
      const unplaced = state.toolCalls.filter((c) => c.status !== ToolCallStatus.COMPLETED).map((c) => c.toolCallId);
      throw new DriverError(`the batch still has unplaced calls ${unplaced.join(", ")}`);
    }
    return state?.mayFinish === true;
  }
}

