/**
 * A resumable lane watcher on top of the `WatchLane` server stream.
 *
 * `watchLane(client, laneId, opts)` is an async iterator of `WatchUpdate`s: one after the
 * initial snapshot (assembled from the `SnapshotHead` and its `followingChunks` transcript
 * chunks), one after each event group (folded into the snapshot with the reducer) and, when
 * `heartbeats` is set, one per idle heartbeat.
 *
 * The watcher survives the stream ending under it (docs/contract.md, WatchLane):
 * - UNAVAILABLE (server shutdown, database down), RESOURCE_EXHAUSTED WATCHER_TOO_SLOW, and a
 *   dropped connection: a transport failure (CANCELED, ABORTED, INTERNAL or UNKNOWN without a
 *   lane.v1 ErrorInfo), a stream that ends without an error, or no message within
 *   `idleTimeoutMs` (the server heartbeats at least every 10 s). The watcher resumes after its
 *   last revision (`afterRevision`, no snapshot) after a small exponential backoff with jitter.
 * - OUT_OF_RANGE (the resume point fell below the retention floor), FAILED_PRECONDITION
 *   LANE_INCARNATION_CHANGED (the lane was deleted and created again under its id while the
 *   watcher was away: a resume names the incarnation its revision belongs to,
 *   `LaneSnapshot.incarnation`, and the service refuses it for another) and a rebase signal
 *   from the reducer (`navigation_end`): re-snapshot, that is a fresh watch without
 *   `afterRevision`.
 * - Any other error ends the iteration with a `LaneError`; a stream that breaks the protocol
 *   (an event group before the snapshot, …) with a `WatchProtocolError`.
 *
 * Aborting `signal` ends the iteration quietly (no error), also during a backoff; leaving a
 * `for await` loop early cancels the underlying call. Before the first message, a service that
 * cannot be reached fails the watch within `connectTimeoutMs` (`ServiceUnreachable`).
 */
import { clone } from "@bufbuild/protobuf";
import { Code, type CallOptions, type Client } from "@connectrpc/connect";
import { sleep } from "./commands.js";
import { LANE_ERROR_DOMAIN, LaneError, Reason, laneErrorFrom, reasonName } from "./errors.js";
import type { HarnessEvent } from "./gen/lane/v1/events_pb.js";
import { WatchLaneResponseSchema, type LaneService, type WatchLaneResponse } from "./gen/lane/v1/lane_service_pb.js";
import { LaneSnapshotSchema, type LaneSnapshot } from "./gen/lane/v1/snapshot_pb.js";
import { CONNECT_TIMEOUT_MS, FirstContact, endpointOf } from "./reach.js";
import { PartJoiner, PartsError } from "./message-parts.js";
import { fold } from "./reducer.js";

/** What `watchLane` needs of a client: `createClient(LaneService, transport)` fits. */
export type WatchClient = Pick<Client<typeof LaneService>, "watchLane">;

/** One step of a watch. Treat `snapshot` as read-only: the watcher folds into copies of it. */
export interface WatchUpdate {
  /** `"snapshot"`: a fresh snapshot (at the start, after OUT_OF_RANGE or a rebase);
   *  `"events"`: an event group was folded; `"heartbeat"`: the lane is idle. */
  readonly kind: "snapshot" | "events" | "heartbeat";
  /** The lane as of `snapshot.revision`. */
  readonly snapshot: LaneSnapshot;
  /** The events folded by this update, in order (empty unless `kind` is `"events"`). */
  readonly events: readonly HarnessEvent[];
  /** A folded event was `navigation_end`: `snapshot` is a best effort, a fresh one follows. */
  readonly rebase: boolean;
  /** For heartbeats: no event at or below this revision will follow. */
  readonly headRevision?: bigint;
}

/** Why the watcher opens a new stream. */
export interface RetryInfo {
  /** Consecutive failed attempts so far (1 for the first retry); 0 for a re-snapshot. */
  readonly attempt: number;
  /** How long the watcher waits before the next attempt. */
  readonly delayMs: number;
  /** `"resume"`: after the last revision; `"resnapshot"`: a fresh watch. */
  readonly mode: "resume" | "resnapshot";
  /** The error that ended the stream; undefined when it ended without one or rebased. */
  readonly error: LaneError | undefined;
  /** The revision the next attempt resumes after (undefined for a fresh watch). */
  readonly afterRevision: bigint | undefined;
}

