/**
 * `LaneSession`: the lane service's commands over one DriveLane stream (Node, gRPC), the port
 * of the Python client's `lane.client.session.LaneSession`.
 *
 * ```ts
 * const session = new LaneSession(createLaneClient("127.0.0.1:50051"));
 * const started = await session.call("startRun", { laneId: "lane-1", prompt: [...] });
 * const turn = await session.call("startTurn", { laneId: "lane-1", operationId: started.operationId });
 * await session.close();
 * ```
 *
 * `call(method, request)` takes any unary LaneService method and its request and returns that
 * RPC's response, or throws the `LaneError` the unary call would have thrown (the service
 * serves each command of the stream with the unary handler itself, and an answer's
 * `google.rpc.Status` is decoded as connect decodes a unary call's). A message on the open
 * stream costs the service less than a unary call, and commands are pipelined: many may be in
 * flight at once. The service applies one lane's commands in the order they were sent and runs
 * different lanes' concurrently; the session writes commands in the order `call` was invoked.
 *
 * The in-flight bound: at most `maxInFlight` commands (default and ceiling: the service's 64,
 * docs/contract.md) are written and unanswered at once. Later calls wait in the session's queue,
 * unwritten, until an answer frees a slot; so the service never has to stop reading the
 * stream, and a caller that awaits its calls is held back by their answers.
 *
 * Retries are those of `withRetries` (`commands.ts`): a request with a `requestId` field gets a
 * fresh request id when it has none; an answer UNAVAILABLE, DEADLINE_EXCEEDED (no answer within
 * `attemptTimeoutMs`) or `DATABASE_BUSY` sends the command again with the same request id.
 * When the stream itself breaks (the connection drops, the server restarts or shuts down, or
 * cuts the stream off, SESSION_TOO_SLOW, because its answers went unread for its write
 * deadline), the session opens a new one, after a backoff, and writes every unanswered command on it again,
 * in the order they were first submitted: commands with a request id (a retry returns the
 * first answer: nothing is lost or done twice) and reads (GetLaneSnapshot, ListLanes,
 * GetOperation). A command without a request id (RenewLease, ReleaseLease) that was written
 * on the broken stream may or may not have been applied, so it is not sent blindly again: it
 * fails UNAVAILABLE (`SessionBroken`). A stream refused as a whole (UNAUTHENTICATED) fails
 * every command waiting on it with that error.
 *
 * Batches: the stream's writer takes what is queued each time the transport asks for the next
 * message. One command waiting goes at once in a message of its own (no window, no timer); several
 * — commands submitted in the same synchronous run of code (a `Promise.all` of calls), or while
 * the previous message was being written — go as one message carrying them in its `batch` (at
 * most the service's batch bound, 64, and 4 MiB). The service serves each command of a batch as
 * if it came alone: its own answer or refusal, in order with the other commands of its lane.
 * Batches are sent only once the stream's service said it takes them (its `lane-drive-batch`
 * header, sent when it admits the stream); to an older service every command goes alone.
 * Answers come one per message or several in one; each reaches its caller by its sequence.
 * `messagesSent` and `commandsSent` count what the session wrote.
 *
 * An answer over the 4 MiB message limit comes in parts (lane.v1.MessagePart); the session joins
 * them and hands the caller the whole answer. A request too large for a DriveLane message, and a
 * command an older service answered RESOURCE_EXHAUSTED `ANSWER_TOO_LARGE`, go through the unary
 * RPC instead, the latter with its request id, so the recorded answer comes back. So do the
 * commands of a stream the server refuses RESOURCE_EXHAUSTED `TOO_MANY_SESSIONS` (nothing on it
 * ran): the session sends its commands unary for the next two seconds (the refusal's retry
 * delay), then opens a stream again.
 */
