/**
 * Tools of the driver SDK: declaration, results, and what a running call can do.
 *
 * A tool is a name, a JSON Schema for its arguments (checked with Ajv), a replay policy and an
 * async `execute(args, ctx)`:
 *
 * ```ts
 * const greet = defineTool({
 *   name: "greet",
 *   parameters: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
 *   replay: "safe",        // "never" (default): never executed twice, even after a crash
 *   async execute(args: { name: string }, ctx) {
 *     await ctx.progress("thinking about it");
 *     return `hello, ${args.name}`;
 *   },
 * });
 * ```
 *
 * `execute` returns a `ToolResultLike`: a string (one text block), a `ToolOutput` (content,
 * details, usage, added tool names, terminate, isError) or a `lane.v1.ToolResult` message. A
 * tool that throws produces an error result whose text is the error's message.
 *
 * `ToolContext` is the running call's view: its ids, `progress(result)` and
 * `checkpoint(result)` (each one `UpdateToolCall`; a checkpoint is also the call's durable
 * recovery point) and `signal`, an `AbortSignal` that fires once the run's abort is seen (by
 * whoever pressed it) or the driver lost its lease. A tool stops when it fires and returns what
 * it has. The same rules as the Python SDK's `lane.client.tools`.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { Ajv, type ValidateFunction } from "ajv";
import { Ajv2020 } from "ajv/dist/2020.js";
import {
  ContentBlockSchema,
  ToolResultSchema,
  type ContentBlock,
  type ToolResult,
  type Usage,
} from "./gen/lane/v1/messages_pb.js";

/** `"safe"`: the whole effect may be repeated after a crash (reads, queries); `"never"`: a
 *  call interrupted by a crash gets an interruption result instead of running again. */
export type ReplayPolicyName = "never" | "safe";

/** A tool's result or progress, in plain values (the harness's `AgentToolResult`). */
export interface ToolOutput {
  /** A string (one text block) or a list of strings and content blocks. */
  content?: string | readonly (string | ContentBlock)[];
  /** Any JSON value for applications; `undefined` means absent. */
  details?: unknown;
  /** Token and cost accounting of the tool (e.g. a sub-agent). */
  usage?: Usage;
  /** Tools this result makes active for the lane once placed. */
  addedToolNames?: readonly string[];
  /** Ask the run to stop after this batch (it does when every call of the batch asks). */
  terminate?: boolean;
  /** The result reports a failure (only meaningful for a final result). */
  isError?: boolean;
}

/** What `execute` may return, and what `progress`/`checkpoint` accept. */
export type ToolResultLike = string | ToolOutput | ToolResult;

/** An error result with one text block. */
export function errorResult(text: string, fields: Omit<ToolOutput, "content" | "isError"> = {}): ToolOutput {
  return { ...fields, content: text, isError: true };
}

/** A content block holding `text`. */
export function textBlock(text: string): ContentBlock {
  return create(ContentBlockSchema, { block: { case: "text", value: { text } } });
}

function isToolResultMessage(value: unknown): value is ToolResult {
  return typeof value === "object" && value !== null && (value as { $typeName?: string }).$typeName === "lane.v1.ToolResult";
}

/**
 * `value` as a `lane.v1.ToolResult` and its isError flag, normalized like the service: absent
 * details and usage stay absent, no empty addedToolNames, terminate only when true.
 */
export function toResultProto(value: ToolResultLike): { result: ToolResult; isError: boolean } {
  if (isToolResultMessage(value)) {
    return { result: create(ToolResultSchema, value), isError: false };
  }
  const output: ToolOutput = typeof value === "string" ? { content: value } : value;
  if (typeof output !== "object" || output === null) {
    throw new TypeError(`a tool must return a string, a ToolOutput or a lane.v1.ToolResult, not ${typeof value}`);
  }
  const content = output.content ?? [];
  const items = typeof content === "string" ? [content] : content;
  const result = create(ToolResultSchema, {
    content: items.map((item) => (typeof item === "string" ? textBlock(item) : item)),
    addedToolNames: [...(output.addedToolNames ?? [])],
    terminate: output.terminate === true,
  });
  if (output.details !== undefined) {
    result.detailsJson = JSON.stringify(output.details);
  }
  if (output.usage !== undefined) {
    result.usage = output.usage;
  }
  return { result, isError: output.isError === true };
}

/** The encoded size of a result, as the service counts it against its payload limit. */
export function resultBytes(result: ToolResult): number {
  return toBinary(ToolResultSchema, result).length;
}

/** Sends a progress report of the running call (the driver's `UpdateToolCall`). */
export type Reporter = (result: ToolResult, checkpoint: boolean) => Promise<void>;

