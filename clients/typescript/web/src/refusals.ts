/**
 * The service's refusals in words a person acts on. Every refusal carries a gRPC code and a
 * stable reason (docs/errors.md); the page shows this sentence first and the code and reason
 * after it, small, for whoever reads the service's log or docs.
 */
import { Code } from "@connectrpc/connect";
import { codeName, type LaneError } from "@lane/client";
import { byteSize } from "./format.js";

/** What to tell the user about `error`; `subject` names the lane or the action when known. */
export function explain(error: LaneError, subject = "the lane"): string {
  const m = error.metadata;
  switch (error.reason) {
    case "TOKEN_MISSING":
      return "This service asks for a token before it shows anything. Paste the token you were given below.";
    case "TOKEN_UNKNOWN":
      return "The service does not accept this token. Check it for a typo or a missing part, or ask whoever runs the service for a valid one.";
    case "LANE_NOT_FOUND":
      return `Lane ${m.laneId ?? subject} does not exist (or belongs to another token's lanes).`;
    case "LANE_DELETED":
      return `Lane ${m.laneId ?? subject} was deleted.`;
    case "LANE_BUSY":
      return `Lane ${m.laneId ?? subject} has a run open: abort it first, or wait for it to end.`;
    case "LANE_EXISTS":
      return `A lane named ${m.laneId ?? subject} exists already: choose another id.`;
    case "INVALID_EXPORT": {
      const line = m.line !== undefined && m.line !== "0" ? ` (line ${m.line})` : "";
      return `That file is not a lane export${line}: ${m.problem ?? error.serviceMessage}.`;
    }
    case "EXPORT_VERSION_UNSUPPORTED":
      return `That export file is of version ${m.version ?? "?"}, which this service does not read (it reads ${m.supported ?? "another"}).`;
    case "PAYLOAD_TOO_LARGE":
      return `Too large: ${m.field ?? "it"} is ${byteSize(Number(m.bytes ?? 0))}, and the limit is ${byteSize(Number(m.limit ?? 0))}.`;
    case "QUEUE_FULL":
      return "The lane's inbox is full (1 MiB of queued messages): wait for a run to take them.";
    case "TOO_MANY_TRANSFERS":
      return "The service is busy with other exports and imports: try again in a few seconds.";
    case "TOO_MANY_WATCHERS":
      return "The service follows as many live pages as it allows just now; this page keeps trying.";
    case "OPERATION_NOT_OPEN":
    case "OPERATION_NOT_FOUND":
      return "That run has ended already.";
    case "INVALID_ID":
      return `That is not a valid lane id: ${error.serviceMessage}.`;
    case "MISSING_FIELD":
      return `Something is missing: ${error.serviceMessage}.`;
    case "HOST_NOT_ALLOWED":
      return "The service does not answer pages opened under this address: open it by 127.0.0.1 or localhost, or add the name to LANE_HTTP_ALLOWED_HOSTS.";
    case "BODY_TIMEOUT":
      return "The upload did not arrive in time: try again over a faster connection.";
    case "REQUEST_TOO_LARGE":
      return "The request is larger than the service's 4 MiB limit.";
    case "DATABASE_BUSY":
    case "UNAVAILABLE":
      return "The service's database is busy or unreachable: try again in a moment.";
    default:
      break;
  }
  switch (error.code) {
    case Code.Unavailable:
      return "The service cannot be reached: is it running? This page keeps trying.";
    case Code.Unauthenticated:
      return "The service wants a valid token.";
    case Code.PermissionDenied:
      return `Not allowed: ${error.serviceMessage}.`;
    case Code.DeadlineExceeded:
      return "The service did not answer in time: try again.";
    default:
      return error.serviceMessage || error.message;
  }
}

/** `CODE REASON`, as the small print under a refusal. */
export function codeLine(error: LaneError): string {
  return [codeName(error.code), error.reason].filter((part) => part !== "").join(" ");
}