import { create, toBinary, type DescMessage, type DescMethodUnary, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type CallOptions } from "@connectrpc/connect";
import { isRetryable, newRequestId, sleep, withRetries, type RetryOptions } from "./commands.js";
import { LaneError, Reason, laneErrorFrom } from "./errors.js";
import type { Status } from "./gen/google/rpc/status_pb.js";
import {
  DriveLaneRequestSchema,
  DriveLaneResponseSchema,
  LaneService,
  type DriveLaneRequest,
  type DriveLaneResponse,
} from "./gen/lane/v1/lane_service_pb.js";
import { PartJoiner } from "./message-parts.js";
import type { LaneServiceClient, RequestOf, ResponseOf, UnaryMethod } from "./lane-client.js";

/** The service's bound on a stream's commands in flight (read, not yet answered). */
export const MAX_COMMANDS_IN_FLIGHT = 64;
/** The most commands one message carries in its batch, whatever a service's header says. */
export const MAX_DRIVE_BATCH = 64;
/** The header a service that takes batches sends when it admits a DriveLane stream. */
export const DRIVE_BATCH_HEADER = "lane-drive-batch";
/** gRPC's message limit, the service's too. */
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
/** How long commands go unary after a `TOO_MANY_SESSIONS` refusal that names no retry delay. */
const UNARY_AFTER_REFUSAL_MS = 2_000;
/** What a DriveLaneRequest adds around a command: the sequence and the command's field header
 *  (and, in a batch, the batch entry's header). */
const FRAME_BYTES = 32;
/** Reads: sent again on a new stream although they carry no request id. */
const READS: ReadonlySet<string> = new Set(["getLaneSnapshot", "listLanes", "getOperation"]);
/** Stream-level codes that mean the stream broke, not that its commands were refused. */
const BROKEN: ReadonlySet<Code> = new Set([
  Code.Unavailable,
  Code.Canceled,
  Code.DeadlineExceeded,
  Code.Internal,
  Code.Unknown,
]);

/** Unary method name → its field of DriveLaneRequest's `command` oneof, from the descriptors. */
const COMMAND_CASES: ReadonlyMap<string, string> = (() => {
  const byInput = new Map<string, string>();
  for (const method of LaneService.methods) {
    if (method.methodKind === "unary") {
      byInput.set(method.input.typeName, method.localName);
    }
  }
  const cases = new Map<string, string>();
  for (const field of DriveLaneRequestSchema.oneofs.find((oneof) => oneof.name === "command")?.fields ?? []) {
    const method = field.message === undefined ? undefined : byInput.get(field.message.typeName);
    if (method !== undefined) {
      cases.set(method, field.localName);
    }
  }
  return cases;
})();

/**
 * UNAVAILABLE: the stream broke after a command without a request id was written and before it
 * was answered (it may or may not have been applied), so it was not sent again.
 */
export class SessionBroken extends LaneError {}

/** Options of `new LaneSession(…)`. */
export interface LaneSessionOptions {
  /** How commands are retried and how long a broken stream is reopened for (`commands.ts`). */
  retry?: RetryOptions;
  /** Extra headers sent with every stream opened. */
  headers?: CallOptions["headers"];
  /** Commands written and unanswered at most (1–64, default 64, the service's bound). */
  maxInFlight?: number;
  /** Give requests without a request id a fresh one (default true); without one a command is
   *  not sent again on a new stream. */
  requestIds?: boolean;
}

/** Per-call options of `LaneSession.call`. */
export interface SessionCallOptions {
  /** Replaces the session's retry options for this call. */
  retry?: RetryOptions;
  /** Stops waiting for the answer (CANCELLED) and the retries. */
  signal?: AbortSignal;
}

/** One command waiting for its answer. */
interface Pending {
  readonly method: UnaryMethod;
  readonly command: string;
  readonly request: Record<string, unknown>;
  /** The request's encoded size. */
  readonly bytes: number;
  /** Written again on a new stream when the stream breaks. */
  readonly resend: boolean;
  /** When a broken stream stops being reopened for it (ms since the epoch). */
  readonly deadline: number;
  /** The stream it was last written on (0: none yet). */
  generation: number;
  settled: boolean;
  resolve(answer: unknown): void;
  reject(error: unknown): void;
}

