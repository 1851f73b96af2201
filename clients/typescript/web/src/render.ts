/**
 * A lane snapshot as page elements (no I/O): the transcript (user and assistant text, the
 * assistant's thinking dimmed, the tool calls asked for, each placed tool result) and the open
 * operation — the assistant message streaming in, a scheduled retry, and the
 * presentation-active tools: running ones with their elapsed time and latest progress, settled
 * ones with their result marked "waiting for placement" — or, with no operation open, the last
 * result. Error results are drawn with the `error` class (red). Rows and entries carry
 * `data-call-id`, so a reader (and the browser tests) can tell where each call is.
 *
 * Long text (a result, a message, a call's arguments) is cut to a screenful with a button that
 * shows all of it in place — the snapshot holds every entry whole, so nothing is fetched — and
 * every block has a copy button. What the user expanded stays expanded across redraws
 * (`Look.expanded`, keyed by entry and part). Each entry links to the history at the revision
 * before it (`Look.historyHref`).
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
  OperationStatus,
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
import { button, copyButton, h } from "./dom.js";
import { byteSize, utf8Bytes } from "./format.js";
import { badResult, KIND_NAMES, QUEUE_NAMES, RESULT_NAMES } from "./names.js";

export const WAITING_MARK = "waiting for placement";
/** Ends the text of an assistant message still streaming. */
export const CURSOR = "▍";
/** Text longer than this (characters, or lines) is cut until expanded. */
export const CUT_CHARS = 1500;
export const CUT_LINES = 30;

/** How the page draws what it holds: what the user expanded, and where "before this" leads. */
export interface Look {
  readonly expanded: Set<string>;
  /** The history at a revision; undefined: entries get no history link. */
  readonly historyHref?: (revision: bigint) => string;
}

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
export function compactJson(text: string, limit = 80): string {
  const shown = oneLine(text);
  return shown.length <= limit ? shown : `${shown.slice(0, limit - 1)}…`;
}

function oneLine(text: string): string {
  try {
    return JSON.stringify(JSON.parse(text));
  } catch {
    return text; // not JSON: shown as it is
  }
}

