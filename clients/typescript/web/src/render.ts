/**
 * A lane snapshot as page elements (no I/O): the transcript (user and assistant text, the tool
 * calls asked for, each placed tool result) and the open operation with its presentation-active
 * tools — running ones with their elapsed time and latest progress, settled ones with their
 * result marked "waiting for placement" — or, with no operation open, the last result. Error
 * results are drawn with the `error` class (red). Rows and entries carry `data-call-id`, so a
 * reader (and the browser tests) can tell where each call is.
 */
import {
  OperationKind,
  OperationResultStatus,
  OperationStatus,
  StopReason,
  type AgentMessage,
  type ContentBlock,
  type Entry,
  type LaneSnapshot,
  type OperationResult,
  type SnapshotOperation,
} from "@lane/client";
import type { ToolClock } from "./clock.js";
import { h } from "./dom.js";

export const WAITING_MARK = "waiting for placement";

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

function messageItems(message: AgentMessage | undefined): HTMLElement[] {
  const value = message?.message;
  switch (value?.case) {
    case "user":
      return [h("li", { class: "entry user" }, h("b", {}, "you "), contentText(value.value.content))];
    case "assistant": {
      const assistant = value.value;
      const text = contentText(assistant.content.filter((b) => b.block.case === "text"));
      const items = [h("li", { class: "entry assistant" }, h("b", {}, "assistant "), text || "(no text)")];
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
    operation.streamingMessage
      ? h("p", { class: "streaming" }, contentText(operation.streamingMessage.content))
      : null,
    operation.retry
      ? h("p", { class: "error" }, `retry ${operation.retry.attempt} of ${operation.retry.maxAttempts}`)
      : null,
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
