/**
 * The lane list watcher without a server: a fake client plays one scripted WatchLanes stream
 * per call.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type CallOptions } from "@connectrpc/connect";
import { LaneError } from "../src/errors.js";
import {
  LaneRemovalSchema,
  LaneStatus,
  LaneSummarySchema,
  WatchLanesResponseSchema,
  type LaneSummary,
  type WatchLanesRequest,
  type WatchLanesResponse,
} from "../src/gen/lane/v1/lane_service_pb.js";
import { WatchProtocolError } from "../src/watch.js";
import { watchLanes, type LanesUpdate, type WatchLanesClient } from "../src/watch-lanes.js";

type Script = (signal: AbortSignal) => AsyncIterable<WatchLanesResponse>;

class FakeClient implements WatchLanesClient {
  readonly requests: Partial<WatchLanesRequest>[] = [];
  constructor(private readonly scripts: Script[]) {}

  watchLanes(request: Partial<WatchLanesRequest>, options?: CallOptions): AsyncIterable<WatchLanesResponse> {
    this.requests.push(request);
    const script = this.scripts[this.requests.length - 1];
    if (script === undefined) {
      throw new Error(`unexpected WatchLanes call #${this.requests.length}`);
    }
    return script(options?.signal ?? new AbortController().signal);
  }
}

function line(laneId: string, revision: number, status = LaneStatus.IDLE): LaneSummary {
  return create(LaneSummarySchema, { laneId, revision: BigInt(revision), status, incarnation: "1" });
}

function message(fields: {
  lanes?: LaneSummary[];
  removed?: string[];
  listingComplete?: boolean;
  heartbeat?: boolean;
}): WatchLanesResponse {
  return create(WatchLanesResponseSchema, {
    lanes: fields.lanes ?? [],
    removed: (fields.removed ?? []).map((laneId) =>
      create(LaneRemovalSchema, { laneId, incarnation: "1", deleted: true }),
    ),
    listingComplete: fields.listingComplete ?? false,
    heartbeat: fields.heartbeat ?? false,
  });
}

/** `messages`, then hang until aborted (or throw `end`). */
function stream(messages: WatchLanesResponse[], end?: Error): Script {
  return async function* (signal) {
    for (const item of messages) {
      yield item;
    }
    if (end !== undefined) {
      throw end;
    }
    if (!signal.aborted) {
      await new Promise((resolve) => signal.addEventListener("abort", resolve));
    }
  };
}

/** The first `count` updates (each with a copy of its lanes), then stop. */
async function take(client: WatchLanesClient, count: number, opts = {}): Promise<[LanesUpdate, string[]][]> {
  const controller = new AbortController();
  const seen: [LanesUpdate, string[]][] = [];
  for await (const update of watchLanes(client, { ...opts, signal: controller.signal, backoff: { initialMs: 1, maxMs: 2 } })) {
    seen.push([update, [...update.lanes.keys()].sort()]);
    if (seen.length === count) {
      controller.abort();
    }
  }
  return seen;
}

describe("watchLanes", () => {
  it("assembles the listing from its pages, then folds changes and removals", async () => {
    const client = new FakeClient([
      stream([
        message({ lanes: [line("a", 1), line("b", 1)] }),
        message({ lanes: [line("c", 1)], listingComplete: true }),
        message({ lanes: [line("b", 2, LaneStatus.RUNNING)] }),
        message({ heartbeat: true }),
        message({ removed: ["a"] }),
      ]),
    ]);
    const seen = await take(client, 3, { prefix: "p", statuses: [LaneStatus.RUNNING] });
    assert.deepEqual(client.requests[0], { laneIdPrefix: "p", laneIds: [], statuses: [LaneStatus.RUNNING] });
    assert.deepEqual(
      seen.map(([update, ids]) => [update.kind, ids, update.changed.map((l) => l.laneId), update.removed.map((r) => r.laneId)]),
      [
        ["listing", ["a", "b", "c"], ["a", "b", "c"], []],
        ["changes", ["a", "b", "c"], ["b"], []],
        ["changes", ["b", "c"], [], ["a"]],
      ],
    );
    assert.equal(seen[2]?.[0].lanes.get("b")?.status, LaneStatus.RUNNING);
  });

  it("lists again after UNAVAILABLE, replacing the lanes", async () => {
    const client = new FakeClient([
      stream([message({ lanes: [line("a", 1), line("b", 1)], listingComplete: true })], new ConnectError("down", Code.Unavailable)),
      stream([message({ lanes: [line("b", 3)], listingComplete: true })]),
    ]);
    const seen = await take(client, 2);
    assert.deepEqual(
      seen.map(([update, ids]) => [update.kind, update.relisted, ids]),
      [
        ["listing", false, ["a", "b"]],
        ["listing", true, ["b"]],
      ],
    );
    assert.equal(seen[1]?.[0].lanes.get("b")?.revision, 3n);
  });

  it("throws what a watch does not recover from", async () => {
    const client = new FakeClient([stream([], new ConnectError("bad id", Code.InvalidArgument))]);
    await assert.rejects(take(client, 1), (error: unknown) => error instanceof LaneError && error.code === Code.InvalidArgument);
  });

  it("refuses a heartbeat before the listing is complete", async () => {
    const client = new FakeClient([stream([message({ heartbeat: true })])]);
    await assert.rejects(take(client, 1), WatchProtocolError);
  });
});