export interface WatchOptions {
  /** Abort to stop watching; the iteration then ends without an error. */
  signal?: AbortSignal;
  /** Also yield an update for each heartbeat (default false). */
  heartbeats?: boolean;
  /** Continue from a snapshot the caller already holds: the first stream resumes after its
   *  revision and no initial snapshot update is yielded. */
  from?: LaneSnapshot;
  /** Resume backoff: the first delay, the cap, and the growth factor (defaults 100 ms, 5 s, 2).
   *  Each delay is jittered between half and all of its value. */
  backoff?: { initialMs?: number; maxMs?: number; multiplier?: number };
  /** Give up (throw the last error) after this many consecutive failed attempts; an attempt
   *  that received any message resets the count. Default: never give up. */
  maxRetries?: number;
  /** Treat the connection as dropped when no message arrives for this long (default 30 s,
   *  three heartbeat intervals); 0 disables. */
  idleTimeoutMs?: number;
  /** Extra request headers (authorization, …). */
  headers?: CallOptions["headers"];
  /** Called before every new stream after the first; for logs and metrics. */
  onRetry?: (info: RetryInfo) => void;
  /** Until the first message arrives, a transport failure (no connection) is tried again only
   *  for this long, then thrown as `ServiceUnreachable` with the cause and the fix (default
   *  5 s; 0: as any other failure). Once the service answered, outages are ridden out. */
  connectTimeoutMs?: number;
  /** The service's address, as `ServiceUnreachable` names it (default: what
   *  `createLaneClient` was given). */
  target?: string;
}

/** The stream broke the WatchLane protocol; the watcher stops rather than guess. */
export class WatchProtocolError extends Error {
  override readonly name = "WatchProtocolError";
}

/** ErrorInfo reason the service sends when it cut off a watcher that stopped reading. */
export const WATCHER_TOO_SLOW = reasonName(Reason.WATCHER_TOO_SLOW);

const DEFAULT_IDLE_TIMEOUT_MS = 30_000;

/** How a stream ended: resume after the last revision, or watch afresh. */
interface Ending {
  readonly mode: "resume" | "resnapshot";
  readonly error: LaneError | undefined;
}

