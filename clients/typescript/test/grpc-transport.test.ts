/**
 * The client over a real gRPC connection: an in-process connect-node gRPC server (HTTP/2, the
 * gRPC protocol only) plays WatchLane, so the ErrorInfo trailer, server-side UNAVAILABLE and a
 * connection torn down mid-stream go through the real transport. (The end-to-end test against
 * the Python service lives with the service's tests.)
 */
import assert from "node:assert/strict";
import http2 from "node:http2";
import { after, before, describe, it } from "node:test";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { createLaneClient } from "../src/client.js";
import { laneErrorFrom } from "../src/errors.js";
import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import {
  LaneService,
  type WatchLaneRequest,
  type WatchLaneResponse,
} from "../src/gen/lane/v1/lane_service_pb.js";
import { watchLane, type RetryInfo, type WatchUpdate } from "../src/watch.js";
import { LANE, group, head, rows, runningSnapshot, toolStart } from "./fixtures.js";
import { startGrpcServer, type GrpcServer } from "./grpc-server.js";

/** What the server does for the n-th WatchLane call (0-based). */
type Behaviour = (
  request: WatchLaneRequest,
  session: http2.ServerHttp2Session | undefined,
  signal: AbortSignal,
) => AsyncIterable<WatchLaneResponse>;

let behaviours: Behaviour[] = [];
let requests: WatchLaneRequest[] = [];
let server: GrpcServer;

function routes(router: ConnectRouter): void {
  router.service(LaneService, {
    watchLane(request, context) {
      requests.push(request);
      const behaviour = behaviours[requests.length - 1];
      if (behaviour === undefined) {
        throw new ConnectError("no more scripted calls", Code.FailedPrecondition);
      }
      // The newest session is the one serving this call (one client, one connection at a time).
      return behaviour(request, [...server.sessions].at(-1), context.signal);
    },
  });
}

before(async () => {
  server = await startGrpcServer(routes);
});

after(async () => {
  await server.stop(); // the clients keep their connections open
});

function script(...list: Behaviour[]): void {
  behaviours = list;
  requests = [];
}

/** Wait `ms`, or less when the call ends (so no handler outlives the test). */
function idle(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

describe("over a real gRPC connection", () => {
  it("decodes the ErrorInfo of the grpc-status-details-bin trailer", async () => {
    script(async function* () {
      throw new ConnectError("lane lane-1 not found", Code.NotFound, undefined, [
        { desc: ErrorInfoSchema, value: { reason: "LANE_NOT_FOUND", domain: "lane.v1", metadata: { laneId: "lane-1" } } },
      ]);
    });
    const client = createLaneClient(server.address);
    try {
      for await (const _ of client.watchLane({ laneId: LANE })) {
        assert.fail("no message expected");
      }
      assert.fail("an error was expected");
    } catch (thrown) {
      const error = laneErrorFrom(thrown);
      assert.equal(error.code, Code.NotFound);
      assert.equal(error.reason, "LANE_NOT_FOUND");
      assert.equal(error.domain, "lane.v1");
      assert.deepEqual({ ...error.metadata }, { laneId: "lane-1" });
      assert.equal(error.message, "lane lane-1 not found");
    }
  });

  it("watchLane resumes after UNAVAILABLE and after the connection is torn down", async () => {
    script(
      async function* () {
        yield head(runningSnapshot(10));
        yield group(toolStart(11, "a"));
        throw new ConnectError("shutting down", Code.Unavailable);
      },
      async function* (_request, session, signal) {
        yield group(toolStart(12, "b"));
        await idle(20, signal);
        session?.destroy(); // the connection drops without a status
        await idle(300, signal);
      },
      async function* (_request, _session, signal) {
        yield group(toolStart(13, "c"));
        await idle(60_000, signal);
      },
    );
    const retries: RetryInfo[] = [];
    const updates: WatchUpdate[] = [];
    const controller = new AbortController();
    const client = createLaneClient(server.address);
    for await (const update of watchLane(client, LANE, {
      signal: controller.signal,
      backoff: { initialMs: 5, maxMs: 10 },
      onRetry: (info) => retries.push(info),
    })) {
      updates.push(update);
      if (updates.length === 4) {
        controller.abort();
      }
    }
    assert.deepEqual(
      requests.map((r) => r.afterRevision),
      [undefined, 11n, 12n],
    );
    assert.deepEqual(rows(updates[3]!.snapshot), ["a:running", "b:running", "c:running"]);
    assert.equal(retries.length, 2);
    assert.equal(retries[0]!.error?.code, Code.Unavailable);
    // Whatever code the transport reports for the torn-down connection, the watcher resumed.
    assert.equal(retries[1]!.mode, "resume");
  });
});
