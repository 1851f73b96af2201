/**
 * Fold lane events into a lane snapshot: the client-side mirror of snapshot capture.
 *
 * A port of the Python reducer (clients/python/lane/client/reducer.py), whose module docstring
 * states the rules; both run the language-neutral vectors in tests/conformance. A watcher
 * receives one `LaneSnapshot` at revision R and then every `HarnessEvent` committed after it;
 * folding those events gives exactly what a fresh snapshot at the last folded revision shows
 * (docs/contract.md, invariant 2 "fold equals capture").
 *
 * The fold is immutable: `apply` and `fold` clone the snapshot once (`clone()` from
 * @bufbuild/protobuf), change the clone and return it. Every message taken from an event is
 * cloned too, so the returned snapshot shares nothing with the inputs, and the inputs are never
 * changed. `rebase` is true when a folded event was `navigation_end`: the lane's history moved
 * under the client, which must fetch a fresh snapshot (re-watch). The fold keeps going after a
 * rebase signal; what it returns is then only a best effort until the client re-snapshotted.
 *
 * Envelope: an event with a non-empty `laneId` other than the snapshot's is ignored entirely
 * and never moves the revision (`usage` included: the service keeps usage totals per lane). An
 * event of the snapshot's lane sets `revision` whatever its kind, including kinds this client
 * does not know. A lane-less event (empty `laneId`) applies without touching the revision.
 */