/** Watch a lane: see the module comment. */
export async function* watchLane(
  client: WatchClient,
  laneId: string,
  opts: WatchOptions = {},
): AsyncGenerator<WatchUpdate, void, undefined> {
  const signal = opts.signal;
  const idleTimeoutMs = opts.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
  const maxRetries = opts.maxRetries ?? Number.POSITIVE_INFINITY;
  // The folded state, the revision to resume after and the lane incarnation it belongs to
  // ("" while unknown). `after` can run ahead of `snapshot.revision` when the stream carries
  // lane-less events, which do not move it.
  let state: WatchState | undefined =
    opts.from === undefined
      ? undefined
      : {
          snapshot: clone(LaneSnapshotSchema, opts.from),
          after: opts.from.revision,
          incarnation: opts.from.incarnation,
        };
  let failures = 0;
  const firstContact = new FirstContact(
    opts.target ?? endpointOf(client)?.target ?? "",
    opts.connectTimeoutMs ?? CONNECT_TIMEOUT_MS,
  );

  while (!aborted(signal)) {
    const attempt = new AbortController();
    const forwardAbort = (): void => attempt.abort(signal?.reason);
    signal?.addEventListener("abort", forwardAbort, { once: true });
    const resumeAfter = state?.after;
    const incarnation = state?.incarnation ?? "";
    let idleTimedOut = false;
    let iterator: AsyncIterator<WatchLaneResponse> | undefined;
    let ending: Ending;
    try {
      const callOptions: CallOptions = { signal: attempt.signal };
      if (opts.headers !== undefined) {
        callOptions.headers = opts.headers;
      }
      const stream = client.watchLane(
        resumeAfter === undefined ? { laneId } : { laneId, afterRevision: resumeAfter, incarnation },
        callOptions,
      );
      iterator = stream[Symbol.asyncIterator]();
      // The snapshot being assembled from its head and transcript chunks.
      let assembling: { snapshot: LaneSnapshot; remaining: number } | undefined;
      let ready = resumeAfter !== undefined;
      // A message over the service's message limit comes in parts: only whole ones are read.
      const parts = new PartJoiner(WatchLaneResponseSchema);
      read: for (;;) {
        const next = await nextWithin(iterator, idleTimeoutMs, () => {
          idleTimedOut = true;
          attempt.abort();
        });
        if (next.done === true) {
          ending = { mode: "resume", error: undefined };
          break;
        }
        failures = 0; // any message is progress: the backoff starts over
        firstContact.made();
        let whole: WatchLaneResponse | undefined;
        try {
          const received = next.value;
          whole = parts.take(received, received.item.case === "part" ? received.item.value : undefined);
        } catch (thrown) {
          throw thrown instanceof PartsError ? new WatchProtocolError(thrown.message) : thrown;
        }
        if (whole === undefined) {
          continue; // a part: the message is not whole yet
        }
        const item = whole.item;
        let completed: LaneSnapshot | undefined;
        switch (item.case) {
          case "snapshot": {
            if (ready || assembling !== undefined) {
              throw new WatchProtocolError("WatchLane sent a second snapshot on one stream");
            }
            const head = item.value;
            if (head.snapshot === undefined) {
              throw new WatchProtocolError("WatchLane sent a snapshot head without a snapshot");
            }
            assembling = {
              snapshot: clone(LaneSnapshotSchema, head.snapshot),
              remaining: head.followingChunks,
            };
            if (assembling.remaining <= 0) {
              completed = assembling.snapshot;
            }
            break;
          }
          case "transcriptChunk": {
            if (assembling === undefined) {
              throw new WatchProtocolError("WatchLane sent a transcript chunk outside a snapshot");
            }
            assembling.snapshot.transcript.push(...item.value.entries);
            assembling.remaining -= 1;
            if (assembling.remaining <= 0) {
              completed = assembling.snapshot;
            }
            break;
          }
          case "eventGroup": {
            if (!ready || state === undefined) {
              throw new WatchProtocolError("WatchLane sent events before the snapshot was complete");
            }
            const after: bigint = state.after;
            // Events at or below the resume point were folded already (a duplicate after a
            // resume); lane-less events without a revision always apply.
            const events = item.value.events.filter((e) => e.revision === 0n || e.revision > after);
            if (events.length === 0) {
              break;
            }
            const reduction = fold(state.snapshot, events);
            const last = events.reduce((max, e) => (e.revision > max ? e.revision : max), after);
            state = { snapshot: reduction.snapshot, after: last, incarnation: state.incarnation };
            yield { kind: "events", snapshot: state.snapshot, events, rebase: reduction.rebase };
            if (reduction.rebase) {
              ending = { mode: "resnapshot", error: undefined };
              break read;
            }
            break;
          }
          case "heartbeat": {
            if (ready && state !== undefined) {
              state.incarnation = checkIncarnation(state.incarnation, item.value.incarnation);
            }
            if (ready && state !== undefined && opts.heartbeats === true) {
              yield {
                kind: "heartbeat",
                snapshot: state.snapshot,
                events: [],
                rebase: false,
                headRevision: item.value.headRevision,
              };
            }
            break;
          }
          default:
            break; // an item kind this client does not know
        }
        if (completed !== undefined) {
          assembling = undefined;
          ready = true;
          state = { snapshot: completed, after: completed.revision, incarnation: completed.incarnation };
          yield { kind: "snapshot", snapshot: completed, events: [], rebase: false };
        }
      }
    } catch (thrown) {
      if (aborted(signal)) {
        return;
      }
      if (thrown instanceof WatchProtocolError) {
        throw thrown;
      }
      const error = idleTimedOut
        ? new LaneError({ code: Code.Unavailable, message: `no message for ${idleTimeoutMs} ms` })
        : laneErrorFrom(thrown);
      ending = classify(error, resumeAfter !== undefined);
    } finally {
      attempt.abort(); // cancel the call (no-op when it already ended)
      iterator?.return?.().catch(() => {});
      signal?.removeEventListener("abort", forwardAbort);
    }

    if (ending.mode === "resnapshot") {
      state = undefined;
      opts.onRetry?.({
        attempt: 0,
        delayMs: 0,
        mode: "resnapshot",
        error: ending.error,
        afterRevision: undefined,
      });
      continue;
    }
    firstContact.check(ending.error);
    failures += 1;
    if (failures > maxRetries) {
      throw (
        ending.error ??
        new LaneError({ code: Code.Unavailable, message: "the watch stream ended; out of retries" })
      );
    }
    const delayMs = reconnectDelay(failures, opts.backoff, ending.error);
    opts.onRetry?.({
      attempt: failures,
      delayMs,
      mode: "resume",
      error: ending.error,
      afterRevision: state?.after,
    });
    await sleep(delayMs, signal);
  }
}

