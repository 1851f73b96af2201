/**
 * Sending one command safely: a request id kept across retries, and retries of the failures
 * that leave nothing written (docs/contract.md, Requests and errors).
 *
 * A mutating request (one with a `requestId` field) gets a fresh request id when it has none;
 * every retry reuses it, so a command whose answer was lost commits once and the retry returns
 * the first answer. Retried: UNAVAILABLE and DEADLINE_EXCEEDED (a restarting or overloaded
 * server) and RESOURCE_EXHAUSTED `DATABASE_BUSY`. Every other failure is thrown at once as a
 * `LaneError`; so is the last one once the retries give up, saying how many attempts they made
 * (`error.gaveUp`). The same rules as the Python client's `lane.client.commands`.
 */
import { Code } from "@connectrpc/connect";
import { LaneError, Reason, gaveUpNote, laneErrorFrom } from "./errors.js";

/** How a command is retried. */
export interface RetryOptions {
  /** Give up once this long has passed since the first attempt (default 30 s). */
  timeoutMs?: number;
  /** The first backoff and its cap (defaults 100 ms and 2 s); each is jittered. */
  initialMs?: number;
  maxMs?: number;
  /** Each attempt may take this long (default 30 s; 0: no bound). */
  attemptTimeoutMs?: number;
}

/** A fresh request id. */
export function newRequestId(): string {
  return crypto.randomUUID().replaceAll("-", "");
}

/** Whether a command refused with `error` may be sent again with the same request id. */
export function isRetryable(error: LaneError): boolean {
  if (error.code === Code.Unavailable || error.code === Code.DeadlineExceeded) {
    return true;
  }
  return error.code === Code.ResourceExhausted && error.reasonCode === Reason.DATABASE_BUSY;
}

/**
 * Run `attempt` (one RPC, given the per-attempt timeout) until it answers, retrying as
 * `options` say; the last failure is thrown as a `LaneError`. `signal` stops the waiting.
 * `retryable` decides which failures are tried again (default `isRetryable`).
 */
export async function withRetries<T>(
  attempt: (timeoutMs: number | undefined) => Promise<T>,
  options: RetryOptions = {},
  signal?: AbortSignal,
  retryable: (error: LaneError) => boolean = isRetryable,
): Promise<T> {
  const started = Date.now();
  const deadline = started + (options.timeoutMs ?? 30_000);
  const initial = options.initialMs ?? 100;
  const max = options.maxMs ?? 2_000;
  const perAttempt = options.attemptTimeoutMs ?? 30_000;
  for (let failures = 1; ; failures++) {
    try {
      return await attempt(perAttempt > 0 ? perAttempt : undefined);
    } catch (thrown) {
      const error = laneErrorFrom(thrown);
      const capped = Math.min(max, initial * 2 ** (failures - 1));
      const delay = capped / 2 + Math.random() * (capped / 2);
      if (!retryable(error) || signal?.aborted) {
        throw error;
      }
      if (Date.now() + delay > deadline) {
        throw givingUp(error, failures, started);
      }
      await sleep(delay, signal);
    }
  }
}

/**
 * `error`, the last of `attempts` made since `started` (`Date.now()`), marked as the one a
 * retry gave up on when there was more than one attempt: its message then says so
 * (`… (gave up after 14 attempts in 30.0s)`).
 */
export function givingUp(error: LaneError, attempts: number, started: number): LaneError {
  if (attempts <= 1) {
    return error;
  }
  const gaveUp = { attempts, ms: Date.now() - started };
  const marked = error.withMessage(`${error.message}${gaveUpNote(gaveUp)}`);
  marked.gaveUp = gaveUp;
  return marked;
}

/** Wait `ms`, or less when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