import { clone, create } from "@bufbuild/protobuf";
import { TimestampSchema, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { HarnessEvent } from "./gen/lane/v1/events_pb.js";
import {
  AssistantMessageSchema,
  StopReason,
  ToolResultSchema,
  UsageSchema,
} from "./gen/lane/v1/messages_pb.js";
import { EntrySchema } from "./gen/lane/v1/entries_pb.js";
import {
  DeferredStateSchema,
  LaneConfigurationSchema,
  LaneSnapshotSchema,
  LaneStatsSchema,
  ModelRefSchema,
  OperationErrorSchema,
  OperationKind,
  OperationResultSchema,
  OperationResultStatus,
  OperationStatus,
  QueuedItemSchema,
  RetryStateSchema,
  SettledToolSchema,
  SnapshotOperationSchema,
  SnapshotToolSchema,
  type LaneSnapshot,
  type LaneStats,
  type SnapshotOperation,
  type SnapshotTool,
} from "./gen/lane/v1/snapshot_pb.js";

/** The result of folding: a new snapshot, and whether the client must re-snapshot. */
export interface Reduction {
  readonly snapshot: LaneSnapshot;
  readonly rebase: boolean;
}

/** A `HarnessEvent.kind` case name, e.g. `"tool_start"` is `"toolStart"` here. */
export type EventKind = NonNullable<HarnessEvent["kind"]["case"]>;

/** Fold one event into a copy of `snapshot`; the inputs are left unchanged. */
export function apply(snapshot: LaneSnapshot, event: HarnessEvent): Reduction {
  const result = clone(LaneSnapshotSchema, snapshot);
  const rebase = applyInPlace(result, event);
  return { snapshot: result, rebase };
}

/**
 * Fold `events` in order into a copy of `snapshot` (one copy for the whole sequence).
 * `rebase` is true if any folded event signalled a rebase. The inputs are left unchanged.
 */
export function fold(snapshot: LaneSnapshot, events: Iterable<HarnessEvent>): Reduction {
  const result = clone(LaneSnapshotSchema, snapshot);
  let rebase = false;
  for (const event of events) {
    rebase = applyInPlace(result, event) || rebase;
  }
  return { snapshot: result, rebase };
}

/** Whether `event` tells a client folding it to fetch a fresh snapshot. */
export function isRebase(event: HarnessEvent): boolean {
  return event.kind.case === "navigationEnd";
}

/** Fold `event` into `snap` (which the caller owns); return the rebase signal. */
function applyInPlace(snap: LaneSnapshot, event: HarnessEvent): boolean {
  const kind = event.kind;
  if (event.laneId !== "" && event.laneId !== snap.laneId) {
    return false; // another lane's event, usage included: the service's totals are per lane
  }
  if (event.laneId !== "") {
    snap.revision = event.revision;
  }
  if (kind.case === undefined) {
    // A kind this client does not know: only the envelope applies.
    return false;
  }
  dispatch(snap, kind, event);
  return kind.case === "navigationEnd";
}

type KindCase = Exclude<HarnessEvent["kind"], { case: undefined }>;
type Body<K extends EventKind> = Extract<KindCase, { case: K }>["value"];
type Handler<K extends EventKind> = (snap: LaneSnapshot, body: Body<K>, event: HarnessEvent) => void;
type Handlers = { readonly [K in EventKind]: Handler<K> };

function dispatch(snap: LaneSnapshot, kind: KindCase, event: HarnessEvent): void {
  // TypeScript cannot correlate the case with its handler's parameter type; the mapped type
  // `Handlers` guarantees that HANDLERS[k] takes the body of case k.
  const handler = HANDLERS[kind.case] as Handler<EventKind>;
  handler(snap, kind.value as never, event);
}

// --- helpers ----------------------------------------------------------------------------------

function matching(snap: LaneSnapshot, operationId: string): SnapshotOperation | undefined {
  const op = snap.operation;
  return op !== undefined && op.id === operationId ? op : undefined;
}

function rowId(row: SnapshotTool): string | undefined {
  return row.state.case === undefined ? undefined : row.state.value.toolCallId;
}

function toolIndex(op: SnapshotOperation, toolCallId: string): number | undefined {
  const index = op.runningTools.findIndex((row) => rowId(row) === toolCallId);
  return index < 0 ? undefined : index;
}

function copyTime(time: Timestamp | undefined): Timestamp | undefined {
  return time === undefined ? undefined : clone(TimestampSchema, time);
}

function stats(snap: LaneSnapshot): LaneStats {
  snap.stats ??= create(LaneStatsSchema);
  return snap.stats;
}

function openOperation(
  snap: LaneSnapshot,
  operationId: string,
  kind: OperationKind,
  startedTime: Timestamp | undefined,
): void {
  snap.operation = create(SnapshotOperationSchema, {
    id: operationId,
    kind,
    fromTipId: snap.tipId,
    status: OperationStatus.OPEN,
    startedTime: copyTime(startedTime),
  });
}

// --- the handlers, one per event kind ---------------------------------------------------------

const noChange = (): void => {};

const HANDLERS: Handlers = {
  // operations
  runStart(snap, body) {
    openOperation(snap, body.runId, OperationKind.RUN, body.startedTime);
  },
  compactionStart(snap, body) {
    if (snap.operation !== undefined) {
      return; // an in-run compaction bracket changes nothing
    }
    openOperation(snap, body.runId, OperationKind.COMPACTION, body.startedTime);
  },
  navigationStart(snap, body) {
    openOperation(snap, body.runId, OperationKind.NAVIGATION, body.startedTime);
  },
  operationAbort(snap, body) {
    const op = matching(snap, body.operationId);
    if (op !== undefined) {
      op.status = OperationStatus.ABORTING;
    }
  },
  runResume(snap, body) {
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.deferred = undefined;
    }
  },
  runSuspend(snap, body) {
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.streamingMessage = undefined;
      // Present, possibly empty, even when the event left it unset.
      op.deferred =
        body.deferred === undefined
          ? create(DeferredStateSchema)
          : clone(DeferredStateSchema, body.deferred);
    }
  },
  runEnd(snap, body) {
    const op = matching(snap, body.runId);
    if (op === undefined || op.kind !== OperationKind.RUN) {
      return;
    }
    snap.lastResult = create(OperationResultSchema, {
      operationId: body.runId,
      kind: OperationKind.RUN,
      status: body.status,
      error:
        body.status === OperationResultStatus.FAILED && body.error !== undefined
          ? clone(OperationErrorSchema, body.error)
          : undefined,
      fromTipId: body.fromTipId,
      tipId: body.tipId,
      startedTime: copyTime(op.startedTime),
      endedTime: copyTime(body.endedTime),
    });
    snap.operation = undefined;
    snap.tipId = body.tipId;
  },
  compactionEnd(snap, body) {
    const op = matching(snap, body.runId);
    if (op === undefined || op.kind !== OperationKind.COMPACTION) {
      return; // an in-run compaction_end matches a RUN operation: ignored
    }
    snap.lastResult = create(OperationResultSchema, {
      operationId: body.runId,
      kind: OperationKind.COMPACTION,
      status: body.status,
      error:
        body.status === OperationResultStatus.FAILED && body.error !== undefined
          ? clone(OperationErrorSchema, body.error)
          : undefined,
      fromTipId: op.fromTipId,
      tipId: snap.tipId,
      startedTime: copyTime(op.startedTime),
      endedTime: copyTime(body.endedTime),
    });
    snap.operation = undefined;
  },
  navigationEnd: noChange, // the rebase signal is returned by applyInPlace

  // retries, streaming
  retryScheduled(snap, body) {
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.retry = create(RetryStateSchema, {
        attempt: body.attempt,
        maxAttempts: body.maxAttempts,
        nextAttemptTime: copyTime(body.notBeforeTime),
        errorMessage: body.errorMessage,
      });
    }
  },
  retryStart(snap, body) {
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.retry = undefined;
    }
  },
  retryEnd(snap, body) {
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.retry = undefined;
    }
  },
  messageStart(snap, body) {
    const message = body.message?.message;
    if (body.runId === undefined || message?.case !== "assistant") {
      return;
    }
    if (message.value.stopReason !== StopReason.PENDING) {
      return;
    }
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.streamingMessage = clone(AssistantMessageSchema, message.value);
    }
  },
  messageUpdate(snap, body) {
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.streamingMessage =
        body.message === undefined
          ? create(AssistantMessageSchema)
          : clone(AssistantMessageSchema, body.message);
    }
  },
  messageEnd(snap, body) {
    if (body.runId === undefined) {
      return;
    }
    const op = matching(snap, body.runId);
    if (op !== undefined) {
      op.streamingMessage = undefined;
    }
  },

  // tools
  toolStart(snap, body) {
    const op = matching(snap, body.runId);
    if (op === undefined) {
      return;
    }
    // A fresh running row: an existing row is replaced wholesale in its position (dropping
    // any stale result), otherwise the row is appended.
    const row = create(SnapshotToolSchema, {
      state: {
        case: "running",
        value: {
          toolCallId: body.toolCallId,
          toolName: body.toolName,
          argumentsJson: body.argumentsJson,
        },
      },
    });
    const index = toolIndex(op, body.toolCallId);
    if (index === undefined) {
      op.runningTools.push(row);
    } else {
      op.runningTools[index] = row;
    }
  },
  toolUpdate(snap, body) {
    const op = matching(snap, body.runId);
    if (op === undefined) {
      return;
    }
    const index = toolIndex(op, body.toolCallId);
    if (index === undefined) {
      return;
    }
    const state = op.runningTools[index]!.state;
    if (state.case !== "running") {
      return; // a settled row never goes back to running progress
    }
    state.value.result =
      body.partialResult === undefined ? undefined : clone(ToolResultSchema, body.partialResult);
  },
  toolEnd(snap, body) {
    const op = matching(snap, body.runId);
    if (op === undefined) {
      return;
    }
    const index = toolIndex(op, body.toolCallId);
    if (index === undefined) {
      return; // tool_end never creates a row
    }
    const row = op.runningTools[index]!;
    const argumentsJson = row.state.case === undefined ? "" : row.state.value.argumentsJson;
    row.state = {
      case: "settled",
      value: create(SettledToolSchema, {
        toolCallId: body.toolCallId,
        toolName: body.toolName,
        argumentsJson,
        // A settled row always has a result.
        result:
          body.result === undefined ? create(ToolResultSchema) : clone(ToolResultSchema, body.result),
        isError: body.isError,
      }),
    };
  },

  // transcript, queues, stats, configuration
  entryAdded(snap, body) {
    const entry = body.entry;
    if (entry === undefined) {
      return;
    }
    const payload = entry.payload;
    const message = payload.case === "message" ? payload.value.message?.message : undefined;
    if (message?.case === "toolResult" && snap.operation !== undefined) {
      const index = toolIndex(snap.operation, message.value.toolCallId);
      if (index !== undefined) {
        snap.operation.runningTools.splice(index, 1); // only this call's row
      }
    }
    if (payload.case === "compaction") {
      snap.transcript = [];
    }
    snap.transcript.push(clone(EntrySchema, entry));
    snap.tipId = entry.id;
    if (payload.case === "message") {
      const s = stats(snap);
      s.messageCount += 1n;
    }
  },
  queueUpdate(snap, body) {
    snap.queues = body.queues.map((item) => clone(QueuedItemSchema, item));
  },
  usage(snap, body) {
    stats(snap).usage =
      body.totals === undefined ? create(UsageSchema) : clone(UsageSchema, body.totals);
  },
  configUpdate(snap, body, event) {
    if (event.laneId === "") {
      return; // global settings: nothing of a lane snapshot
    }
    if (body.model === undefined && body.thinkingLevel === undefined && body.activeTools === undefined) {
      return;
    }
    // Any present change makes the configuration present (as the Python reducer does).
    snap.configuration ??= create(LaneConfigurationSchema);
    const config = snap.configuration;
    if (body.model !== undefined) {
      config.model =
        body.model.value === undefined ? undefined : clone(ModelRefSchema, body.model.value);
    }
    if (body.thinkingLevel !== undefined) {
      config.thinkingLevel = body.thinkingLevel.value;
    }
    if (body.activeTools !== undefined) {
      config.activeToolNames = [...body.activeTools.value];
    }
  },
  fault(snap) {
    snap.faulted = true;
  },

  // no snapshot change; turn_end in particular never removes tool rows
  handlerError: noChange,
  turnStart: noChange,
  turnEnd: noChange,
  valueUpdate: noChange,
  laneCreated: noChange,
};

/** Every event kind of the `HarnessEvent.kind` oneof this reducer knows. */
export const EVENT_KINDS: ReadonlySet<EventKind> = new Set(Object.keys(HANDLERS) as EventKind[]);
