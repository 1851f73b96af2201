/**
 * A TypeScript `LaneSession` in a process of its own, for the Python integration tests
 * (tests/integration/test_typescript_session.py):
 *
 *     node --import tsx test/session-process.ts '{"target": "127.0.0.1:50051", "maxInFlight": 64}'
 *
 * It reads JSON lines on stdin and answers each with a JSON line on stdout carrying its `id`,
 * as soon as it is answered (so requests are pipelined: the next line is read while earlier
 * commands wait):
 *
 * - `{"id", "op": "call", "method": "recordUsage", "request": base64, "via": "session" |
 *   "unary" | "client"}`: the request (the method's request message, encoded) through the
 *   session, as the unary RPC (`LaneServiceClient`, errors through `laneErrorFrom`), or through
 *   `LaneClient.call` of a `connectLane(target, { session: true })` client, or (`"unary-client"`)
 *   of a `connectLane(target)` client, which sends unary RPCs; the answer is
 *   `{"id", "response": base64}` or `{"id", "error": {"code", "reason", "message", "metadata",
 *   "sessionBroken"}}` (the message is the service's own, `serviceMessage`).
 * - `{"id", "op": "burst", "calls": [{"method", "request"}, ...]}`: every call through the session
 *   at once (submitted in one synchronous loop, so the session may batch them); the answer is
 *   `{"id", "answers": [each as a call's answer], "messagesSent", "commandsSent"}` (what the
 *   session wrote meanwhile).
 * - `{"id", "op": "stats"}`: `{"id", "streamsOpened", "inFlight", "queued",
 *   "clientStreamsOpened"}` (the last: the LaneClient's own session).
 * - `{"id", "op": "close"}`: closes the session, answers, and exits.
 */
import { createInterface } from "node:readline";
import { fromBinary, toBinary, type DescMessage, type DescMethodUnary } from "@bufbuild/protobuf";
import type { CallOptions } from "@connectrpc/connect";
import {
  LaneService,
  LaneSession,
  SessionBroken,
  codeName,
  connectLane,
  createLaneClient,
  laneErrorFrom,
  type RequestOf,
  type UnaryMethod,
} from "../src/index.js";

type Json = Record<string, unknown>;

const config = JSON.parse(process.argv[2] ?? "{}") as Json;
const service = createLaneClient(config["target"] as string);
const lanes = connectLane(config["target"] as string, { session: true });
const unaryLanes = connectLane(config["target"] as string);
const session = new LaneSession(service, {
  ...(config["maxInFlight"] === undefined ? {} : { maxInFlight: config["maxInFlight"] as number }),
  retry: { timeoutMs: 30_000 },
});

function reply(message: Json): void {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

async function call(line: Json): Promise<Json> {
  const method = line["method"] as UnaryMethod;
  const desc = LaneService.method[method] as DescMethodUnary;
  const request = fromBinary(desc.input, Buffer.from(line["request"] as string, "base64"));
  try {
    let response: unknown;
    if (line["via"] === "unary") {
      const send = service[method] as unknown as (request: unknown, options: CallOptions) => Promise<unknown>;
      response = await send.call(service, request, { timeoutMs: 30_000 });
    } else if (line["via"] === "client") {
      response = await lanes.call(method, request as RequestOf<typeof method>);
    } else if (line["via"] === "unary-client") {
      response = await unaryLanes.call(method, request as RequestOf<typeof method>);
    } else {
      response = await session.call(method, request as RequestOf<typeof method>);
    }
    return { response: Buffer.from(toBinary(desc.output as DescMessage, response as never)).toString("base64") };
  } catch (thrown) {
    const error = laneErrorFrom(thrown);
    return {
      error: {
        code: codeName(error.code),
        reason: error.reason,
        message: error.serviceMessage,
        metadata: error.metadata,
        sessionBroken: error instanceof SessionBroken,
      },
    };
  }
}

const lines = createInterface({ input: process.stdin });
for await (const text of lines) {
  if (!text.trim()) {
    continue;
  }
  const line = JSON.parse(text) as Json;
  const id = line["id"];
  const op = line["op"];
  if (op === "call") {
    void call(line).then((answer) => reply({ id, ...answer }));
  } else if (op === "burst") {
    const [messages, commands] = [session.messagesSent, session.commandsSent];
    const calls = (line["calls"] as Json[]).map((one) => call(one));
    void Promise.all(calls).then((answers) =>
      reply({
        id,
        answers,
        messagesSent: session.messagesSent - messages,
        commandsSent: session.commandsSent - commands,
      }),
    );
  } else if (op === "stats") {
    reply({
      id,
      streamsOpened: session.streamsOpened,
      inFlight: session.inFlight,
      queued: session.queued,
      clientStreamsOpened: lanes.session?.streamsOpened,
    });
  } else if (op === "close") {
    await Promise.all([session.close(), lanes.close()]);
    reply({ id, streamsOpened: session.streamsOpened });
    break;
  } else {
    reply({ id, error: { code: "INVALID_ARGUMENT", message: `unknown op ${String(op)}` } });
  }
}
process.exit(0);