/** The commands most recently handed to the transport (a message's worth). */
interface Queued {
  readonly message: DriveLaneRequest;
  readonly bytes: number;
}

/** The most commands one message may carry per a service's `lane-drive-batch` header value: 1
 *  without one (a service that takes no batches). */
function batchBound(value: string | null): number {
  const bound = Number(value);
  return value !== null && Number.isInteger(bound) && bound > 1 ? Math.min(bound, MAX_DRIVE_BATCH) : 1;
}

/**
 * The requests of one stream: an async iterable the transport pulls from as it writes. Each pull
 * takes every command queued since the last (up to `batch` and 4 MiB): alone, a message of its
 * own; several, one message holding them in its `batch`.
 */
class Outbox implements AsyncIterable<DriveLaneRequest> {
  private readonly items: Queued[] = [];
  private ended = false;
  private wake: (() => void) | undefined;
  /** Commands one message may carry (1 until the service's header says more). */
  batch = 1;

  constructor(private readonly written: (commands: number) => void) {}

  push(item: Queued): void {
    this.items.push(item);
    this.notify();
  }

  /** Half-close: the stream's request side ends once everything pushed is written. */
  end(): void {
    this.ended = true;
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** The next message: the first queued command and those after it that fit beside it. */
  private take(): DriveLaneRequest {
    const taken: DriveLaneRequest[] = [];
    let bytes = 0;
    while (this.items.length > 0 && taken.length < this.batch) {
      const item = this.items[0]!;
      bytes += item.bytes + FRAME_BYTES;
      if (taken.length > 0 && bytes > MAX_MESSAGE_BYTES) {
        break;
      }
      this.items.shift();
      taken.push(item.message);
    }
    this.written(taken.length);
    return taken.length === 1 ? taken[0]! : create(DriveLaneRequestSchema, { batch: taken });
  }

  async *[Symbol.asyncIterator](): AsyncIterator<DriveLaneRequest> {
    for (;;) {
      if (this.items.length > 0) {
        yield this.take();
      } else if (this.ended) {
        return;
      } else {
        await new Promise<void>((resolve) => (this.wake = resolve));
      }
    }
  }
}

/** The stream now open. */
interface Stream {
  readonly generation: number;
  readonly outbox: Outbox;
  readonly stop: AbortController;
  reading: Promise<void>;
}

/** The error of an answer's `google.rpc.Status`, decoded as connect decodes a unary call's
 *  status trailer, then as the unary path maps it. */
function statusError(status: Status): LaneError {
  const error = new ConnectError(status.message, status.code as Code);
  error.details = status.details.map((any) => ({
    type: any.typeUrl.substring(any.typeUrl.lastIndexOf("/") + 1),
    value: any.value,
  }));
  return laneErrorFrom(error);
}

/** Commands over one DriveLane stream of `service` (see the module comment). */
export class LaneSession {
  /** The raw client the stream (and the unary fallbacks) go through. */
  readonly service: LaneServiceClient;
  readonly retry: RetryOptions;
  readonly maxInFlight: number;
  readonly requestIds: boolean;
  /** Streams opened so far (the first, then one per break). */
  streamsOpened = 0;
  /** Messages written (one per command, or one per batch), and the commands in them. */
  messagesSent = 0;
  commandsSent = 0;
  private readonly headers: CallOptions["headers"];
  /** Unanswered commands, in the order they were first submitted. */
  private readonly pending = new Set<Pending>();
  /** Commands to write on the current stream, in order. */
  private queue: Pending[] = [];
  /** Commands written on the current stream and not yet answered, by sequence. */
  private readonly sent = new Map<number, Pending>();
  private sequence = 0;
  private generation = 0;
  private stream: Stream | undefined;
  private reopening: ReturnType<typeof setTimeout> | undefined;
  private failures = 0;
  private closed = false;
  /** Until then (`Date.now()`), commands go unary: the server refused a stream. */
  private unaryUntil = 0;