/** JSON text indented, for reading (as it is when it is not JSON). */
export function prettyJson(text: string): string {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** Where `text` is cut while collapsed (its length when it is short enough). */
export function cutAt(text: string): number {
  let at = Math.min(text.length, CUT_CHARS);
  let lines = 0;
  for (let i = 0; i < at; i++) {
    if (text.charCodeAt(i) === 10 && ++lines === CUT_LINES) {
      at = i;
      break;
    }
  }
  return at;
}

/**
 * `text` in a box of its own (long lines wrap, a long block is cut with a "show all" button),
 * with a copy button. `key` names it in `look.expanded`.
 */
export function textBlock(key: string, text: string, look: Look, what: string, className = "text"): HTMLElement {
  const box = h("div", { class: `block-text ${className}`, "data-key": key });
  const draw = (): void => {
    const at = cutAt(text);
    const open = look.expanded.has(key) || at >= text.length;
    const shown = open ? text : `${text.slice(0, at)}…`;
    box.dataset.expanded = String(open && at < text.length);
    box.dataset.bytes = String(utf8Bytes(text));
    const toggle =
      at >= text.length
        ? null
        : button(
            { class: "expand", "aria-expanded": String(open) },
            open ? "Show less" : `Show all · ${byteSize(utf8Bytes(text.slice(at)))} more`,
            () => {
              if (look.expanded.has(key)) {
                look.expanded.delete(key);
              } else {
                look.expanded.add(key);
              }
              draw();
              box.querySelector<HTMLElement>("button.expand")?.focus();
            },
          );
    box.replaceChildren(h("pre", {}, shown), h("div", { class: "block-tools" }, toggle, copyButton(() => text, what)));
  };
  draw();
  return box;
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

/** An entry's text, inline while short, in a box of its own (cut, expandable) when long. */
function inlineOrBlock(key: string, text: string, look: Look, what: string): (HTMLElement | string)[] {
  return text.length <= 200 && !text.includes("\n") ? [text] : [textBlock(key, text, look, what)];
}

/** The link to the history at the revision before `entry` was placed (the page before it). */
function beforeLink(entry: Entry, look: Look): HTMLElement | null {
  if (look.historyHref === undefined || entry.seq <= 1n) {
    return null;
  }
  return h("a", {
    class: "before",
    href: look.historyHref(entry.seq - 1n),
    title: "The lane as it was before this (history)",
    "aria-label": "The lane as it was before this",
  });
}

function messageItems(entry: Entry, message: AgentMessage | undefined, look: Look): HTMLElement[] {
  const value = message?.message;
  const id = entry.id;
  switch (value?.case) {
    case "user":
      return [h("li", { class: "entry user", "data-entry-id": id }, beforeLink(entry, look), h("b", {}, "you "),
        ...inlineOrBlock(`${id}:text`, contentText(value.value.content), look, "message"))];
    case "assistant": {
      const assistant = value.value;
      const items: HTMLElement[] = [];
      for (const block of assistant.content) {
        if (block.block.case === "thinking") {
          const thinking = block.block.value;
          items.push(h("li", { class: "entry thinking", "data-entry-id": id }, h("b", {}, "thinking "),
            ...(thinking.redacted ? ["(redacted)"] : inlineOrBlock(`${id}:thinking`, thinking.thinking, look, "thinking"))));
        }
      }
      const text = contentText(assistant.content.filter((b) => b.block.case === "text"));
      items.push(h("li", { class: "entry assistant", "data-entry-id": id }, beforeLink(entry, look), h("b", {}, "assistant "),
        ...(text === "" ? ["(no text)"] : inlineOrBlock(`${id}:text`, text, look, "message"))));
      for (const block of assistant.content) {
        if (block.block.case === "toolCall") {
          items.push(callItem(id, block.block.value.id, block.block.value.name, block.block.value.argumentsJson, look));
        }
      }
      if (assistant.stopReason === StopReason.ERROR) {
        items.push(h("li", { class: "entry error", "data-entry-id": id }, `assistant error: ${assistant.errorMessage ?? ""}`));
      }
      return items;
    }
    case "toolResult": {
      const result = value.value;
      const text = contentText(result.content);
      return [
        h(
          "li",
          {
            class: result.isError ? "entry tool-result error" : "entry tool-result",
            "data-call-id": result.toolCallId,
            "data-entry-id": id,
          },
          h("div", { class: "line" }, beforeLink(entry, look), `${result.isError ? "✗" : "✓"} ${result.toolName}: `),
          textBlock(`${id}:result`, text, look, "result", "output"),
        ),
      ];
    }
    case "custom":
      return [h("li", { class: "entry dim", "data-entry-id": id }, `[${value.value.role}]`)];
    default:
      return [];
  }
}

/** A tool call the assistant asked for: `→ name {arguments}`, the arguments cut to a line, and
 *  (when cut) a button that shows them whole, indented. */
function callItem(entryId: string, callId: string, name: string, argumentsJson: string, look: Look): HTMLElement {
  const key = `${entryId}:args:${callId}`;
  const line = compactJson(argumentsJson);
  const cut = line !== oneLine(argumentsJson);
  const item = h("li", { class: "entry call", "data-call-id": callId }, `→ ${name} ${line}`);
  if (cut || look.expanded.has(key)) {
    const open = look.expanded.has(key);
    item.append(
      button({ class: "expand args", "aria-expanded": String(open) }, open ? " hide arguments" : " all arguments", () => {
        if (open) {
          look.expanded.delete(key);
        } else {
          look.expanded.add(key);
        }
        item.replaceWith(callItem(entryId, callId, name, argumentsJson, look));
      }),
    );
    if (open) {
      item.append(textBlock(`${key}:whole`, prettyJson(argumentsJson), look, "arguments", "json"));
    }
  }
  return item;
}

function entryItems(entry: Entry, look: Look): HTMLElement[] {
  switch (entry.payload.case) {
    case "message":
      return messageItems(entry, entry.payload.value.message, look);
    case "compaction":
      return [h("li", { class: "entry dim", "data-entry-id": entry.id }, `[compaction] ${entry.payload.value.summary.split("\n")[0] ?? ""}`)];
    case "branchSummary":
      return [h("li", { class: "entry dim", "data-entry-id": entry.id }, "[branch summary]")];
    case "custom":
      return [h("li", { class: "entry dim", "data-entry-id": entry.id }, `[${entry.payload.value.customType}]`)];
    default:
      return [];
  }
}

/** The transcript, oldest first. */
export function renderTranscript(snapshot: LaneSnapshot, look: Look): HTMLElement {
  const items = snapshot.transcript.flatMap((entry) => entryItems(entry, look));
  return h("ol", { id: "transcript" }, ...(items.length === 0 ? [h("li", { class: "entry dim empty" }, "no entries yet")] : items));
}

/** "0.0s": the elapsed time of a running row, as the ticker rewrites it. */
export function seconds(value: number): string {
  return `${value.toFixed(1)}s`;
}

function toolRows(operation: SnapshotOperation, clock: ToolClock | undefined, look: Look): HTMLElement {
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
        textBlock(`tool:${settled.toolCallId}:result`, contentText(settled.result?.content ?? []), look, "result", "output"),
      );
    }
    const running = row.state.value;
    const id = running?.toolCallId ?? "";
    const progress = contentText(running?.result?.content ?? []).trimEnd().split("\n").at(-1) ?? "";
    return h(
      "li",
      { class: "tool running", "data-call-id": id, "data-state": "running" },
      // Without a clock (the lane as it was, in the history) no elapsed time: it would be now's.
      h("div", {}, h("span", { class: "spinner", "aria-hidden": "true" }), ` ${running?.toolName ?? "?"} · running${clock === undefined ? "" : " "}`,
        clock === undefined ? null : h("span", { class: "elapsed", "data-call-id": id }, seconds(clock.elapsed(id))),
        ` · ${compactJson(running?.argumentsJson ?? "", 50)}`),
      progress ? h("pre", { class: "progress" }, progress) : null,
    );
  });
  return h("ul", { id: "tools" }, ...rows);
}

