/**
 * A lane's event log in the browser, and the lane as it was at any revision of it.
 *
 * `LaneLog` holds the log's whole groups (one per commit), read a page at a time with
 * ReadLaneEvents and extended by the live watch's groups. `stateAt(log, current, revision)`
 * folds the log with the client's reducer — the one the conformance vectors hold to "fold
 * equals capture" — from the lane as created (`origin`) up to the revision. Two things the
 * reducer leaves to a fresh snapshot are done here from the log, as the service's capture does
 * them:
 *
 * - the configuration the lane was created with, which no event carries whole: the current
 *   one, with each field the log changed set back to what its first `config_update` replaced;
 * - a navigation (`navigation_end`, a rebase for a watcher): the tip moves to the navigation's
 *   target, the transcript becomes the chain of entries from it back to the newest compaction
 *   (every entry the log added is at hand), and the navigation's result is the last result.
 *
 * A lane whose log was trimmed by retention (its floor above 0) starts from a state the log
 * does not describe: its states cannot be shown, only its events (`origin` is undefined).
 */
import { clone, create } from "@bufbuild/protobuf";
import {
  EntrySchema,
  LaneConfigurationSchema,
  LaneSnapshotSchema,
  LaneStatsSchema,
  ModelRefSchema,
  OperationKind,
  OperationResultSchema,
  UsageSchema,
  fold,
  laneErrorFrom,
  type Entry,
  type HarnessEvent,
  type LaneServiceClient,
  type LaneSnapshot,
} from "@lane/client";

/** One commit's events, as the log holds them. */
export interface LogGroup {
  readonly first: bigint;
  readonly last: bigint;
  readonly events: readonly HarnessEvent[];
}

/** Events per ReadLaneEvents page. */
const PAGE_EVENTS = 1000;

/** A lane's event log, whole groups in revision order from its retention floor. */
export class LaneLog {
  readonly groups: LogGroup[] = [];
  floor = 0n;
  incarnation = "";

  /** The revision of the newest event held (the floor when none is). */
  get last(): bigint {
    return this.groups.at(-1)?.last ?? this.floor;
  }

  /** Add the group `events` if it is the next one: true when added or already held, false on
   *  a gap (the caller reads the missing groups). */
  add(events: readonly HarnessEvent[]): boolean {
    const first = events[0]?.revision;
    const last = events.at(-1)?.revision;
    if (first === undefined || last === undefined || last <= this.last) {
      return true;
    }
    if (first !== this.last + 1n) {
      return false;
    }
    this.groups.push({ first, last, events });
    return true;
  }

  /** Read the log after what is held until `until` (the live revision) is reached. */
  async readUpTo(client: LaneServiceClient, laneId: string, until: bigint, signal?: AbortSignal): Promise<void> {
    while (this.last < until) {
      const page = await client.readLaneEvents(
        { laneId, afterRevision: this.last, incarnation: this.incarnation, pageSize: PAGE_EVENTS },
        { signal },
      );
      if (this.groups.length === 0) {
        this.floor = page.retentionFloor;
      }
      this.incarnation = page.incarnation;
      if (page.groups.length === 0) {
        return; // the head is behind `until`: the live watch brings the rest
      }
      for (const group of page.groups) {
        this.add(group.events);
      }
    }
  }

