/**
 * Print a lane's live state: the transcript, the open operation, and its running and settled
 * tool calls, redrawn after every update of `watchLane` (which resumes on its own when the
 * service restarts).
 *
 *   npx tsx examples/watch.ts LANE_ID [host:port]      (default 127.0.0.1:50051)
 *
 * Ctrl-C stops it.
 */
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import {
  LaneError,
  OperationKind,
  OperationStatus,
  createLaneClient,
  watchLane,
  type ContentBlock,
  type Entry,
  type LaneSnapshot,
  type SnapshotTool,
  type ToolResult,
  type WatchUpdate,
} from "../src/index.js";

const TRANSCRIPT_LINES = 20;

function text(blocks: readonly ContentBlock[]): string {
  return blocks
    .map((block) => {
      switch (block.block.case) {
        case "text":
          return block.block.value.text;
        case "thinking":
          return `(thinking: ${block.block.value.thinking})`;
        case "image":
          return `[image ${block.block.value.mimeType}]`;
        case "toolCall":
          return `→ ${block.block.value.name}(${block.block.value.argumentsJson})`;
        default:
          return "";
      }
    })
    .filter((part) => part !== "")
    .join(" ");
}

function oneLine(value: string, width = 100): string {
  const flat = value.replace(/\s+/g, " ").trim();
  return flat.length > width ? `${flat.slice(0, width - 1)}…` : flat;
}

function entryLine(entry: Entry): string {
  const payload = entry.payload;
  switch (payload.case) {
    case "message": {
      const message = payload.value.message?.message;
      switch (message?.case) {
        case "user":
          return `user       ${text(message.value.content)}`;
        case "assistant":
          return `assistant  ${text(message.value.content)}`;
        case "toolResult": {
          const mark = message.value.isError ? "✖" : "✔";
          return `tool ${mark}     ${message.value.toolName}: ${text(message.value.content)}`;
        }
        case "custom":
          return `custom     ${message.value.role} ${message.value.dataJson ?? ""}`;
        default:
          return "message    (unknown)";
      }
    }
    case "compaction":
      return `compaction ${payload.value.summary}`;
    case "branchSummary":
      return `branch     ${payload.value.summary}`;
    case "custom":
      return `entry      ${payload.value.customType} ${payload.value.dataJson ?? ""}`;
    default:
      return "(unknown entry)";
  }
}

function resultText(result: ToolResult | undefined): string {
  return result === undefined ? "" : text(result.content);
}

function toolLine(row: SnapshotTool): string {
  switch (row.state.case) {
    case "running": {
      const tool = row.state.value;
      const progress = resultText(tool.result);
      return `  ⏳ running  ${tool.toolName}(${tool.argumentsJson})${progress ? `  … ${progress}` : ""}`;
    }
    case "settled": {
      const tool = row.state.value;
      const mark = tool.isError ? "✖ failed " : "✔ settled";
      return `  ${mark}  ${tool.toolName}(${tool.argumentsJson})  → ${resultText(tool.result)}`;
    }
    default:
      return "  (unknown tool row)";
  }
}

function time(value: Timestamp | undefined): string {
  return value === undefined ? "" : timestampDate(value).toISOString();
}

function render(update: WatchUpdate, address: string): string {
  const snapshot: LaneSnapshot = update.snapshot;
  const lines: string[] = [];
  lines.push(
    `lane ${snapshot.laneId} @ revision ${snapshot.revision}  (${address}, ${update.kind}` +
      `${update.rebase ? ", rebasing" : ""})${snapshot.faulted ? "  FAULTED" : ""}`,
  );
  const model = snapshot.configuration?.model;
  if (model !== undefined) {
    lines.push(`model ${model.provider}/${model.modelId}`);
  }
  lines.push("", `transcript (${snapshot.transcript.length} entries, tip ${snapshot.tipId || "-"})`);
  const hidden = snapshot.transcript.length - TRANSCRIPT_LINES;
  if (hidden > 0) {
    lines.push(`  … ${hidden} earlier`);
  }
  for (const entry of snapshot.transcript.slice(-TRANSCRIPT_LINES)) {
    lines.push(`  ${oneLine(entryLine(entry))}`);
  }
  lines.push("");
  const op = snapshot.operation;
  if (op === undefined) {
    const last = snapshot.lastResult;
    lines.push(
      last === undefined
        ? "no open operation"
        : `no open operation; last: ${OperationKind[last.kind]} ${last.operationId} ended at ${time(last.endedTime)}`,
    );
  } else {
    lines.push(
      `operation ${OperationKind[op.kind]} ${op.id}  ${OperationStatus[op.status]}  since ${time(op.startedTime)}`,
    );
    if (op.streamingMessage !== undefined) {
      lines.push(`  streaming: ${oneLine(text(op.streamingMessage.content))}`);
    }
    if (op.retry !== undefined) {
      lines.push(`  retry ${op.retry.attempt}/${op.retry.maxAttempts} at ${time(op.retry.nextAttemptTime)}`);
    }
    if (op.deferred !== undefined) {
      lines.push("  suspended on a deferred response");
    }
    const runningCount = op.runningTools.filter((row) => row.state.case === "running").length;
    const settledCount = op.runningTools.length - runningCount;
    lines.push(`  tools: ${runningCount} running, ${settledCount} settled`);
    for (const row of op.runningTools) {
      lines.push(oneLine(toolLine(row), 120));
    }
  }
  if (snapshot.queues.length > 0) {
    lines.push("", `inbox: ${snapshot.queues.length} queued`);
  }
  return lines.join("\n");
}

async function main(): Promise<number> {
  const [laneId, address = "127.0.0.1:50051"] = process.argv.slice(2);
  if (laneId === undefined || laneId === "") {
    console.error("usage: npx tsx examples/watch.ts LANE_ID [host:port]");
    return 2;
  }
  const controller = new AbortController();
  process.once("SIGINT", () => controller.abort());
  // A service with auth on needs a bearer token: LANE_TOKEN, as for the Python `lane` CLI.
  const client = createLaneClient(address, { token: process.env.LANE_TOKEN || undefined });
  const redraw = process.stdout.isTTY;
  try {
    for await (const update of watchLane(client, laneId, {
      signal: controller.signal,
      onRetry: (info) => {
        const what =
          info.mode === "resnapshot"
            ? "re-snapshotting"
            : info.afterRevision === undefined
              ? `retrying in ${Math.round(info.delayMs)} ms`
              : `resuming after revision ${info.afterRevision} in ${Math.round(info.delayMs)} ms`;
        const why = info.error ? ` (${info.error.codeName}: ${info.error.message})` : "";
        console.error(`… ${what}${why}`);
      },
    })) {
      const frame = render(update, address);
      process.stdout.write(redraw ? `\x1b[2J\x1b[H${frame}\n` : `${frame}\n${"-".repeat(60)}\n`);
    }
    return 0;
  } catch (error) {
    if (error instanceof LaneError) {
      const info = error.reason ? ` ${error.reason} ${JSON.stringify(error.metadata)}` : "";
      console.error(`watch failed: ${error.codeName}${info}: ${error.message}`);
    } else {
      console.error("watch failed:", error);
    }
    return 1;
  }
}

process.exitCode = await main();