  constructor(service: LaneServiceClient, options: LaneSessionOptions = {}) {
    const maxInFlight = options.maxInFlight ?? MAX_COMMANDS_IN_FLIGHT;
    if (!(Number.isInteger(maxInFlight) && maxInFlight >= 1 && maxInFlight <= MAX_COMMANDS_IN_FLIGHT)) {
      throw new RangeError(`maxInFlight must be an integer from 1 to ${MAX_COMMANDS_IN_FLIGHT}`);
    }
    this.service = service;
    this.retry = options.retry ?? {};
    this.headers = options.headers;
    this.maxInFlight = maxInFlight;
    this.requestIds = options.requestIds ?? true;
  }

  /** Commands written on the stream and not yet answered (at most `maxInFlight`). */
  get inFlight(): number {
    return this.sent.size;
  }

  /** Commands waiting for a slot (or for a new stream), not yet written. */
  get queued(): number {
    return this.queue.filter((pending) => !pending.settled).length;
  }

  // -- commands ------------------------------------------------------------------------------

  /**
   * Send the request of unary method `method` on the stream and return the RPC's response;
   * throw its `LaneError`. Request ids, retries, resending and the bound: the module comment.
   */
  async call<K extends UnaryMethod>(
    method: K,
    init: RequestOf<K>,
    options: SessionCallOptions = {},
  ): Promise<ResponseOf<K>> {
    if (this.closed) {
      throw new Error("the session is closed");
    }
    const command = COMMAND_CASES.get(method);
    if (command === undefined) {
      throw new TypeError(`${method} is not a DriveLane command`);
    }
    const desc = LaneService.method[method] as DescMethodUnary;
    const request = create(desc.input, init as MessageInitShape<DescMessage>) as Record<string, unknown>;
    let hasId = desc.input.fields.some((field) => field.localName === "requestId");
    if (hasId && !request["requestId"]) {
      if (this.requestIds) {
        request["requestId"] = newRequestId();
      } else {
        hasId = false;
      }
    }
    const retry = options.retry ?? this.retry;
    const signal = options.signal;
    const bytes = toBinary(desc.input, request as never).length;
    if (bytes > MAX_MESSAGE_BYTES - FRAME_BYTES || Date.now() < this.unaryUntil) {
      return this.unary(method, request, retry, signal);
    }
    const resend = hasId || READS.has(method);
    const deadline = Date.now() + (retry.timeoutMs ?? 30_000);
    const attempt = async (timeoutMs: number | undefined): Promise<ResponseOf<K>> => {
      try {
        return (await this.submit(method, command, request, bytes, resend, deadline, timeoutMs, signal)) as ResponseOf<K>;
      } catch (thrown) {
        const refusal = laneErrorFrom(thrown);
        const reason = refusal.reasonCode;
        if (reason === Reason.TOO_MANY_SESSIONS) {
          // The stream was refused before anything on it was read: unary for as long as the
          // service asked (its RetryInfo), else the usual pause.
          const pauseMs = refusal.retryAfterMs ?? UNARY_AFTER_REFUSAL_MS;
          this.unaryUntil = Math.max(this.unaryUntil, Date.now() + pauseMs);
        }
        if (reason === Reason.ANSWER_TOO_LARGE || reason === Reason.TOO_MANY_SESSIONS) {
          // It ran, or never will here: the unary RPC with the same request id answers it.
          return this.unary(method, request, retry, signal);
        }
        throw thrown;
      }
    };
    // Not a SessionBroken: it was written once and has no request id to be retried with.
    return withRetries(attempt, retry, signal, (error) => !(error instanceof SessionBroken) && isRetryable(error));
  }

