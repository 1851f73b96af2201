/**
 * A lane snapshot as page elements (no I/O): the transcript (user and assistant text, the
 * assistant's thinking dimmed, the tool calls asked for, each placed tool result) and the open
 * operation — the assistant message streaming in, a scheduled retry, and the
 * presentation-active tools: running ones with their elapsed time and latest progress, settled
 * ones with their result marked "waiting for placement" — or, with no operation open, the last
 * result. Error results are drawn with the `error` class (red). Rows and entries carry
 * `data-call-id`, so a reader (and the browser tests) can tell where each call is.
 *
 * The streaming message is the open operation's `streamingMessage`, as the reducer folds it:
 * the latest partial committed by AppendAssistantStream (`message_start`/`message_update`),
 * gone at its `message_end` — the group that settles the message (SettleAssistantMessage)
 * or fails it (ScheduleRetry), whose `entry_added` puts the message in the transcript in the
 * same redraw. It is drawn as the terminal view draws it: each block so far, in order; thinking
 * dimmed; the text ending in a cursor while it is the last block; a tool call being written
 * with its arguments so far and ` …` while it is the last block. The retry line is the
 * operation's `retry`: why the last attempt failed, the attempt scheduled and the time left
 * until its `nextAttemptTime`. The inbox (`renderQueue`) lists the messages queued for a run.
 */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import {
  OperationKind,
  OperationResultStatus,
  OperationStatus,
  QueueKind,
  StopReason,
  type AgentMessage,
  type AssistantMessage,
  type ContentBlock,
  type Entry,
  type LaneSnapshot,
  type OperationResult,
  type QueuedItem,
  type RetryState,
  type SnapshotOperation,
  type ThinkingContent,
} from "@lane/client";
import type { ToolClock } from "./clock.js";
import { h } from "./dom.js";

export const WAITING_MARK = "waiting for placement";
/** Ends the text of an assistant message still streaming. */
export const CURSOR = "▍";

/** The text of `blocks`: text and thinking blocks joined by newlines, images as `[image]`. */
export function contentText(blocks: readonly ContentBlock[]): string {
  const parts: string[] = [];
  for (const block of blocks) {
    switch (block.block.case) {
      case "text":
        parts.push(block.block.value.text);
        break;
      case "thinking":
        parts.push(block.block.value.thinking);
        break;
      case "image":
        parts.push(`[image ${block.block.value.mimeType}]`);
        break;
      default:
        break;
    }
  }
  return parts.join("\n");
}

/** JSON text on one line, cut to `limit` characters. */
function compactJson(text: string, limit = 80): string {
  let shown = text;
  try {
    shown = JSON.stringify(JSON.parse(text));
  } catch {
    // not JSON: shown as it is
  }
  return shown.length <= limit ? shown : `${shown.slice(0, limit - 1)}…`;
}

/** A thinking block's label and text (or that it was redacted). */
function thinkingParts(block: ThinkingContent): (HTMLElement | string)[] {
  return [h("b", {}, "thinking "), block.redacted ? "(redacted)" : h("span", { class: "body" }, block.thinking)];
}

/** The assistant message still streaming: each block as it is so far, in order. */
export function renderStreaming(message: AssistantMessage): HTMLElement {
  const blocks = message.content;
  const parts = blocks.map((block, index): HTMLElement | null => {
    const last = index === blocks.length - 1;
    switch (block.block.case) {
      case "thinking":
        return h("div", { class: "block thinking" }, ...thinkingParts(block.block.value));
      case "text":
        return h("div", { class: "block text" }, h("b", {}, "assistant "),
          h("span", { class: "body" }, block.block.value.text),
          last ? h("span", { class: "cursor" }, CURSOR) : null);
      case "toolCall": {
        const call = block.block.value;
        return h("div", { class: "block call", "data-call-id": call.id || undefined },
          `→ ${call.name} ${compactJson(call.argumentsJson)}${last ? " …" : ""}`);
      }
      case "image":
        return h("div", { class: "block image" }, `[image ${block.block.value.mimeType}]`);
      default:
        return null;
    }
  });
  const shown = parts.filter((part) => part !== null);
  return h(
    "div",
    { id: "streaming", "data-blocks": String(blocks.length) },
    ...(shown.length > 0
      ? shown
      : [h("div", { class: "block text" }, h("b", {}, "assistant "), h("span", { class: "cursor" }, CURSOR))]),
  );
}

