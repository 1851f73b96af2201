/**
 * Typed errors of the lane service.
 *
 * Every refusal of the service carries a gRPC status code and exactly one
 * `google.rpc.ErrorInfo` (domain `lane.v1`) whose `reason` is stable (UPPER_SNAKE_CASE) and
 * whose `metadata` holds the dynamic values of the message (docs/contract.md). connect-es exposes the
 * details of a `ConnectError` through `findDetails()`; this module turns them into a `LaneError`.
 *
 * The reasons are the generated enum `Reason` (protos/lane/v1/reasons.proto), the one list the
 * Python client's typed errors come from too: `reasonOf(error) === Reason.LEASE_HELD` rather
 * than comparing strings. A reason travels as the enum value's name (`"LEASE_HELD"`).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema, RetryInfoSchema, type ErrorInfo } from "./gen/google/rpc/error_details_pb.js";
import { Reason } from "./gen/lane/v1/reasons_pb.js";

export { Reason };

/** The ErrorInfo domain of the lane service. */
export const LANE_ERROR_DOMAIN = "lane.v1";

/** A lane service error: the gRPC code plus the decoded ErrorInfo. */
export class LaneError extends Error {
  override readonly name = "LaneError";
  /** The gRPC status code (`Code.OutOfRange`, …). */
  readonly code: Code;
  /** The ErrorInfo reason (e.g. `REVISION_OUT_OF_RANGE`), or `""` when the error carried none. */
  readonly reason: string;
  /** The ErrorInfo domain (`lane.v1` for the service's own errors), or `""`. */
  readonly domain: string;
  /** The ErrorInfo metadata (lowerCamelCase keys, string values); empty when none. */
  readonly metadata: Readonly<Record<string, string>>;
  /** Milliseconds the service asked the caller to wait before trying again (its
   *  `google.rpc.RetryInfo`), or `undefined` when it did not say. */
  readonly retryAfterMs: number | undefined;
  /** Set when a caller retried the call and gave up: the attempts made and the time spent. */
  gaveUp: { readonly attempts: number; readonly ms: number } | undefined;
  /** The service's own message (`message` may add what to do about it: a LANE_BUSY refusal's
   *  `freeingHint`). */
  readonly serviceMessage: string;

  constructor(
    init: {
      code: Code;
      message: string;
      reason?: string;
      domain?: string;
      metadata?: Readonly<Record<string, string>>;
      serviceMessage?: string;
      retryAfterMs?: number;
    },
    options?: { cause?: unknown },
  ) {
    super(init.message, options);
    this.serviceMessage = init.serviceMessage ?? init.message;
    this.code = init.code;
    this.reason = init.reason ?? "";
    this.domain = init.domain ?? "";
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.retryAfterMs = init.retryAfterMs;
    this.gaveUp = undefined;
  }

  /** This error (code, reason, metadata) with another message; `cause` is this one. */
  withMessage(message: string): LaneError {
    const copy = new LaneError(
      {
        code: this.code,
        message,
        reason: this.reason,
        domain: this.domain,
        metadata: this.metadata,
        serviceMessage: this.serviceMessage,
        ...(this.retryAfterMs === undefined ? {} : { retryAfterMs: this.retryAfterMs }),
      },
      { cause: this },
    );
    copy.gaveUp = this.gaveUp;
    return copy;
  }

  /** `reason` as the contract's enum; `Reason.UNSPECIFIED` when none or not known here. */
  get reasonCode(): Reason {
    return reasonFromName(this.reason);
  }

  /** The code's name as gRPC spells it (`OUT_OF_RANGE`), for logs. */
  get codeName(): string {
    return codeName(this.code);
  }
}

/** The ErrorInfo `reason` string of `reason` (`Reason.LEASE_HELD` → `"LEASE_HELD"`). */
export function reasonName(reason: Reason): string {
  return Reason[reason];
}

/** The `Reason` a reason string names; `Reason.UNSPECIFIED` for `""` or one not known here. */
export function reasonFromName(name: string): Reason {
  const value = (Reason as unknown as Record<string, Reason | undefined>)[name];
  return name !== "" && typeof value === "number" ? value : Reason.UNSPECIFIED;
}

/** The contract's reason of any thrown value (`Reason.UNSPECIFIED` when it names none). */
export function reasonOf(error: unknown): Reason {
  return laneErrorFrom(error).reasonCode;
}

/** The ErrorInfo of `error`, when it carries one (the first, if several). */
export function errorInfoOf(error: ConnectError): ErrorInfo | undefined {
  return error.findDetails(ErrorInfoSchema)[0];
}

