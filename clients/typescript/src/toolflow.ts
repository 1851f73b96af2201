/**
 * The tool flow for one batch (docs/contract.md, Tool calls), as the driver runs it; the port
 * of the Python SDK's `lane.client.toolflow`.
 *
 * For each call, in source order: prepare (TRUNCATED when the assistant stopped for length,
 * before anything else, since the service accepts no other outcome for such a call; CANCELLED
 * once the run's abort was seen; UNKNOWN_TOOL; INVALID_ARGUMENTS from the tool's JSON Schema),
 * the beforeTool hooks (replace arguments, revalidated; deny; a throwing hook denies), the
 * intent (`StartToolCall`), then the execution (progress and checkpoints are `UpdateToolCall`;
 * a throwing tool gives an error result), the afterTool hooks (skipped once an abort began)
 * and staging (`StageToolOutcome`; the service places the ready source-order prefix). Parallel
 * batches start their calls one after another and let them run and settle in any order;
 * sequential ones finish each call before starting the next.
 *
 * Abort: once seen, nothing new starts (planned calls get CANCELLED); running tools see their
 * `signal` and finish with their real result, or, `abortGraceMs` after the abort, get an
 * INTERRUPTED result (the tool's later output is dropped and its progress refused).
 *
 * A batch taken over from a dead driver also has effect_pending calls: one whose stored policy
 * and whose tool both say `safe` is replayed (`ReplayToolCall`, executed again); any other gets
 * an INTERRUPTED result (its latest checkpoint plus a notice). Staged calls are left alone.
 */
import { setMaxListeners } from "node:events";
import { create } from "@bufbuild/protobuf";
import { Reason, laneErrorFrom, type LaneError } from "./errors.js";
import {
  ReplayPolicy,
  SyntheticCause,
  ToolCallStatus,
  ToolExecution,
  type RunSettings,
} from "./gen/lane/v1/lane_service_pb.js";
import { StopReason, ToolResultSchema, type AssistantMessage, type ToolResult } from "./gen/lane/v1/messages_pb.js";
import type { AfterToolEvent, Hooks } from "./hooks.js";
import type { RequestOf, ResponseOf, UnaryMethod } from "./lane-client.js";
import { ToolContext, resultBytes, textBlock, toResultProto, type Tool, type ToolResultLike } from "./tools.js";

/** Any tool, whatever its arguments' type. */
// The driver only hands a tool arguments that passed its own schema.
export type AnyTool = Tool<any>;

/** The largest tool result the service accepts (docs/limits.md: one payload, encoded). */
export const MAX_RESULT_BYTES = 512 * 1024;

/** Another driver took the run over (the service refused this driver's fencing token). */
export class LeaseLost extends Error {
  override readonly name = "LeaseLost";
}

/** A tool was given up on after the abort grace period; its outcome is unknown. */
class ToolStopped extends Error {}

/** One run a driver holds: its ids, lease token, settings, and its signals. */
export class RunControl {
  readonly operationId: string;
  readonly leaseToken: bigint;
  readonly settings: RunSettings | undefined;
  /** The revision after the run's first command here: a turn reads the lane at or after it. */
  readonly revision: bigint;
  /** Aborted once the run's abort was seen (durably requested at the service). */
  readonly cancel = new AbortController();
  /** Aborted on an abort or a lost lease: what running tools and the model see. */
  readonly stop = new AbortController();
  /** Set once the service refused this driver's token. */
  lost: LaneError | undefined;
  turns = 0;
  private readonly log: (line: string) => void;

  constructor(
    operationId: string,
    leaseToken: bigint,
    settings: RunSettings | undefined,
    revision: bigint,
    log: (line: string) => void,
  ) {
    this.operationId = operationId;
    this.leaseToken = leaseToken;
    this.settings = settings;
    this.revision = revision;
    this.log = log;
    // Every running tool of the run listens to these: a large batch is no leak.
    setMaxListeners(0, this.cancel.signal, this.stop.signal);
  }

  get cancelled(): boolean {
    return this.cancel.signal.aborted;
  }

  /** Note that the run's abort was seen (by `source`); idempotent. */
  markCancelled(source: string): void {
    if (!this.cancel.signal.aborted) {
      this.log(`operation ${this.operationId}: abort seen (${source}); stopping`);
      this.cancel.abort();
      this.stop.abort();
    }
  }

  /** Note that the lease is gone; every later command fails with `LeaseLost`. */
  markLost(error: LaneError): void {
    this.lost ??= error;
    this.stop.abort();
  }
}

/** A call of the batch being driven, with its durable status. */
export interface BatchCall {
  toolCallId: string;
  toolName: string;
  sourceIndex: number;
  resultEntryId: string;
  sourceArguments: string;
  status: ToolCallStatus;
  replay: ReplayPolicy;
  persistedArguments: string | undefined;
}

