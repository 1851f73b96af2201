/**
 * Whether the lane service can be reached, and what to tell a person when it cannot: the
 * TypeScript twin of the Python client's `lane.client.reach`.
 *
 * A call to a service that is not there fails with the transport's words (`connect
 * ECONNREFUSED 127.0.0.1:1`, `getaddrinfo ENOTFOUND …`, `wrong version number`, …).
 * `diagnose` turns them into a cause (`connection refused`) and a fix; `ServiceUnreachable` is
 * the typed error naming the target, the cause and the fix:
 *
 *     cannot reach the lane service at 127.0.0.1:1: connection refused. Is the service running
 *     (lane serve)? Check the address given to createLaneClient or connectLane.
 *
 * `reach(client, …)` is the first contact of a `LaneClient` (and so of a `Driver`): one
 * `ListLanes` of a single lane, bounded by the connect timeout (5 s by default). It needs the
 * token too, so a refused token fails here, saying how to pass one. `FirstContact` does the same for a watch: until the stream's first
 * message, a transport failure is retried only within the connect timeout.
 */
import { Code, type CallOptions } from "@connectrpc/connect";
import { LANE_ERROR_DOMAIN, LaneError, gaveUpNote, laneErrorFrom } from "./errors.js";
import type { LaneServiceClient } from "./lane-client.js";

/** How long the first call waits for the service, by default (as the `lane` command's). */
export const CONNECT_TIMEOUT_MS = 5_000;

/** What a client was made for: its address, and whether it sends a token. */
export interface Endpoint {
  readonly target: string;
  readonly token: boolean;
}

const endpoints = new WeakMap<object, Endpoint>();

/** Remember where `client` goes (the `createLaneClient` functions do), for messages. */
export function nameEndpoint<T extends object>(client: T, endpoint: Endpoint): T {
  endpoints.set(client, endpoint);
  return client;
}

/** Where `client` goes, when one of the `createLaneClient` functions made it. */
export function endpointOf(client: object): Endpoint | undefined {
  return endpoints.get(client);
}

/** The lane service at `target` could not be reached: `cause` says why, `fix` what to do. */
export class ServiceUnreachable extends LaneError {
  /** The address tried. */
  readonly target: string;
  /** What went wrong (`connection refused`, `unknown host`, …). */
  readonly problem: string;
  /** What to do about it. */
  readonly fix: string;

  constructor(target: string, problem: string, fix: string, options: { code?: Code; cause?: unknown } = {}) {
    const where = target ? ` at ${target}` : "";
    super(
      {
        code: options.code ?? Code.Unavailable,
        message: `cannot reach the lane service${where}: ${problem}.${fix ? ` ${fix}` : ""}`,
      },
      { cause: options.cause },
    );
    this.target = target;
    this.problem = problem;
    this.fix = fix;
  }
}

/** Pieces of Node's and connect's transport messages, the cause they mean, and the fix. */
const CAUSES: readonly (readonly [RegExp, string, string])[] = [
  [/ECONNREFUSED|connection refused/i, "connection refused",
    "Is the service running (lane serve)? Check the address given to createLaneClient or connectLane."],
  [/ENOTFOUND|EAI_AGAIN|getaddrinfo/i, "unknown host", "Check the host name in the address."],
  [/wrong version number|WRONG_VERSION_NUMBER|packet length too long/i,
    "TLS handshake failed: the service does not speak TLS",
    "Use a plaintext address (host:port or http://…), or enable TLS on the service."],
  [/self.signed|unable to verify|UNABLE_TO_GET_ISSUER|certificate has expired|CERT_/i,
    "TLS handshake failed: the service's certificate is not trusted",
    "Trust the CA that signed it: createLaneClient(address, { nodeOptions: { ca } })."],
  [/certificate required|alert handshake failure|tlsv13 alert/i,
    "TLS handshake failed: the service requires a client certificate",
    "Pass one: createLaneClient(address, { nodeOptions: { cert, key } })."],
  [/EHOSTUNREACH|ENETUNREACH|ETIMEDOUT/i, "host unreachable",
    "Is the host reachable and the port right? Check the address, and firewalls."],
];

const CLOSED_PLAINTEXT: readonly [string, string] = [
  "the connection was closed during set-up",
  "The service may require TLS: use an https:// address (and createLaneClient's nodeOptions: { ca }).",
];

/** Whether `error` is the transport's (no connection, no answer, a failed TLS handshake, a
 *  connection closed under the call), not the service's answer: no lane.v1 ErrorInfo. */
export function isTransportFailure(error: LaneError): boolean {
  if (error.domain === LANE_ERROR_DOMAIN || error.reason !== "") {
    return false;
  }
  return [Code.Unavailable, Code.DeadlineExceeded, Code.Internal, Code.Canceled, Code.Unknown, Code.Aborted]
    .includes(error.code);
}

