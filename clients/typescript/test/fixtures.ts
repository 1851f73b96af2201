/** Small builders for snapshots, events and watch messages used by the unit tests. */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { EntrySchema, type Entry } from "../src/gen/lane/v1/entries_pb.js";
import { HarnessEventSchema, type HarnessEvent } from "../src/gen/lane/v1/events_pb.js";
import {
  WatchLaneResponseSchema,
  type WatchLaneResponse,
} from "../src/gen/lane/v1/lane_service_pb.js";
import { ToolResultSchema, type ToolResult } from "../src/gen/lane/v1/messages_pb.js";
import {
  LaneSnapshotSchema,
  OperationKind,
  OperationStatus,
  SnapshotToolSchema,
  type LaneSnapshot,
  type SnapshotTool,
} from "../src/gen/lane/v1/snapshot_pb.js";

export const LANE = "lane-1";
export const RUN = "run-1";

type Kind = MessageInitShape<typeof HarnessEventSchema>["kind"];

/** An event of `LANE` at `revision`. */
export function event(revision: number, kind: Kind, laneId: string = LANE): HarnessEvent {
  return create(HarnessEventSchema, { laneId, revision: BigInt(revision), kind });
}

/** A snapshot of `LANE` at `revision` with an open RUN operation holding `tools`. */
export function runningSnapshot(revision: number, tools: SnapshotToolInit[] = []): LaneSnapshot {
  return create(LaneSnapshotSchema, {
    laneId: LANE,
    revision: BigInt(revision),
    tipId: "e-a1",
    operation: {
      id: RUN,
      kind: OperationKind.RUN,
      status: OperationStatus.OPEN,
      fromTipId: "e-u1",
      runningTools: tools,
    },
  });
}

type SnapshotToolInit = MessageInitShape<typeof SnapshotToolSchema>;

export function running(id: string, args = "{}", result?: ToolResult): SnapshotToolInit {
  return { state: { case: "running", value: { toolCallId: id, toolName: "bash", argumentsJson: args, result } } };
}

export function settled(id: string, args = "{}", text = "done"): SnapshotToolInit {
  return {
    state: {
      case: "settled",
      value: { toolCallId: id, toolName: "bash", argumentsJson: args, result: textResult(text) },
    },
  };
}

export function textResult(text: string): ToolResult {
  return create(ToolResultSchema, { content: [{ block: { case: "text", value: { text } } }] });
}

export function toolStart(revision: number, id: string, args = "{}", runId = RUN): HarnessEvent {
  return event(revision, {
    case: "toolStart",
    value: { runId, turnId: "t-1", toolCallId: id, toolName: "bash", argumentsJson: args },
  });
}

export function toolUpdate(revision: number, id: string, text: string, runId = RUN): HarnessEvent {
  return event(revision, {
    case: "toolUpdate",
    value: { runId, turnId: "t-1", toolCallId: id, toolName: "bash", partialResult: textResult(text) },
  });
}

export function toolEnd(revision: number, id: string, text: string, runId = RUN): HarnessEvent {
  return event(revision, {
    case: "toolEnd",
    value: { runId, turnId: "t-1", toolCallId: id, toolName: "bash", result: textResult(text), isError: false },
  });
}

/** A toolResult entry for call `id`, placed at `revision`. */
export function toolResultEntry(revision: number, id: string, text = "done"): Entry {
  return create(EntrySchema, {
    id: `e-r-${id}`,
    parentId: "e-a1",
    seq: BigInt(revision),
    payload: {
      case: "message",
      value: {
        message: {
          message: {
            case: "toolResult",
            value: { toolCallId: id, toolName: "bash", content: [{ block: { case: "text", value: { text } } }] },
          },
        },
      },
    },
  });
}

export function entryAdded(revision: number, entry: Entry): HarnessEvent {
  return event(revision, { case: "entryAdded", value: { entry } });
}

/** The ids and states of the open operation's rows, e.g. `["call-0:running"]`. */
export function rows(snapshot: LaneSnapshot): string[] {
  return (snapshot.operation?.runningTools ?? []).map(
    (row: SnapshotTool) => `${row.state.value?.toolCallId}:${row.state.case}`,
  );
}

// --- WatchLane messages -----------------------------------------------------------------------

export function head(snapshot: LaneSnapshot, followingChunks = 0): WatchLaneResponse {
  return create(WatchLaneResponseSchema, {
    item: { case: "snapshot", value: { snapshot, followingChunks } },
  });
}

export function chunk(entries: Entry[]): WatchLaneResponse {
  return create(WatchLaneResponseSchema, { item: { case: "transcriptChunk", value: { entries } } });
}

export function group(...events: HarnessEvent[]): WatchLaneResponse {
  return create(WatchLaneResponseSchema, { item: { case: "eventGroup", value: { events } } });
}

export function heartbeat(headRevision: number): WatchLaneResponse {
  return create(WatchLaneResponseSchema, {
    item: { case: "heartbeat", value: { headRevision: BigInt(headRevision) } },
  });
}

/** A user-message entry `id` placed at `seq`. */
export function userEntry(id: string, seq: number): Entry {
  return create(EntrySchema, {
    id,
    seq: BigInt(seq),
    payload: {
      case: "message",
      value: {
        message: {
          message: { case: "user", value: { content: [{ block: { case: "text", value: { text: id } } }] } },
        },
      },
    },
  });
}
