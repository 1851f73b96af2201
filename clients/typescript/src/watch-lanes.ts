/**
 * A live lane list on top of the `WatchLanes` server stream: many lanes, one stream.
 *
 * `watchLanes(client, opts)` is an async iterator of `LanesUpdate`s: one once the listing is
 * complete (`kind: "listing"`), then one per message of changes (each lane's latest summary,
 * or its removal: deleted, or out of the requested statuses) and, when `heartbeats` is set,
 * one per idle heartbeat. A slow reader misses nothing that matters: the service sends each
 * lane's latest state, never a backlog.
 *
 * When the stream fails for a reason `watchLane` resumes after (UNAVAILABLE, a dropped
 * connection, WATCHER_TOO_SLOW, no message within `idleTimeoutMs`), the watcher calls
 * WatchLanes again after a backoff and yields the new listing with `relisted: true`: the lanes
 * are replaced, not merged. Any other error ends the iteration with a `LaneError`.
 */
import { Code, type CallOptions, type Client } from "@connectrpc/connect";
import { sleep } from "./commands.js";
import { LaneError, laneErrorFrom } from "./errors.js";
import type {
  LaneRemoval,
  LaneService,
  LaneStatus,
  LaneSummary,
  WatchLanesResponse,
} from "./gen/lane/v1/lane_service_pb.js";
import { WatchProtocolError, aborted, classify, nextWithin, reconnectDelay, type WatchOptions } from "./watch.js";

/** What `watchLanes` needs of a client: `createClient(LaneService, transport)` fits. */
export type WatchLanesClient = Pick<Client<typeof LaneService>, "watchLanes">;

/** One step of a lane list. */
export interface LanesUpdate {
  /** `"listing"`: a complete listing (at the start, and after a reconnect); `"changes"`:
   *  lanes changed or were removed; `"heartbeat"`: nothing changed. */
  readonly kind: "listing" | "changes" | "heartbeat";
  /** Every matching lane's latest summary, by lane id. The watcher updates this map in place
   *  on the next step: copy it to keep a step's state. */
  readonly lanes: ReadonlyMap<string, LaneSummary>;
  /** The summaries this step brought (the whole listing for `"listing"`). */
  readonly changed: readonly LaneSummary[];
  /** The lanes this step removed. */
  readonly removed: readonly LaneRemoval[];
  /** A listing after a reconnect: lanes the map held before and no longer holds are gone. */
  readonly relisted: boolean;
}

export interface WatchLanesOptions
  extends Pick<WatchOptions, "signal" | "heartbeats" | "backoff" | "maxRetries" | "idleTimeoutMs" | "headers"> {
  /** Only lanes whose id starts with this. */
  prefix?: string;
  /** Only these lanes (at most 1,000). */
  laneIds?: readonly string[];
  /** Only lanes in these statuses (empty: all). */
  statuses?: readonly LaneStatus[];
  /** Called before every new stream after the first. */
  onRetry?: (info: { attempt: number; delayMs: number; error: LaneError | undefined }) => void;
}

const DEFAULT_IDLE_TIMEOUT_MS = 30_000;

/** Follow a lane list: see the module comment. */
export async function* watchLanes(
  client: WatchLanesClient,
  opts: WatchLanesOptions = {},
): AsyncGenerator<LanesUpdate, void, undefined> {
  const signal = opts.signal;
  const idleTimeoutMs = opts.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
  const maxRetries = opts.maxRetries ?? Number.POSITIVE_INFINITY;
  const request = {
    laneIdPrefix: opts.prefix ?? "",
    laneIds: [...(opts.laneIds ?? [])],
    statuses: [...(opts.statuses ?? [])],
  };
  const lanes = new Map<string, LaneSummary>();
  let listedBefore = false;
  let failures = 0;
  while (!aborted(signal)) {
    const attempt = new AbortController();
    const forwardAbort = (): void => attempt.abort(signal?.reason);
    signal?.addEventListener("abort", forwardAbort, { once: true });
    let idleTimedOut = false;
    let iterator: AsyncIterator<WatchLanesResponse> | undefined;
    let error: LaneError | undefined;
    try {
      const callOptions: CallOptions = { signal: attempt.signal };
      if (opts.headers !== undefined) {
        callOptions.headers = opts.headers;
      }
      iterator = client.watchLanes(request, callOptions)[Symbol.asyncIterator]();
      let listing: Map<string, LaneSummary> | undefined = new Map();
      for (;;) {
        const next = await nextWithin(iterator, idleTimeoutMs, () => {
          idleTimedOut = true;
          attempt.abort();
        });
        if (next.done === true) {
          break;
        }
        failures = 0; // any message is progress: the backoff starts over
        const message = next.value;
        if (message.heartbeat) {
          if (listing !== undefined) {
            throw new WatchProtocolError("WatchLanes sent a heartbeat before its listing was complete");
          }
          if (opts.heartbeats === true) {
            yield { kind: "heartbeat", lanes, changed: [], removed: [], relisted: false };
          }
          continue;
        }
        if (listing !== undefined) {
          if (message.removed.length > 0) {
            throw new WatchProtocolError("WatchLanes sent a removal inside its listing");
          }
          for (const line of message.lanes) {
            listing.set(line.laneId, line);
          }
          if (message.listingComplete) {
            lanes.clear();
            for (const [laneId, line] of listing) {
              lanes.set(laneId, line);
            }
            const changed = [...listing.values()];
            listing = undefined;
            yield { kind: "listing", lanes, changed, removed: [], relisted: listedBefore };
            listedBefore = true;
          }
          continue;
        }
        for (const line of message.lanes) {
          lanes.set(line.laneId, line);
        }
        for (const removal of message.removed) {
          lanes.delete(removal.laneId);
        }
        yield { kind: "changes", lanes, changed: message.lanes, removed: message.removed, relisted: false };
      }
    } catch (thrown) {
      if (aborted(signal)) {
        return;
      }
      if (thrown instanceof WatchProtocolError) {
        throw thrown;
      }
      error = idleTimedOut
        ? new LaneError({ code: Code.Unavailable, message: `no message for ${idleTimeoutMs} ms` })
        : laneErrorFrom(thrown);
      classify(error, false); // throws what a watch does not recover from
    } finally {
      attempt.abort(); // cancel the call (no-op when it already ended)
      iterator?.return?.().catch(() => {});
      signal?.removeEventListener("abort", forwardAbort);
    }
    failures += 1;
    if (failures > maxRetries) {
      throw error ?? new LaneError({ code: Code.Unavailable, message: "the lane list stream ended; out of retries" });
    }
    const delayMs = reconnectDelay(failures, opts.backoff, error);
    opts.onRetry?.({ attempt: failures, delayMs, error });
    await sleep(delayMs, signal);
  }
}