/** The cause of a transport failure and its fix. */
export function diagnose(error: LaneError, tls: boolean): { cause: string; fix: string } {
  const text = `${error.message} ${describeCauses(error)}`;
  if (error.code === Code.DeadlineExceeded) {
    return { cause: "no answer", fix: "Is the host reachable and the port right? Check the address, and firewalls." };
  }
  for (const [pattern, cause, fix] of CAUSES) {
    if (pattern.test(text)) {
      return { cause, fix };
    }
  }
  if (/ECONNRESET|socket hang up|stream closed|GOAWAY|Protocol error|session error/i.test(text)) {
    return tls
      ? { cause: "the connection was closed during set-up", fix: "The service may require a client certificate." }
      : { cause: CLOSED_PLAINTEXT[0], fix: CLOSED_PLAINTEXT[1] };
  }
  return { cause: error.message || error.codeName, fix: "" };
}

/** The codes and messages of `error`'s causes (Node puts `ECONNREFUSED` in a cause's `code`). */
function describeCauses(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = (error as { cause?: unknown }).cause;
  for (let depth = 0; current !== undefined && current !== null && depth < 5; depth++) {
    const { code, message } = current as { code?: unknown; message?: unknown };
    parts.push(String(code ?? ""), String(message ?? ""));
    current = (current as { cause?: unknown }).cause;
  }
  return parts.join(" ");
}

/** Whether an address means TLS (`https://…`). */
export function isTls(target: string): boolean {
  return /^https:\/\//i.test(target);
}

/**
 * `error` from the service at `target`, saying what to do about it: a transport failure as
 * `ServiceUnreachable` (the cause and the fix), a refused token with how to pass one, a lane
 * not found with a hint about namespaces (when `token` says one was sent); any other as it is.
 */
export function explained(error: unknown, target: string, token = false): LaneError {
  const lane = laneErrorFrom(error);
  if (lane instanceof ServiceUnreachable) {
    return lane;
  }
  if (lane.code === Code.Unauthenticated) {
    return lane.withMessage(
      `${lane.message}. The service at ${target} needs a bearer token: pass { token } to ` +
        "createLaneClient or connectLane, one of its LANE_AUTH_TOKENS",
    );
  }
  // After the first contact only UNAVAILABLE and DEADLINE_EXCEEDED are the connection's
  // (a CANCELLED is the caller's own abort, a closed session's).
  if ((lane.code === Code.Unavailable || lane.code === Code.DeadlineExceeded) && isTransportFailure(lane)) {
    const { cause, fix } = diagnose(lane, isTls(target));
    const unreachable = new ServiceUnreachable(target, cause, `${fix}${gaveUpNote(lane.gaveUp)}`, {
      code: lane.code,
      cause: lane,
    });
    unreachable.gaveUp = lane.gaveUp;
    return unreachable;
  }
  if (token && lane.reason === "LANE_NOT_FOUND") {
    return lane.withMessage(
      `${lane.message}. With auth on, a token sees only its own namespace's lanes: is this the ` +
        "token the lane was made with?",
    );
  }
  return lane;
}


/**
 * Check that the service at `target` answers one `ListLanes` (a page of one lane) within
 * `timeoutMs`; throw `ServiceUnreachable` when it does not, or the explained UNAUTHENTICATED
 * when it refuses the token. Any other answer means the service is there.
 */
export async function reach(
  client: Pick<LaneServiceClient, "listLanes">,
  target: string,
  timeoutMs: number,
  options: { headers?: CallOptions["headers"]; signal?: AbortSignal } = {},
): Promise<void> {
  try {
    await client.listLanes({ pageSize: 1 }, { timeoutMs, headers: options.headers, signal: options.signal });
  } catch (thrown) {
    const error = laneErrorFrom(thrown);
    if (error.code === Code.Unauthenticated) {
      throw explained(error, target);
    }
    if (isTransportFailure(error)) {
      const { cause, fix } = diagnose(error, isTls(target));
      const shown = error.code === Code.DeadlineExceeded ? `no answer within ${timeoutMs / 1000}s` : cause;
      throw new ServiceUnreachable(target, shown, fix, { code: error.code, cause: error });
    }
    // Any other answer: the service is there.
  }
}

/**
 * Failing fast on a stream: until `made()` (the service sent something), a transport failure
 * `check` sees throws `ServiceUnreachable` once `timeoutMs` passed since this was made (0: never).
 */
export class FirstContact {
  private until: number | undefined;

  constructor(
    private readonly target: string,
    timeoutMs: number,
  ) {
    this.until = timeoutMs > 0 ? Date.now() + timeoutMs : undefined;
  }

  /** The service answered: from now on, failures are outages to ride out. */
  made(): void {
    this.until = undefined;
  }

  /** Throw `ServiceUnreachable` for `error` if it is a transport failure before first contact
   *  and the time to make it is up. */
  check(error: LaneError | undefined): void {
    if (this.until === undefined || error === undefined || !isTransportFailure(error)) {
      return;
    }
    if (Date.now() >= this.until) {
      const { cause, fix } = diagnose(error, isTls(this.target));
      throw new ServiceUnreachable(this.target, cause, fix, { code: error.code, cause: error });
    }
  }
}