  private unary<K extends UnaryMethod>(
    method: K,
    request: Record<string, unknown>,
    retry: RetryOptions,
    signal: AbortSignal | undefined,
  ): Promise<ResponseOf<K>> {
    const send = this.service[method] as unknown as (request: unknown, options: CallOptions) => Promise<ResponseOf<K>>;
    return withRetries(
      (timeoutMs) => send.call(this.service, request, { timeoutMs, signal, headers: this.headers }),
      retry,
      signal,
    );
  }

  /** Queue one attempt of a command and wait for its answer (at most `timeoutMs`). */
  private submit(
    method: UnaryMethod,
    command: string,
    request: Record<string, unknown>,
    bytes: number,
    resend: boolean,
    deadline: number,
    timeoutMs: number | undefined,
    signal: AbortSignal | undefined,
  ): Promise<unknown> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(new ConnectError("the call was aborted", Code.Canceled));
        return;
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      const finish = (): void => {
        pending.settled = true;
        this.pending.delete(pending);
        clearTimeout(timer);
        signal?.removeEventListener("abort", aborted);
      };
      const pending: Pending = {
        method,
        command,
        request,
        bytes,
        resend,
        deadline,
        generation: 0,
        settled: false,
        resolve: (answer) => {
          finish();
          resolve(answer);
        },
        reject: (error) => {
          finish();
          reject(error);
        },
      };
      const aborted = (): void => pending.reject(new ConnectError("the call was aborted", Code.Canceled));
      signal?.addEventListener("abort", aborted, { once: true });
      if (timeoutMs !== undefined) {
        // Its slot stays taken until the service answers (the service still counts it).
        timer = setTimeout(
          () =>
            pending.reject(
              new LaneError({ code: Code.DeadlineExceeded, message: `no answer to ${method} within ${timeoutMs} ms` }),
            ),
          timeoutMs,
        );
      }
      this.pending.add(pending);
      this.queue.push(pending);
      if (this.stream === undefined && this.reopening === undefined) {
        this.open();
      } else {
        this.pump();
      }
    });
  }

  // -- the stream ----------------------------------------------------------------------------

  /** Open a stream and queue every unanswered command on it, in the order first submitted. */
  private open(): void {
    const generation = ++this.generation;
    const stream: Stream = {
      generation,
      outbox: new Outbox((commands) => {
        this.messagesSent += 1;
        this.commandsSent += commands;
      }),
      stop: new AbortController(),
      reading: Promise.resolve(),
    };
    this.stream = stream;
    this.sent.clear();
    this.queue = [...this.pending];
    this.streamsOpened += 1;
    const answers = this.service.driveLane(stream.outbox, {
      signal: stream.stop.signal,
      headers: this.headers,
      onHeader: (headers) => {
        stream.outbox.batch = batchBound(headers.get(DRIVE_BATCH_HEADER));
      },
    });
    stream.reading = this.read(answers, generation);
    this.pump();
  }

  /** Write queued commands while slots are free. */
  private pump(): void {
    const stream = this.stream;
    if (stream === undefined) {
      return;
    }
    while (this.sent.size < this.maxInFlight && this.queue.length > 0) {
      const pending = this.queue.shift()!;
      if (pending.settled) {
        continue; // answered, timed out or given up meanwhile
      }
      const sequence = ++this.sequence;
      pending.generation = stream.generation;
      this.sent.set(sequence, pending);
      stream.outbox.push({
        message: create(DriveLaneRequestSchema, {
          sequence: BigInt(sequence),
          command: { case: pending.command, value: pending.request } as never,
        }),
        bytes: pending.bytes,
      });
    }
  }

  private async read(answers: AsyncIterable<DriveLaneResponse>, generation: number): Promise<void> {
    try {
      // An answer over the message limit comes in parts: only whole ones are read.
      const parts = new PartJoiner(DriveLaneResponseSchema);
      for await (const received of answers) {
        this.failures = 0;
        const message = parts.take(received, received.part);
        if (message === undefined) {
          continue;
        }
        if (message.batch.length > 0) {
          for (const answer of message.batch) {
            this.deliver(answer);
          }
        } else {
          this.deliver(message);
        }
        this.pump();
      }
    } catch (thrown) {
      this.broken(generation, laneErrorFrom(thrown));
      return;
    }
    this.broken(generation, new LaneError({ code: Code.Unavailable, message: "the stream ended with commands unanswered" }));
  }

  /** Hand `answer` to the command waiting for its sequence (none: given up on meanwhile). */
  private deliver(answer: DriveLaneResponse): void {
    const sequence = Number(answer.sequence);
    const pending = this.sent.get(sequence);
    this.sent.delete(sequence);
    if (pending === undefined || pending.settled) {
      return;
    }
    const result = answer.answer;
    if (result.case === "error") {
      pending.reject(statusError(result.value));
    } else if (result.case !== undefined) {
      pending.resolve(result.value);
    } else {
      pending.reject(new LaneError({ code: Code.Unknown, message: "an answer with nothing in it" }));
    }
  }

  /** The stream of `generation` ended with `error`: fail or keep each unanswered command, and
   *  open a new stream (after a backoff) for those kept. */
  private broken(generation: number, error: LaneError): void {
    if (this.stream?.generation !== generation) {
      return;
    }
    this.drop();
    this.failures += 1;
    // An INTERNAL or UNKNOWN with the service's reason is a refusal; without one, a transport's.
    // SESSION_TOO_SLOW: the service cut the stream off (answers unread for its write deadline).
    const broken =
      (BROKEN.has(error.code) && ((error.code !== Code.Internal && error.code !== Code.Unknown) || !error.reason)) ||
      error.reasonCode === Reason.SESSION_TOO_SLOW;
    const now = Date.now();
    for (const pending of [...this.pending]) {
      if (!broken || now >= pending.deadline) {
        pending.reject(error);
      } else if (!pending.resend && pending.generation === generation) {
        pending.reject(
          new SessionBroken({
            code: Code.Unavailable,
            message:
              `the stream broke before ${pending.method} was answered (${error.message}); it has no` +
              " request id, so it was not sent again",
          }),
        );
      }
    }
    if (broken && !this.closed && this.pending.size > 0) {
      const capped = Math.min(this.retry.maxMs ?? 2_000, (this.retry.initialMs ?? 100) * 2 ** (this.failures - 1));
      this.reopening = setTimeout(() => this.reopen(error), capped / 2 + Math.random() * (capped / 2));
    }
  }

  private reopen(error: LaneError): void {
    this.reopening = undefined;
    const now = Date.now();
    for (const pending of [...this.pending]) {
      if (now >= pending.deadline) {
        pending.reject(error);
      }
    }
    if (!this.closed && this.pending.size > 0) {
      this.open();
    }
  }

  /** Forget the current stream: cancel it; its answers no longer count. */
  private drop(): void {
    const stream = this.stream;
    this.stream = undefined;
    this.sent.clear();
    if (stream !== undefined) {
      stream.outbox.end();
      stream.stop.abort();
    }
  }

  // -- closing -------------------------------------------------------------------------------

  /**
   * Half-close the stream (the service ends it once it answered everything it read), then
   * stop. Commands still unanswered fail with CANCELLED.
   */
  async close(): Promise<void> {
    if (this.closed) {
      return;
    }
    this.closed = true;
    clearTimeout(this.reopening);
    this.reopening = undefined;
    const stream = this.stream;
    if (stream !== undefined && this.pending.size === 0) {
      // Nothing unanswered: end the stream politely (the service sees its end, not a cancel).
      stream.outbox.end();
      const waited = new AbortController(); // so the timer does not keep the process alive
      await Promise.race([stream.reading, sleep(1_000, waited.signal)]);
      waited.abort();
    }
    this.drop();
    await stream?.reading;
    for (const pending of [...this.pending]) {
      pending.reject(new LaneError({ code: Code.Canceled, message: "the session was closed" }));
    }
  }
}