/** Sends one command of the run: lease token, request id, retries, cancel_requested. */
export type Command = <K extends UnaryMethod>(method: K, request: RequestOf<K>) => Promise<ResponseOf<K>>;

/** Runs tool batches of one lane's runs through `command`. */
export class ToolFlow {
  constructor(
    private readonly laneId: string,
    private readonly tools: ReadonlyMap<string, AnyTool>,
    private readonly hooks: Hooks,
    private readonly abortGraceMs: number | undefined,
    private readonly command: Command,
    private readonly log: (line: string) => void,
  ) {}

  /**
   * Finish every call of the batch: start in source order; run in parallel or one at a time
   * (RunSettings); stage each outcome. `active`: the lane's active tool names (undefined:
   * every tool of the driver); a call of another tool is UNKNOWN_TOOL.
   */
  async runBatch(
    run: RunControl,
    turnId: string,
    assistant: AssistantMessage,
    calls: readonly BatchCall[],
    active: ReadonlySet<string> | undefined,
  ): Promise<void> {
    const sequential = run.settings?.toolExecution === ToolExecution.SEQUENTIAL;
    const jobs: Promise<void>[] = [];
    let failure: unknown;
    for (const item of [...calls].sort((a, b) => a.sourceIndex - b.sourceIndex)) {
      if (item.status === ToolCallStatus.OUTCOME_READY || item.status === ToolCallStatus.COMPLETED) {
        continue; // staged: placed by the service, never executed again
      }
      try {
        // The intent is committed here, in source order; the execution runs beside the rest.
        const execution =
          item.status === ToolCallStatus.EFFECT_PENDING
            ? () => this.recoverCall(run, turnId, item, active)
            : await this.startCall(run, turnId, assistant, item, active);
        if (execution === undefined) {
          continue;
        }
        const job = execution();
        if (sequential) {
          await job;
        } else {
          jobs.push(job);
        }
      } catch (error) {
        failure = error;
        break;
      }
    }
    const settled = await Promise.allSettled(jobs);
    const errors = [
      ...(failure === undefined ? [] : [failure]),
      ...settled.flatMap((s) => (s.status === "rejected" ? [s.reason as unknown] : [])),
    ];
    if (errors.length > 0) {
      throw errors.find((error) => error instanceof LeaseLost) ?? errors[0];
    }
  }

  private async stage(
    run: RunControl,
    item: BatchCall,
    outcome: { case: "executed"; result: ToolResult; isError: boolean } | { case: "synthetic"; cause: SyntheticCause; message?: string; terminate?: boolean },
  ): Promise<void> {
    await this.command("stageToolOutcome", {
      laneId: this.laneId,
      operationId: run.operationId,
      toolCallId: item.toolCallId,
      outcome:
        outcome.case === "executed"
          ? { case: "executed", value: { result: outcome.result, isError: outcome.isError } }
          : {
              case: "synthetic",
              value: { cause: outcome.cause, message: outcome.message ?? "", terminate: outcome.terminate === true },
            },
    });
    const what =
      outcome.case === "executed" ? (outcome.isError ? "error result" : "result") : SyntheticCause[outcome.cause];
    this.log(`call ${item.toolCallId} (${item.toolName}) staged: ${what}`);
  }

  private synthetic(run: RunControl, item: BatchCall, cause: SyntheticCause, message = "", terminate = false): Promise<void> {
    return this.stage(run, item, { case: "synthetic", cause, message, terminate });
  }

  private tool(name: string, active: ReadonlySet<string> | undefined): AnyTool | undefined {
    return active === undefined || active.has(name) ? this.tools.get(name) : undefined;
  }

