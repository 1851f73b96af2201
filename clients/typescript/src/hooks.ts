/**
 * Hooks around each tool call (docs/contract.md, Tool calls), as in the Python SDK.
 *
 * `beforeTool` runs for a fresh call after its arguments were validated, before its intent is
 * committed. It returns nothing (go ahead), `replaceArguments(args)` (run with these instead;
 * validated again, invalid ones give the call an INVALID_ARGUMENTS result) or
 * `deny(reason, { terminate })` (the call gets a DENIED result). A hook that throws denies the
 * call (it fails closed). Several hooks form a pipeline: each sees the arguments the previous
 * one chose; the first deny wins.
 *
 * `afterTool` runs after a real execution (fresh or safely replayed), never for a synthetic
 * result, and not once the run's abort was seen. It returns nothing or an `AfterToolPatch`
 * replacing any of content, details, isError, usage and terminate (a key present with
 * `undefined` removes details or usage). A hook that throws turns the result into an error
 * result naming the failure.
 *
 * ```ts
 * const noRm: BeforeToolHook = (event) =>
 *   event.toolName === "shell" && String(event.args.command).includes("rm ")
 *     ? deny("rm is not allowed here")
 *     : undefined;
 * new Driver(lanes, "lane-1", tools, { hooks: { beforeTool: [noRm] } });
 * ```
 */
import type { ContentBlock, Usage } from "./gen/lane/v1/messages_pb.js";

/** A fresh call about to start, with its validated arguments (a copy: change it freely). */
export interface BeforeToolEvent {
  readonly laneId: string;
  readonly operationId: string;
  readonly turnId: string;
  readonly toolCallId: string;
  readonly toolName: string;
  readonly args: Record<string, unknown>;
}

/** Do not run the call: it gets an error result whose text is `reason`. */
export interface Deny {
  readonly kind: "deny";
  readonly reason: string;
  readonly terminate: boolean;
}

/** Run the call with these arguments instead (revalidated against the tool's schema). */
export interface ReplaceArguments {
  readonly kind: "replace";
  readonly args: Record<string, unknown>;
}

/** What a `beforeTool` hook decides; `undefined`: go ahead. */
export type BeforeToolDecision = Deny | ReplaceArguments | undefined | void;

export type BeforeToolHook = (event: BeforeToolEvent) => BeforeToolDecision | Promise<BeforeToolDecision>;

/** Deny the call (`terminate`: ask the run to stop after the batch). */
export function deny(reason: string, options: { terminate?: boolean } = {}): Deny {
  return { kind: "deny", reason, terminate: options.terminate === true };
}

/** Run the call with `args` instead. */
export function replaceArguments(args: Record<string, unknown>): ReplaceArguments {
  return { kind: "replace", args };
}

/** A call's result after its execution, before it is staged. */
export interface AfterToolEvent {
  readonly laneId: string;
  readonly operationId: string;
  readonly turnId: string;
  readonly toolCallId: string;
  readonly toolName: string;
  readonly args: Record<string, unknown>;
  readonly content: readonly ContentBlock[];
  /** The details as a JSON value; `undefined` when absent. */
  readonly details: unknown;
  readonly isError: boolean;
  readonly usage: Usage | undefined;
  readonly terminate: boolean;
  /** The execution was a safe replay after a takeover. */
  readonly replayed: boolean;
}

/** Field-by-field replacement of a result; a missing key leaves the field alone. */
export interface AfterToolPatch {
  content?: string | readonly (string | ContentBlock)[];
  details?: unknown;
  isError?: boolean;
  usage?: Usage | undefined;
  terminate?: boolean;
}

export type AfterToolHook = (event: AfterToolEvent) => AfterToolPatch | undefined | void | Promise<AfterToolPatch | undefined | void>;

/** The hook pipelines of a driver. */
export interface Hooks {
  beforeTool?: readonly BeforeToolHook[];
  afterTool?: readonly AfterToolHook[];
}