/** "in 2.5s" until `atMs`, "due" once it has passed. */
export function countdown(atMs: number, now = Date.now()): string {
  return atMs > now ? `in ${seconds((atMs - now) / 1000)}` : "due";
}

function retryLine(retry: RetryState): HTMLElement {
  const at = retry.nextAttemptTime === undefined ? undefined : timestampMs(retry.nextAttemptTime);
  const cause = retry.errorMessage ? `: ${retry.errorMessage}` : "";
  return h(
    "p",
    {
      id: "retry",
      "data-attempt": String(retry.attempt),
      "data-max-attempts": String(retry.maxAttempts),
      "data-next-attempt-ms": at?.toString(),
    },
    `model call failed${cause} · attempt ${retry.attempt} of ${retry.maxAttempts} `,
    at === undefined
      ? "scheduled"
      : h("span", { class: "countdown", "data-at": String(at) }, countdown(at)),
  );
}

const QUEUE_NAMES: Partial<Record<QueueKind, string>> = {
  [QueueKind.STEER]: "steer",
  [QueueKind.FOLLOW_UP]: "follow-up",
  [QueueKind.NEXT_RUN]: "next run",
  [QueueKind.WRITE]: "entry",
};

/** The lane's inbox: the messages queued (`lane send`, EnqueueMessage), waiting for a run to
 *  take them, each with how it will be delivered; nothing when the inbox is empty. */
export function renderQueue(snapshot: LaneSnapshot): HTMLElement | null {
  if (snapshot.queues.length === 0) {
    return null;
  }
  const items = snapshot.queues.map((item: QueuedItem) => {
    const text =
      item.item.case === "message" ? messageText(item.item.value) : `custom ${item.item.value?.customType ?? ""}`;
    return h("li", { class: "entry queued", "data-entry-id": item.entryId },
      h("b", {}, `queued ${QUEUE_NAMES[item.kind] ?? "item"} `), text);
  });
  return h("section", { id: "queue" }, h("header", {}, `queued (${items.length})`), h("ul", {}, ...items));
}

function messageText(message: AgentMessage): string {
  const value = message.message;
  switch (value.case) {
    case "user":
      return contentText(value.value.content);
    case "assistant":
      return contentText(value.value.content);
    case "toolResult":
      return contentText(value.value.content);
    default:
      return "";
  }
}

function messageItems(message: AgentMessage | undefined): HTMLElement[] {
  const value = message?.message;
  switch (value?.case) {
    case "user":
      return [h("li", { class: "entry user" }, h("b", {}, "you "), contentText(value.value.content))];
    case "assistant": {
      const assistant = value.value;
      const items: HTMLElement[] = [];
      for (const block of assistant.content) {
        if (block.block.case === "thinking") {
          items.push(h("li", { class: "entry thinking" }, ...thinkingParts(block.block.value)));
        }
      }
      const text = contentText(assistant.content.filter((b) => b.block.case === "text"));
      items.push(h("li", { class: "entry assistant" }, h("b", {}, "assistant "), text || "(no text)"));
      for (const block of assistant.content) {
        if (block.block.case === "toolCall") {
          const call = block.block.value;
          items.push(
            h(
              "li",
              { class: "entry call", "data-call-id": call.id },
              `→ ${call.name} ${compactJson(call.argumentsJson)}`,
            ),
          );
        }
      }
      if (assistant.stopReason === StopReason.ERROR) {
        items.push(h("li", { class: "entry error" }, `assistant error: ${assistant.errorMessage ?? ""}`));
      }
      return items;
    }
    case "toolResult": {
      const result = value.value;
      return [
        h(
          "li",
          {
            class: result.isError ? "entry tool-result error" : "entry tool-result",
            "data-call-id": result.toolCallId,
          },
          `${result.isError ? "✗" : "✓"} ${result.toolName}: `,
          h("pre", {}, contentText(result.content)),
        ),
      ];
    }
    case "custom":
      return [h("li", { class: "entry dim" }, `[${value.value.role}]`)];
    default:
      return [];
  }
}

function entryItems(entry: Entry): HTMLElement[] {
  switch (entry.payload.case) {
    case "message":
      return messageItems(entry.payload.value.message);
    case "compaction":
      return [h("li", { class: "entry dim" }, `[compaction] ${entry.payload.value.summary.split("\n")[0] ?? ""}`)];
    case "branchSummary":
      return [h("li", { class: "entry dim" }, "[branch summary]")];
    case "custom":
      return [h("li", { class: "entry dim" }, `[${entry.payload.value.customType}]`)];
    default:
      return [];
  }
}