  /** Prepare, beforeTool, intent. Returns the execution to start (a function: a promise
   *  returned from here would be awaited with it), or undefined when the call got an immediate
   *  (synthetic) outcome. */
  private async startCall(
    run: RunControl,
    turnId: string,
    assistant: AssistantMessage,
    item: BatchCall,
    active: ReadonlySet<string> | undefined,
  ): Promise<(() => Promise<void>) | undefined> {
    if (assistant.stopReason === StopReason.LENGTH) {
      await this.synthetic(run, item, SyntheticCause.TRUNCATED);
      return undefined;
    }
    if (run.cancelled) {
      await this.synthetic(run, item, SyntheticCause.CANCELLED);
      return undefined;
    }
    const tool = this.tool(item.toolName, active);
    if (tool === undefined) {
      await this.synthetic(run, item, SyntheticCause.UNKNOWN_TOOL);
      return undefined;
    }
    let args: Record<string, unknown>;
    try {
      args = JSON.parse(item.sourceArguments) as Record<string, unknown>;
    } catch (error) {
      await this.synthetic(run, item, SyntheticCause.INVALID_ARGUMENTS, `arguments are not JSON: ${String((error as Error).message)}`);
      return undefined;
    }
    let problem = tool.validate(args);
    if (problem !== undefined) {
      await this.synthetic(run, item, SyntheticCause.INVALID_ARGUMENTS, problem);
      return undefined;
    }
    let argumentsJson = item.sourceArguments;
    for (const hook of this.hooks.beforeTool ?? []) {
      let decision;
      try {
        decision = await hook({
          laneId: this.laneId,
          operationId: run.operationId,
          turnId,
          toolCallId: item.toolCallId,
          toolName: item.toolName,
          args: structuredClone(args),
        });
      } catch (error) {
        await this.synthetic(run, item, SyntheticCause.DENIED, `beforeTool hook failed: ${messageOf(error)}`);
        return undefined;
      }
      if (decision?.kind === "deny") {
        await this.synthetic(run, item, SyntheticCause.DENIED, decision.reason || "denied by a beforeTool hook", decision.terminate);
        return undefined;
      }
      if (decision?.kind === "replace") {
        problem = tool.validate(decision.args);
        if (problem !== undefined) {
          await this.synthetic(run, item, SyntheticCause.INVALID_ARGUMENTS, problem);
          return undefined;
        }
        args = structuredClone(decision.args);
        argumentsJson = JSON.stringify(args);
      }
    }
    if (run.cancelled) {
      await this.synthetic(run, item, SyntheticCause.CANCELLED);
      return undefined;
    }
    try {
      await this.command("startToolCall", {
        laneId: this.laneId,
        operationId: run.operationId,
        toolCallId: item.toolCallId,
        argumentsJson,
        replay: tool.replay === "safe" ? ReplayPolicy.SAFE : ReplayPolicy.NEVER,
      });
    } catch (error) {
      if (laneErrorFrom(error).reasonCode !== Reason.OPERATION_CANCELLED) {
        throw error;
      }
      await this.synthetic(run, item, SyntheticCause.CANCELLED);
      return undefined;
    }
    if (run.cancelled) {
      // The intent committed but the effect has not begun: cancelled, not run.
      await this.synthetic(run, item, SyntheticCause.CANCELLED);
      return undefined;
    }
    this.log(`call ${item.toolCallId} (${item.toolName}) started`);
    return () => this.execute(run, turnId, item, tool, args, false);
  }

  /** An effect_pending call of a taken-over batch: safe replay, else interruption. */
  private async recoverCall(
    run: RunControl,
    turnId: string,
    item: BatchCall,
    active: ReadonlySet<string> | undefined,
  ): Promise<void> {
    const tool = this.tool(item.toolName, active);
    let replayable =
      !run.cancelled &&
      item.replay === ReplayPolicy.SAFE &&
      tool?.replay === "safe" &&
      item.persistedArguments !== undefined;
    if (replayable && tool !== undefined) {
      try {
        replayable = tool.validate(JSON.parse(item.persistedArguments!)) === undefined;
      } catch {
        replayable = false;
      }
    }
    if (replayable && tool !== undefined) {
      let replayed: ResponseOf<"replayToolCall"> | undefined;
      try {
        replayed = await this.command("replayToolCall", {
          laneId: this.laneId,
          operationId: run.operationId,
          toolCallId: item.toolCallId,
        });
      } catch (error) {
        const reason = laneErrorFrom(error).reasonCode;
        if (reason !== Reason.OPERATION_CANCELLED && reason !== Reason.NOT_REPLAYABLE) {
          throw error;
        }
      }
      if (replayed !== undefined) {
        this.log(`call ${item.toolCallId} (${item.toolName}) replayed`);
        const args = JSON.parse(replayed.argumentsJson) as Record<string, unknown>;
        await this.execute(run, turnId, item, tool, args, true);
        return;
      }
    }
    await this.synthetic(run, item, SyntheticCause.INTERRUPTED);
  }

