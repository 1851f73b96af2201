/**
 * The model side of the driver SDK: what a model is asked, and a scripted stand-in for an LLM.
 *
 * A model is any async function `(request: ModelRequest) => AssistantMessage`. The driver asks
 * it once per turn with the lane's durable transcript (so a driver taking a run over asks
 * exactly what the first one would have) and the tools it can run. A model throws `ModelError`
 * to say why it failed: `retryable` ones (rate limits, overload) are asked again through
 * `ScheduleRetry`/`StartRetry` after `retryAfterMs` (or a backoff); any other error fails the
 * run with its message.
 *
 * `ScriptedModel` answers from a fixed script, statelessly: the step it answers is the number
 * of assistant messages after the last user message of the transcript, so it picks up where a
 * crashed driver left off. After the last step it answers `finalText` without tool calls.
 * The same rules as the Python SDK's `ScriptedModel`.
 */
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import type { Entry } from "./gen/lane/v1/entries_pb.js";
import {
  AssistantMessageSchema,
  StopReason,
  type AgentMessage,
  type AssistantMessage,
  type ContentBlock,
} from "./gen/lane/v1/messages_pb.js";
import { textBlock, type Tool } from "./tools.js";

/** One turn's question to the model. */
export interface ModelRequest {
  readonly laneId: string;
  readonly operationId: string;
  readonly turnId: string;
  /** The lane's transcript (message entries, oldest first), as durably stored. */
  readonly messages: readonly AgentMessage[];
  /** The transcript's entries (oldest first), compactions and branch summaries included. */
  readonly entries: readonly Entry[];
  /** The tools the driver can run (those the lane's configuration makes active). */
  readonly tools: readonly Tool<any>[];
  /** Fires once the run's abort is seen (the driver then stops waiting for the answer). */
  readonly signal: AbortSignal;
}

/** A model: see the module comment. */
export type Model = (request: ModelRequest) => Promise<AssistantMessage>;

/** A failed model call; `retryable` ones are asked again (see the module comment). */
export class ModelError extends Error {
  override readonly name = "ModelError";
  readonly retryable: boolean;
  /** How long the provider asked to wait before the next attempt. */
  readonly retryAfterMs: number | undefined;
  /** The run's error code when this fails it (default `model_error`). */
  readonly code: string;

  constructor(message: string, options: { retryable?: boolean; retryAfterMs?: number; code?: string } = {}) {
    super(message);
    this.retryable = options.retryable === true;
    this.retryAfterMs = options.retryAfterMs;
    this.code = options.code ?? "model_error";
  }
}

/** A tool call of a scripted step; `args` as text is sent verbatim (it may be invalid JSON). */
export interface ScriptedCall {
  name: string;
  args?: Record<string, unknown> | string;
  id?: string;
}

/** One scripted assistant message: text, tool calls, and optionally its stop reason. */
export interface ScriptStep {
  text?: string;
  calls?: readonly ScriptedCall[];
  /** Default: TOOL_USE with calls, else STOP. */
  stopReason?: StopReason;
}

/** A settled assistant message (time-stamped now); calls without an id get `{prefix}_{n}`. */
export function assistantMessage(
  text = "",
  calls: readonly ScriptedCall[] = [],
  stopReason?: StopReason,
  callIdPrefix = "call",
): AssistantMessage {
  const content: ContentBlock[] = text ? [textBlock(text)] : [];
  calls.forEach((call, index) => {
    const argumentsJson = typeof call.args === "string" ? call.args : JSON.stringify(call.args ?? {});
    content.push({
      $typeName: "lane.v1.ContentBlock",
      block: {
        case: "toolCall",
        value: {
          $typeName: "lane.v1.ToolCallContent",
          id: call.id ?? `${callIdPrefix}_${index + 1}`,
          name: call.name,
          argumentsJson,
        },
      },
    });
  });
  return create(AssistantMessageSchema, {
    content,
    api: "scripted",
    provider: "scripted",
    model: "scripted-model",
    stopReason: stopReason ?? (calls.length > 0 ? StopReason.TOOL_USE : StopReason.STOP),
    timestamp: timestampNow(),
  });
}

/** A model that answers from a script (see the module comment). */
export class ScriptedModel {
  readonly steps: readonly ScriptStep[];
  readonly finalText: string;
  /** Milliseconds each answer takes (to look like a model thinking). */
  readonly delayMs: number;
  /** How many times the model was asked. */
  calls = 0;

  constructor(steps: readonly ScriptStep[], options: { finalText?: string; delayMs?: number } = {}) {
    this.steps = steps;
    this.finalText = options.finalText ?? "Done.";
    this.delayMs = options.delayMs ?? 0;
  }

  /** The script step the transcript `messages` is at. */
  stepIndex(messages: readonly AgentMessage[]): number {
    let index = 0;
    for (const message of messages) {
      if (message.message.case === "user") {
        index = 0;
      } else if (message.message.case === "assistant") {
        index += 1;
      }
    }
    return index;
  }

  /** This model as a `Model` function. */
  get model(): Model {
    return (request) => this.answer(request);
  }

  /** Answer `request` from the script. */
  async answer(request: ModelRequest): Promise<AssistantMessage> {
    this.calls += 1;
    if (this.delayMs > 0) {
      await new Promise((resolve) => setTimeout(resolve, this.delayMs));
    }
    const index = this.stepIndex(request.messages);
    const step = this.steps[index];
    if (step === undefined) {
      return assistantMessage(this.finalText);
    }
    return assistantMessage(step.text ?? "", step.calls ?? [], step.stopReason, `call_${index + 1}`);
  }
}