/** What a running tool call sees: its ids, progress reporting, and the abort signal. */
export class ToolContext {
  readonly laneId: string;
  readonly operationId: string;
  readonly turnId: string;
  readonly toolCallId: string;
  readonly toolName: string;
  /** The id the call's result entry will get. */
  readonly resultEntryId: string;
  /** True when this execution is a safe replay after a takeover. */
  readonly replaying: boolean;
  /** Fires once the run's abort is seen, or the driver lost the run: stop, return what you have. */
  readonly signal: AbortSignal;
  private readonly report: Reporter;
  private closed = false;

  constructor(init: {
    laneId: string;
    operationId: string;
    turnId: string;
    toolCallId: string;
    toolName: string;
    resultEntryId: string;
    replaying: boolean;
    signal: AbortSignal;
    report: Reporter;
  }) {
    this.laneId = init.laneId;
    this.operationId = init.operationId;
    this.turnId = init.turnId;
    this.toolCallId = init.toolCallId;
    this.toolName = init.toolName;
    this.resultEntryId = init.resultEntryId;
    this.replaying = init.replaying;
    this.signal = init.signal;
    this.report = init.report;
  }

  /** Whether the run's abort has been seen (`signal.aborted`). */
  get cancelled(): boolean {
    return this.signal.aborted;
  }

  /** Report the complete latest progress (one `UpdateToolCall`; watchers see it). */
  progress(result: ToolResultLike): Promise<void> {
    return this.send(result, false);
  }

  /** Report progress and keep it as the call's durable recovery point: if the driver dies, an
   *  interrupted call's result starts with this content. */
  checkpoint(result: ToolResultLike): Promise<void> {
    return this.send(result, true);
  }

  /** Refuse further progress (the driver calls this once the call's outcome is decided). */
  close(): void {
    this.closed = true;
  }

  private async send(value: ToolResultLike, checkpoint: boolean): Promise<void> {
    if (this.closed) {
      throw new Error(`tool call ${this.toolCallId} already finished; it cannot report progress`);
    }
    await this.report(toResultProto(value).result, checkpoint);
  }
}

/** A JSON Schema object (any draft Ajv knows; `$schema` picks draft-07, else 2020-12). */
export type JsonSchema = Readonly<Record<string, unknown>>;

/** The declaration of a tool (`defineTool`). */
export interface ToolSpec<Args = Record<string, unknown>> {
  name: string;
  /** JSON Schema of the arguments object; compiled (and so checked) when the tool is defined. */
  parameters: JsonSchema;
  /** Default `"never"`. */
  replay?: ReplayPolicyName;
  /** For the model. */
  description?: string;
  /** Runs the call with arguments that passed `parameters`. */
  execute: (args: Args, ctx: ToolContext) => Promise<ToolResultLike>;
}

// One validator per draft, shared: Ajv caches compiled schemas. strict: false because tool
// schemas come from model-facing declarations (unknown keywords and formats are ignored, as
// the Python SDK's jsonschema does).
const draft07 = new Ajv({ strict: false, allErrors: false });
const draft2020 = new Ajv2020({ strict: false, allErrors: false });

function compile(schema: JsonSchema): ValidateFunction {
  const declared = typeof schema["$schema"] === "string" ? schema["$schema"] : "";
  const ajv = /draft-0[67]/.test(declared) ? draft07 : draft2020;
  return ajv.compile(schema as Record<string, unknown>);
}

/** A tool the driver can run (see the module comment). */
export class Tool<Args = Record<string, unknown>> {
  readonly name: string;
  readonly parameters: JsonSchema;
  readonly replay: ReplayPolicyName;
  readonly description: string;
  readonly execute: (args: Args, ctx: ToolContext) => Promise<ToolResultLike>;
  private readonly validator: ValidateFunction;

  constructor(spec: ToolSpec<Args>) {
    if (!spec.name) {
      throw new Error("a tool needs a name");
    }
    const replay = spec.replay ?? "never";
    if (replay !== "never" && replay !== "safe") {
      throw new Error(`tool ${spec.name}: replay must be "never" or "safe"`);
    }
    this.name = spec.name;
    this.parameters = spec.parameters;
    this.replay = replay;
    this.description = spec.description ?? "";
    this.execute = spec.execute;
    this.validator = compile(spec.parameters);
  }

  /** `undefined` when `args` match the schema, else the validation message. */
  validate(args: unknown): string | undefined {
    if (typeof args !== "object" || args === null || Array.isArray(args)) {
      return `arguments of tool ${this.name} must be a JSON object`;
    }
    if (this.validator(args)) {
      return undefined;
    }
    const error = this.validator.errors?.[0];
    const at = error?.instancePath ? ` at ${error.instancePath}` : "";
    return `invalid arguments for tool ${this.name}${at}: ${error?.message ?? "does not match the schema"}`;
  }
}

/** Declare a tool (`new Tool(spec)`); `Args` types the arguments `execute` receives. */
export function defineTool<Args = Record<string, unknown>>(spec: ToolSpec<Args>): Tool<Args> {
  return new Tool(spec);
}