  /** The index of the newest group committed by `revision` (the first group when none is): a
   *  revision inside a commit shows the lane before that commit, never half of one. */
  groupAt(revision: bigint): number {
    let low = 0;
    let high = this.groups.length - 1;
    while (low < high) {
      const mid = Math.ceil((low + high) / 2);
      if (this.groups[mid]!.last <= revision) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    return low;
  }

  /** The log of the lane's `incarnation` up to `until`, from its start, or from its retention
   *  floor when retention trimmed it. */
  static async read(
    client: LaneServiceClient,
    laneId: string,
    incarnation: string,
    until: bigint,
    signal?: AbortSignal,
  ): Promise<LaneLog> {
    const log = new LaneLog();
    log.incarnation = incarnation;
    try {
      await log.readUpTo(client, laneId, until, signal);
    } catch (thrown) {
      // A trimmed log: start again at its floor, which the refusal names.
      const floor = floorOf(thrown);
      if (floor === undefined) {
        throw thrown;
      }
      log.floor = floor;
      await log.readUpTo(client, laneId, until, signal);
    }
    return log;
  }
}

/** The retention floor a REVISION_OUT_OF_RANGE refusal names. */
function floorOf(thrown: unknown): bigint | undefined {
  const error = laneErrorFrom(thrown);
  const floor = error.metadata.floor;
  return error.reason === "REVISION_OUT_OF_RANGE" && floor !== undefined && /^\d+$/.test(floor)
    ? BigInt(floor)
    : undefined;
}

/** The lane as created (revision 0), from its current snapshot and its whole log; undefined
 *  when the log does not reach back to the lane's creation. */
export function origin(current: LaneSnapshot, log: LaneLog): LaneSnapshot | undefined {
  if (log.floor !== 0n) {
    return undefined;
  }
  const configuration =
    current.configuration === undefined
      ? create(LaneConfigurationSchema)
      : clone(LaneConfigurationSchema, current.configuration);
  let model = false;
  let level = false;
  let tools = false;
  for (const group of log.groups) {
    for (const event of group.events) {
      if (event.kind.case !== "configUpdate" || event.laneId === "") {
        continue;
      }
      const change = event.kind.value;
      if (!model && change.model !== undefined) {
        model = true;
        const previous = change.model.previous;
        // An empty model is no model: the service writes "none" as an empty one.
        configuration.model =
          previous === undefined || (previous.provider === "" && previous.modelId === "")
            ? undefined
            : clone(ModelRefSchema, previous);
      }
      if (!level && change.thinkingLevel !== undefined) {
        level = true;
        configuration.thinkingLevel = change.thinkingLevel.previous;
      }
      if (!tools && change.activeTools !== undefined) {
        tools = true;
        configuration.activeToolNames = [...change.activeTools.previous];
      }
    }
  }
  return create(LaneSnapshotSchema, {
    laneId: current.laneId,
    revision: 0n,
    configuration,
    stats: create(LaneStatsSchema, { usage: create(UsageSchema) }),
    incarnation: current.incarnation,
  });
}

/** The lane as it was at `revision` (a group's end), folded from `start` (its `origin`). */
export function stateAt(log: LaneLog, start: LaneSnapshot, revision: bigint): LaneSnapshot {
  const entries = new Map<string, Entry>();
  let snapshot = start;
  for (const group of log.groups) {
    if (group.first > revision) {
      break;
    }
    const events = group.events.filter((event) => event.revision <= revision);
    const folded = fold(snapshot, events);
    snapshot = folded.snapshot;
    for (const event of events) {
      if (event.kind.case === "entryAdded" && event.kind.value.entry !== undefined) {
        entries.set(event.kind.value.entry.id, event.kind.value.entry);
      }
    }
    if (folded.rebase) {
      navigated(snapshot, events, entries);
    }
  }
  return snapshot;
}

/** What a fresh snapshot shows after the navigation among `events` (see the module comment). */
function navigated(snapshot: LaneSnapshot, events: readonly HarnessEvent[], entries: ReadonlyMap<string, Entry>): void {
  let startedTime = snapshot.operation?.startedTime;
  for (const event of events) {
    if (event.kind.case === "navigationStart") {
      startedTime = event.kind.value.startedTime;
    }
    if (event.kind.case !== "navigationEnd") {
      continue;
    }
    const end = event.kind.value;
    snapshot.lastResult = create(OperationResultSchema, {
      operationId: end.runId,
      kind: OperationKind.NAVIGATION,
      status: end.status,
      error: end.error,
      fromTipId: end.fromTipId,
      tipId: end.tipId,
      startedTime,
      endedTime: end.endedTime,
    });
    snapshot.operation = undefined;
    snapshot.tipId = end.tipId;
    snapshot.transcript = chain(end.tipId, entries);
  }
}

/** The entries from `tip` back to the newest compaction on its chain, oldest first. */
export function chain(tip: string, entries: ReadonlyMap<string, Entry>): Entry[] {
  const found: Entry[] = [];
  let id = tip;
  while (id !== "") {
    const entry = entries.get(id);
    if (entry === undefined) {
      break;
    }
    found.push(clone(EntrySchema, entry));
    if (entry.payload.case === "compaction") {
      break;
    }
    id = entry.parentId;
  }
  return found.reverse();
}