/** Where a watch stands between messages and streams. */
interface WatchState {
  snapshot: LaneSnapshot;
  after: bigint;
  incarnation: string;
}

/**
 * The incarnation a watch follows after a heartbeat naming `heartbeat` ("" from a service that
 * names none), when it followed `known` ("" if unknown); a `WatchProtocolError` when they
 * differ: the stream is of another lane than the watcher's snapshot.
 */
export function checkIncarnation(known: string, heartbeat: string): string {
  if (known !== "" && heartbeat !== "" && heartbeat !== known) {
    throw new WatchProtocolError(`heartbeat of incarnation ${heartbeat}; the watch follows ${known}`);
  }
  return known === "" ? heartbeat : known;
}

/** Which way a failed stream continues, or throw when it cannot. */
export function classify(error: LaneError, resuming: boolean): Ending {
  switch (error.code) {
    case Code.Unavailable:
      return { mode: "resume", error };
    case Code.FailedPrecondition:
      if (resuming && error.reasonCode === Reason.LANE_INCARNATION_CHANGED) {
        return { mode: "resnapshot", error }; // the lane was created again: its revisions start over
      }
      throw error;
    case Code.OutOfRange:
      if (!resuming) {
        throw error; // a fresh watch has no revision to be out of range
      }
      return { mode: "resnapshot", error };
    case Code.ResourceExhausted:
      if (error.reason === WATCHER_TOO_SLOW) {
        return { mode: "resume", error };
      }
      throw error;
    case Code.Canceled:
    case Code.Internal:
    case Code.Unknown:
    case Code.Aborted:
      // Without the service's ErrorInfo these come from the transport: connect-node reports
      // a connection torn down under the stream as CANCELED ("http/2 stream closed with error
      // code CANCEL"; our own cancellations never get here), a reset socket as ABORTED, an
      // HTTP/2 stream error or a stream cut before its status as INTERNAL. The service's own
      // errors always carry a lane.v1 ErrorInfo.
      if (error.domain !== LANE_ERROR_DOMAIN) {
        return { mode: "resume", error };
      }
      throw error;
    default:
      throw error;
  }
}

/** How long to wait before reconnecting after `failures` failures: the backoff, or longer when
 *  the service said how long (`error`'s RetryInfo, e.g. a refusal in a reconnect storm). */
export function reconnectDelay(
  failures: number,
  backoff: WatchOptions["backoff"],
  error: LaneError | undefined,
): number {
  const delay = backoffDelay(failures, backoff);
  return error?.retryAfterMs === undefined ? delay : Math.max(delay, error.retryAfterMs);
}

/** Exponential backoff with "equal jitter": between half and all of the capped delay. */
export function backoffDelay(
  failures: number,
  backoff: WatchOptions["backoff"] = {},
  random: () => number = Math.random,
): number {
  const initial = backoff.initialMs ?? 100;
  const max = backoff.maxMs ?? 5_000;
  const multiplier = backoff.multiplier ?? 2;
  const capped = Math.min(max, initial * multiplier ** Math.max(0, failures - 1));
  return capped / 2 + random() * (capped / 2);
}

/** `iterator.next()`, failing after `ms` without a message (0: wait forever). */
export function nextWithin<T>(
  iterator: AsyncIterator<T>,
  ms: number,
  onTimeout: () => void,
): Promise<IteratorResult<T>> {
  const next = iterator.next();
  if (ms <= 0) {
    return next;
  }
  next.catch(() => {}); // when the timer wins, the aborted call's rejection is expected
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      onTimeout();
      reject(new Error(`no message for ${ms} ms`));
    }, ms);
  });
  return Promise.race([next, timeout]).finally(() => clearTimeout(timer));
}

/** A function, so that TypeScript does not narrow `signal.aborted` across awaits. */
export function aborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