/** The open operation with its tools and the Abort button (none without `onAbort`: the
 *  lane as it was), or the last result. */
export function renderOperation(
  snapshot: LaneSnapshot,
  clock: ToolClock | undefined,
  look: Look,
  onAbort?: (operationId: string) => void,
): HTMLElement {
  const operation = snapshot.operation;
  if (operation === undefined) {
    return lastResult(snapshot.lastResult);
  }
  const aborting = operation.status === OperationStatus.ABORTING;
  let abort: HTMLButtonElement | null = null;
  if (onAbort !== undefined) {
    abort = h("button", { id: "abort", type: "button", class: "danger" }, aborting ? "Aborting…" : "Abort");
    abort.disabled = aborting;
    abort.addEventListener("click", () => onAbort(operation.id));
  }
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
    toolRows(operation, clock, look),
  );
}

function lastResult(result: OperationResult | undefined): HTMLElement {
  if (result === undefined) {
    return h("section", { id: "last-result" }, "no operation yet");
  }
  const name = RESULT_NAMES[result.status] ?? "ended";
  return h(
    "section",
    { id: "last-result", "data-status": name, class: badResult(result.status) ? "error" : undefined },
    `last ${KIND_NAMES[result.kind] ?? "operation"}: ${name}`,
    result.error ? ` · ${result.error.code}: ${result.error.message}` : "",
  );
}