  /** Run the tool, apply afterTool hooks, stage the outcome. */
  private async execute(
    run: RunControl,
    turnId: string,
    item: BatchCall,
    tool: AnyTool,
    args: Record<string, unknown>,
    replaying: boolean,
  ): Promise<void> {
    const context = new ToolContext({
      laneId: this.laneId,
      operationId: run.operationId,
      turnId,
      toolCallId: item.toolCallId,
      toolName: item.toolName,
      resultEntryId: item.resultEntryId,
      replaying,
      signal: run.stop.signal,
      report: async (partialResult, checkpoint) => {
        await this.command("updateToolCall", {
          laneId: this.laneId,
          operationId: run.operationId,
          toolCallId: item.toolCallId,
          partialResult,
          checkpoint,
        });
      },
    });
    let result: ToolResult;
    let isError: boolean;
    try {
      ({ result, isError } = toResultProto(await this.awaitTool(run, tool.execute(structuredClone(args), context))));
    } catch (error) {
      if (error instanceof ToolStopped) {
        context.close();
        await this.synthetic(run, item, SyntheticCause.INTERRUPTED);
        return;
      }
      if (error instanceof LeaseLost || run.lost !== undefined) {
        throw error instanceof LeaseLost ? error : new LeaseLost(String(run.lost?.message));
      }
      result = create(ToolResultSchema, { content: [textBlock(messageOf(error))] });
      isError = true;
    } finally {
      context.close();
    }
    if ((this.hooks.afterTool?.length ?? 0) > 0 && !run.cancelled) {
      ({ result, isError } = await this.afterTool(run, turnId, item, args, result, isError, replaying));
    }
    const size = resultBytes(result);
    if (size > MAX_RESULT_BYTES) {
      // The service would refuse it (PAYLOAD_TOO_LARGE) and the run could not go on; the model
      // gets an error it can act on instead.
      result = create(ToolResultSchema, {
        content: [
          textBlock(
            `the tool's result is ${size} bytes encoded, more than the ${MAX_RESULT_BYTES} the lane service accepts; ask for less`,
          ),
        ],
      });
      isError = true;
    }
    await this.stage(run, item, { case: "executed", result, isError });
  }

  /** The tool's result; with an abort grace period, given up on once the grace is over. */
  private async awaitTool(run: RunControl, execution: Promise<ToolResultLike>): Promise<ToolResultLike> {
    const grace = this.abortGraceMs;
    if (grace === undefined) {
      return execution;
    }
    // A tool given up on may still fail later: that must not be an unhandled rejection.
    execution.catch(() => undefined);
    const signal = run.cancel.signal;
    let onAbort: (() => void) | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const givenUp = new Promise<never>((_, reject) => {
      const startGrace = (): void => {
        timer = setTimeout(() => reject(new ToolStopped()), grace);
      };
      if (signal.aborted) {
        startGrace();
      } else {
        onAbort = startGrace;
        signal.addEventListener("abort", onAbort, { once: true });
      }
    });
    givenUp.catch(() => undefined);
    try {
      return await Promise.race([execution, givenUp]);
    } finally {
      if (onAbort !== undefined) {
        signal.removeEventListener("abort", onAbort);
      }
      clearTimeout(timer);
    }
  }

  private async afterTool(
    run: RunControl,
    turnId: string,
    item: BatchCall,
    args: Record<string, unknown>,
    result: ToolResult,
    isError: boolean,
    replayed: boolean,
  ): Promise<{ result: ToolResult; isError: boolean }> {
    let event: AfterToolEvent = {
      laneId: this.laneId,
      operationId: run.operationId,
      turnId,
      toolCallId: item.toolCallId,
      toolName: item.toolName,
      args,
      content: result.content,
      details: result.detailsJson === undefined ? undefined : (JSON.parse(result.detailsJson) as unknown),
      isError,
      usage: result.usage,
      terminate: result.terminate,
      replayed,
    };
    for (const hook of this.hooks.afterTool ?? []) {
      if (run.cancelled) {
        break; // afterTool is skipped once an abort began
      }
      let patch;
      try {
        patch = await hook(event);
      } catch (error) {
        const text = `afterTool hook failed: ${messageOf(error)}`;
        return { result: create(ToolResultSchema, { content: [textBlock(text)] }), isError: true };
      }
      if (patch) {
        event = {
          ...event,
          ...(patch.content !== undefined ? { content: toResultProto({ content: patch.content }).result.content } : {}),
          ...(Object.hasOwn(patch, "details") ? { details: patch.details } : {}),
          ...(patch.isError !== undefined ? { isError: patch.isError } : {}),
          ...(Object.hasOwn(patch, "usage") ? { usage: patch.usage } : {}),
          ...(patch.terminate !== undefined ? { terminate: patch.terminate } : {}),
        };
      }
    }
    const patched = create(ToolResultSchema, {
      content: [...event.content],
      addedToolNames: result.addedToolNames,
      terminate: event.terminate,
    });
    if (event.details !== undefined) {
      patched.detailsJson = JSON.stringify(event.details);
    }
    if (event.usage !== undefined) {
      patched.usage = event.usage;
    }
    return { result: patched, isError: event.isError };
  }
}

/** The message of anything thrown (its type's name when it has none). */
export function messageOf(error: unknown): string {
  if (error instanceof Error) {
    return error.message || error.name;
  }
  return String(error);
}