/** The transcript, oldest first. */
export function renderTranscript(snapshot: LaneSnapshot): HTMLElement {
  return h("ol", { id: "transcript" }, ...snapshot.transcript.flatMap(entryItems));
}

const KIND_NAMES: Record<number, string> = {
  [OperationKind.RUN]: "run",
  [OperationKind.COMPACTION]: "compaction",
  [OperationKind.NAVIGATION]: "navigation",
};

const RESULT_NAMES: Record<number, string> = {
  [OperationResultStatus.COMPLETED]: "completed",
  [OperationResultStatus.DECLINED]: "declined",
  [OperationResultStatus.ABORTED]: "aborted",
  [OperationResultStatus.FAILED]: "failed",
};

/** "0.0s": the elapsed time of a running row, as the ticker rewrites it. */
export function seconds(value: number): string {
  return `${value.toFixed(1)}s`;
}

function toolRows(operation: SnapshotOperation, clock: ToolClock): HTMLElement {
  const rows = operation.runningTools.map((row) => {
    if (row.state.case === "settled") {
      const settled = row.state.value;
      return h(
        "li",
        {
          class: settled.isError ? "tool settled error" : "tool settled",
          "data-call-id": settled.toolCallId,
          "data-state": "settled",
        },
        h("div", {}, `${settled.isError ? "✗" : "✓"} ${settled.toolName} · ${settled.isError ? "error" : "done"} · `,
          h("span", { class: "waiting" }, WAITING_MARK), ` · ${compactJson(settled.argumentsJson, 50)}`),
        h("pre", {}, contentText(settled.result?.content ?? [])),
      );
    }
    const running = row.state.value;
    const id = running?.toolCallId ?? "";
    const progress = contentText(running?.result?.content ?? []).trimEnd().split("\n").at(-1) ?? "";
    return h(
      "li",
      { class: "tool running", "data-call-id": id, "data-state": "running" },
      h("div", {}, h("span", { class: "spinner" }), ` ${running?.toolName ?? "?"} · running `,
        h("span", { class: "elapsed", "data-call-id": id }, seconds(clock.elapsed(id))),
        ` · ${compactJson(running?.argumentsJson ?? "", 50)}`),
      progress ? h("pre", { class: "progress" }, progress) : null,
    );
  });
  return h("ul", { id: "tools" }, ...rows);
}

/** The open operation with its tools and the Abort button, or the last result. */
export function renderOperation(
  snapshot: LaneSnapshot,
  clock: ToolClock,
  onAbort: (operationId: string) => void,
): HTMLElement {
  const operation = snapshot.operation;
  if (operation === undefined) {
    return lastResult(snapshot.lastResult);
  }
  const aborting = operation.status === OperationStatus.ABORTING;
  const abort = h("button", { id: "abort", type: "button" }, aborting ? "Aborting…" : "Abort");
  abort.disabled = aborting;
  abort.addEventListener("click", () => onAbort(operation.id));
  return h(
    "section",
    {
      id: "operation",
      "data-operation-id": operation.id,
      "data-status": aborting ? "aborting" : "open",
    },
    h("header", {},
      h("b", {}, KIND_NAMES[operation.kind] ?? "operation"), ` ${operation.id} · `,
      h("span", { class: aborting ? "status error" : "status" }, aborting ? "aborting" : "open"),
      " ", abort),
    operation.streamingMessage ? renderStreaming(operation.streamingMessage) : null,
    operation.retry ? retryLine(operation.retry) : null,
    toolRows(operation, clock),
  );
}

function lastResult(result: OperationResult | undefined): HTMLElement {
  if (result === undefined) {
    return h("section", { id: "last-result" }, "no operation yet");
  }
  const name = RESULT_NAMES[result.status] ?? "ended";
  const bad = result.status === OperationResultStatus.FAILED || result.status === OperationResultStatus.ABORTED;
  return h(
    "section",
    { id: "last-result", "data-status": name, class: bad ? "error" : undefined },
    `last ${KIND_NAMES[result.kind] ?? "operation"}: ${name}`,
    result.error ? ` · ${result.error.code}: ${result.error.message}` : "",
  );
}