/** Milliseconds of the RetryInfo of `error`, when it carries one. */
export function retryAfterMsOf(error: ConnectError): number | undefined {
  const delay = error.findDetails(RetryInfoSchema)[0]?.retryDelay;
  return delay === undefined ? undefined : Number(delay.seconds) * 1000 + delay.nanos / 1e6;
}

/**
 * Decode any thrown value into a `LaneError`. A `LaneError` is returned as is; anything else
 * goes through `ConnectError.from()` (so a non-Connect error becomes `Code.Unknown`, an abort
 * `Code.Canceled`), and its ErrorInfo, if any, fills `reason`, `domain` and `metadata`, its
 * RetryInfo `retryAfterMs`.
 * `message` is the server's message without connect's `[code]` prefix (`serviceMessage`),
 * followed for LANE_BUSY by how to free the lane (`freeingHint`).
 */
export function laneErrorFrom(error: unknown): LaneError {
  if (error instanceof LaneError) {
    return error;
  }
  const connectError = ConnectError.from(error);
  const info = errorInfoOf(connectError);
  const metadata = info?.metadata ?? {};
  const hint = info?.reason === reasonName(Reason.LANE_BUSY) ? freeingHint(metadata) : "";
  const retryAfterMs = retryAfterMsOf(connectError);
  return new LaneError(
    {
      code: connectError.code,
      message: hint ? `${connectError.rawMessage}. ${hint}` : connectError.rawMessage,
      reason: info?.reason ?? "",
      domain: info?.domain ?? "",
      metadata,
      serviceMessage: connectError.rawMessage,
      ...(retryAfterMs === undefined ? {} : { retryAfterMs }),
    },
    { cause: error },
  );
}

/** ` (gave up after 14 attempts in 30.0s)` for a call retried until it gave up, else `""`. */
export function gaveUpNote(gaveUp: LaneError["gaveUp"]): string {
  return gaveUp === undefined ? "" : ` (gave up after ${gaveUp.attempts} attempts in ${(gaveUp.ms / 1000).toFixed(1)}s)`;
}

/** How long the service waits after a lease lapsed before it ends the run itself, when its
 *  operator kept the default (`LANE_ORPHAN_SECONDS`). */
export const DEFAULT_ORPHAN_SECONDS = 600;

/**
 * How to free a lane whose open operation a LANE_BUSY refusal describes (its metadata:
 * `openOperationId`, `leaseHolder`, `leaseExpires`, `leaseLive`, `cancelRequested`): `lane
 * abort`, a takeover once the lease lapsed, the service's orphan timeout. The message of a
 * LANE_BUSY `LaneError` ends with it.
 */
export function freeingHint(metadata: Readonly<Record<string, string>>): string {
  const lane = metadata["laneId"] ?? "";
  const operation = metadata["openOperationId"] ?? "";
  if (!lane || !operation) {
    return "";
  }
  const abort = `\`lane abort ${lane}\` (or AbortOperation of ${operation}; driver.abort() in its driver)`;
  if (metadata["operationKind"] === "run" && !metadata["leaseExpires"]) {
    return `To free the lane: ${abort}, then end the run (EndRun: it is not leased, so any client may)`;
  }
  const takeover = `driver.recover("${operation}") takes the run over`;
  const live = metadata["leaseLive"] !== "false";
  const ends = live
    ? "when its driver winds it down, or at the latest once its lease lapses"
    : "within seconds: its lease lapsed, so the service ends it";
  const when = live
    ? `once its lease lapses (${metadata["leaseExpires"] ?? ""})`
    : "now (its lease lapsed: its driver is gone)";
  if (metadata["cancelRequested"] === "true") {
    return `Its abort was requested: the run ends ${ends}. Or ${takeover} ${when}`;
  }
  return (
    `To free the lane: ${abort}; the run then ends ${ends}. Or ${takeover} ${when}. Left alone, ` +
    `the service ends a run whose lease lapsed LANE_ORPHAN_SECONDS after it (${DEFAULT_ORPHAN_SECONDS} s by default)`
  );
}

/** `Code.OutOfRange` → `"OUT_OF_RANGE"`. */
export function codeName(code: Code): string {
  if (code === Code.Canceled) {
    return "CANCELLED"; // connect spells it the American way, gRPC the British way
  }
  const name = Code[code];
  if (name === undefined) {
    return `CODE_${code}`;
  }
  return name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}
