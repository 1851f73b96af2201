/**
 * When each presentation-active tool started, for the elapsed time of running rows (as the
 * terminal view's ToolClock): a `tool_start` event gives its commit time; a row first seen in a
 * snapshot (the page joined while it ran) counts from when it was first seen.
 */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { HarnessEvent, LaneSnapshot, SnapshotTool } from "@lane/client";

export class ToolClock {
  private readonly started = new Map<string, number>();

  /** Note tool starts in `events`; forget rows no longer in `snapshot`. */
  observe(snapshot: LaneSnapshot, events: readonly HarnessEvent[], now = Date.now()): void {
    for (const event of events) {
      if (event.kind.case === "toolStart") {
        const at = event.commitTime === undefined ? now : timestampMs(event.commitTime);
        this.started.set(event.kind.value.toolCallId, Math.min(at, now));
      }
    }
    const active = new Set((snapshot.operation?.runningTools ?? []).map(rowId));
    for (const id of active) {
      if (!this.started.has(id)) {
        this.started.set(id, now);
      }
    }
    for (const id of [...this.started.keys()]) {
      if (!active.has(id)) {
        this.started.delete(id);
      }
    }
  }

  /** Seconds since `toolCallId` started (0 when unknown). */
  elapsed(toolCallId: string, now = Date.now()): number {
    return Math.max(0, (now - (this.started.get(toolCallId) ?? now)) / 1000);
  }
}

/** The call id of a running or settled row. */
export function rowId(row: SnapshotTool): string {
  return row.state.value?.toolCallId ?? "";
}
