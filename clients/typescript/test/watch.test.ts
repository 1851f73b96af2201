/**
 * The watcher's assembly, fold and resume logic, without a server: a fake client plays one
 * scripted stream per WatchLane call and records each request.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create, equals } from "@bufbuild/protobuf";
import { Code, ConnectError, type CallOptions } from "@connectrpc/connect";
import { LaneError } from "../src/errors.js";
import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { WatchLaneResponseSchema, type WatchLaneResponse } from "../src/gen/lane/v1/lane_service_pb.js";
import { LaneSnapshotSchema, type LaneSnapshot } from "../src/gen/lane/v1/snapshot_pb.js";
import {
  WATCHER_TOO_SLOW,
  WatchProtocolError,
  backoffDelay,
  checkIncarnation,
  watchLane,
  type RetryInfo,
  type WatchClient,
  type WatchOptions,
  type WatchUpdate,
} from "../src/watch.js";
import {
  LANE,
  chunk,
  entryAdded,
  event,
  group,
  head,
  heartbeat,
  rows,
  runningSnapshot,
  toolEnd,
  toolStart,
  userEntry,
} from "./fixtures.js";

interface Call {
  laneId: string;
  afterRevision: bigint | undefined;
  incarnation: string | undefined;
  signal: AbortSignal;
}

/** One scripted stream: yields messages; may throw or hang until the call is aborted. */
type Script = (call: Call) => AsyncIterable<WatchLaneResponse>;

class FakeClient implements WatchClient {
  readonly calls: Call[] = [];
  constructor(private readonly scripts: Script[]) {}

  watchLane(
    request: { laneId?: string; afterRevision?: bigint; incarnation?: string },
    options?: CallOptions,
  ): AsyncIterable<WatchLaneResponse> {
    const call: Call = {
      laneId: request.laneId ?? "",
      afterRevision: request.afterRevision,
      incarnation: request.incarnation,
      signal: options?.signal ?? new AbortController().signal,
    };
    this.calls.push(call);
    const script = this.scripts[this.calls.length - 1];
    if (script === undefined) {
      throw new Error(`unexpected WatchLane call #${this.calls.length}`);
    }
    return script(call);
  }
}

/** A stream of `messages`, then `end`: "hang" (until aborted), "close", or an error to throw. */
function stream(messages: WatchLaneResponse[], end: "hang" | "close" | Error = "hang"): Script {
  return async function* (call) {
    for (const message of messages) {
      yield message;
    }
    if (end === "close") {
      return;
    }
    if (end !== "hang") {
      throw end;
    }
    await hangUntilAborted(call.signal);
  };
}

function hangUntilAborted(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    const fail = (): void => reject(new ConnectError("the operation was aborted", Code.Canceled));
    if (signal.aborted) {
      fail();
    }
    signal.addEventListener("abort", fail, { once: true });
  });
}

function serviceError(code: Code, reason: string, metadata: Record<string, string> = {}): ConnectError {
  return new ConnectError(`refused: ${reason}`, code, undefined, [
    { desc: ErrorInfoSchema, value: { reason, domain: "lane.v1", metadata } },
  ]);
}

const fast: WatchOptions = { backoff: { initialMs: 1, maxMs: 2 } };

/** Take `count` updates, then leave the loop (which cancels the watch). */
async function take(
  client: WatchClient,
  count: number,
  opts: WatchOptions = {},
): Promise<WatchUpdate[]> {
  const updates: WatchUpdate[] = [];
  if (count === 0) {
    return updates;
  }
  for await (const update of watchLane(client, LANE, { ...fast, ...opts })) {
    updates.push(update);
    if (updates.length === count) {
      break;
    }
  }
  return updates;
}

const base = (): LaneSnapshot => runningSnapshot(10);

describe("watchLane: the initial snapshot", () => {
  it("asks for a fresh snapshot and yields it", async () => {
    const client = new FakeClient([stream([head(base())])]);
    const [update] = await take(client, 1);
    assert.equal(client.calls.length, 1);
    assert.equal(client.calls[0]!.laneId, LANE);
    assert.equal(client.calls[0]!.afterRevision, undefined);
    assert.equal(update!.kind, "snapshot");
    assert.deepEqual(update!.events, []);
    assert.ok(equals(LaneSnapshotSchema, update!.snapshot, base()));
  });

  it("assembles the transcript from the head and its following chunks, in order", async () => {
    const first = create(LaneSnapshotSchema, { laneId: LANE, revision: 9n, transcript: [userEntry("e1", 1)] });
    const client = new FakeClient([
      stream([head(first, 2), chunk([userEntry("e2", 2), userEntry("e3", 3)]), chunk([userEntry("e4", 4)])]),
    ]);
    const updates = await take(client, 1);
    assert.equal(updates.length, 1);
    assert.deepEqual(
      updates[0]!.snapshot.transcript.map((entry) => entry.id),
      ["e1", "e2", "e3", "e4"],
    );
    assert.equal(first.transcript.length, 1, "the received head is not mutated");
  });

  it("yields nothing before the last chunk arrived", async () => {
    const client = new FakeClient([stream([head(base(), 1)], "close"), stream([head(base())])]);
    const updates = await take(client, 1);
    // The first stream ended mid-snapshot: the retry is a fresh watch again.
    assert.equal(client.calls.length, 2);
    assert.equal(client.calls[1]!.afterRevision, undefined);
    assert.equal(updates[0]!.kind, "snapshot");
  });
});

describe("watchLane: events and heartbeats", () => {
  it("folds each event group with the reducer", async () => {
    const client = new FakeClient([
      stream([head(base()), group(toolStart(11, "call-0"), toolStart(12, "call-1")), group(toolEnd(13, "call-0", "ok"))]),
    ]);
    const updates = await take(client, 3);
    assert.deepEqual(updates.map((u) => u.kind), ["snapshot", "events", "events"]);
    assert.equal(updates[1]!.events.length, 2);
    assert.deepEqual(rows(updates[1]!.snapshot), ["call-0:running", "call-1:running"]);
    assert.deepEqual(rows(updates[2]!.snapshot), ["call-0:settled", "call-1:running"]);
    assert.equal(updates[2]!.snapshot.revision, 13n);
    assert.deepEqual(rows(updates[0]!.snapshot), [], "earlier updates are not mutated");
  });

  it("yields heartbeats only when asked", async () => {
    const messages = [head(base()), heartbeat(10), group(toolStart(11, "c"))];
    const quiet = await take(new FakeClient([stream(messages)]), 2);
    assert.deepEqual(quiet.map((u) => u.kind), ["snapshot", "events"]);
    const loud = await take(new FakeClient([stream(messages)]), 3, { heartbeats: true });
    assert.deepEqual(loud.map((u) => u.kind), ["snapshot", "heartbeat", "events"]);
    assert.equal(loud[1]!.headRevision, 10n);
    assert.equal(loud[1]!.snapshot.revision, 10n);
  });

  it("skips an item kind it does not know", async () => {
    const unknown = create(WatchLaneResponseSchema);
    const client = new FakeClient([stream([head(base()), unknown, group(toolStart(11, "c"))])]);
    const updates = await take(client, 2);
    assert.deepEqual(updates.map((u) => u.kind), ["snapshot", "events"]);
  });
});

describe("watchLane: resuming", () => {
  it("resumes after its last revision on UNAVAILABLE, without a new snapshot", async () => {
    const retries: RetryInfo[] = [];
    const client = new FakeClient([
      stream([head(base()), group(toolStart(11, "call-0"))], serviceError(Code.Unavailable, "UNAVAILABLE")),
      stream([group(toolEnd(12, "call-0", "ok"))]),
    ]);
    const updates = await take(client, 3, { onRetry: (info) => retries.push(info) });
    assert.equal(client.calls.length, 2);
    assert.equal(client.calls[1]!.afterRevision, 11n);
    assert.deepEqual(updates.map((u) => u.kind), ["snapshot", "events", "events"]);
    assert.deepEqual(rows(updates[2]!.snapshot), ["call-0:settled"]);
    assert.equal(retries.length, 1);
    assert.equal(retries[0]!.mode, "resume");
    assert.equal(retries[0]!.afterRevision, 11n);
    assert.equal(retries[0]!.error?.code, Code.Unavailable);
  });

  it("resumes when the stream simply ends", async () => {
    const client = new FakeClient([stream([head(base())], "close"), stream([group(toolStart(11, "c"))])]);
    const updates = await take(client, 2);
    assert.equal(client.calls[1]!.afterRevision, 10n);
    assert.equal(updates[1]!.kind, "events");
  });

  it("resumes after a dropped connection (a transport error without ErrorInfo)", async () => {
    const reset = new ConnectError("http/2 stream closed with error code INTERNAL_ERROR (0x2)", Code.Internal);
    const econnreset = Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" });
    // connect-node reports a connection torn down under the stream as CANCELED.
    const torn = new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled);
    const client = new FakeClient([
      stream([head(base())], reset),
      stream([group(toolStart(11, "c"))], econnreset),
      stream([group(toolStart(12, "d"))], torn),
      stream([group(toolStart(13, "e"))]),
    ]);
    const updates = await take(client, 4);
    assert.deepEqual(client.calls.map((c) => c.afterRevision), [undefined, 10n, 11n, 12n]);
    assert.deepEqual(rows(updates[3]!.snapshot), ["c:running", "d:running", "e:running"]);
  });

  it("resumes when the server cut it off as too slow", async () => {
    const slow = serviceError(Code.ResourceExhausted, WATCHER_TOO_SLOW, { lastRevision: "10" });
    const client = new FakeClient([stream([head(base())], slow), stream([group(toolStart(11, "c"))])]);
    await take(client, 2);
    assert.equal(client.calls[1]!.afterRevision, 10n);
  });

  it("resumes when no message arrives within the idle timeout", async () => {
    const client = new FakeClient([stream([head(base())], "hang"), stream([group(toolStart(11, "c"))])]);
    const updates = await take(client, 2, { idleTimeoutMs: 20 });
    assert.ok(client.calls[0]!.signal.aborted, "the idle call was cancelled");
    assert.equal(client.calls[1]!.afterRevision, 10n);
    assert.equal(updates[1]!.kind, "events");
  });

  it("skips events at or below the resume point", async () => {
    const client = new FakeClient([
      stream([head(base()), group(toolStart(11, "a"))], serviceError(Code.Unavailable, "UNAVAILABLE")),
      stream([group(toolStart(11, "a")), group(toolStart(12, "b"))]),
    ]);
    const updates = await take(client, 3);
    assert.deepEqual(updates.map((u) => u.events.map((e) => e.revision)), [[], [11n], [12n]]);
    assert.deepEqual(rows(updates[2]!.snapshot), ["a:running", "b:running"]);
  });

  it("resumes after a lane-less event's revision even though the snapshot's stays", async () => {
    const fault = event(11, { case: "fault", value: { code: "X", message: "boom" } }, "");
    const client = new FakeClient([
      stream([head(base()), group(fault)], "close"),
      stream([group(toolStart(12, "b"))]),
    ]);
    const updates = await take(client, 3);
    assert.equal(updates[1]!.snapshot.revision, 10n);
    assert.equal(updates[1]!.snapshot.faulted, true);
    assert.equal(client.calls[1]!.afterRevision, 11n);
  });

  it("continues from a snapshot the caller holds", async () => {
    const client = new FakeClient([stream([group(toolStart(11, "c"))])]);
    const updates = await take(client, 1, { from: base() });
    assert.equal(client.calls[0]!.afterRevision, 10n);
    assert.equal(updates[0]!.kind, "events");
  });

  it("backs off exponentially with jitter, capped", () => {
    const opts = { initialMs: 100, maxMs: 1_000, multiplier: 2 };
    assert.equal(backoffDelay(1, opts, () => 1), 100);
    assert.equal(backoffDelay(1, opts, () => 0), 50);
    assert.equal(backoffDelay(3, opts, () => 1), 400);
    assert.equal(backoffDelay(10, opts, () => 1), 1_000);
  });

  it("gives up after maxRetries consecutive failures with the last error", async () => {
    const down = (): Script => stream([], serviceError(Code.Unavailable, "UNAVAILABLE"));
    const client = new FakeClient([down(), down(), down()]);
    await assert.rejects(take(client, 1, { maxRetries: 2 }), (error: unknown) => {
      assert.ok(error instanceof LaneError);
      assert.equal(error.code, Code.Unavailable);
      return true;
    });
    assert.equal(client.calls.length, 3);
  });
});

describe("watchLane: re-snapshotting", () => {
  it("watches afresh when the resume point is OUT_OF_RANGE", async () => {
    const retries: RetryInfo[] = [];
    const fresh = runningSnapshot(500);
    const client = new FakeClient([
      stream([head(base())], serviceError(Code.Unavailable, "UNAVAILABLE")),
      stream([], serviceError(Code.OutOfRange, "REVISION_OUT_OF_RANGE", { floor: "400", head: "500" })),
      stream([head(fresh), group(toolStart(501, "c"))]),
    ]);
    const updates = await take(client, 3, { onRetry: (info) => retries.push(info) });
    assert.deepEqual(client.calls.map((c) => c.afterRevision), [undefined, 10n, undefined]);
    assert.deepEqual(updates.map((u) => u.kind), ["snapshot", "snapshot", "events"]);
    assert.equal(updates[1]!.snapshot.revision, 500n);
    assert.deepEqual(retries.map((r) => r.mode), ["resume", "resnapshot"]);
    assert.equal(retries[1]!.error?.reason, "REVISION_OUT_OF_RANGE");
  });

  it("resumes naming the incarnation, and watches afresh when the lane is another one", async () => {
    const retries: RetryInfo[] = [];
    const old = base();
    old.incarnation = "7";
    const recreated = create(LaneSnapshotSchema, { laneId: LANE, revision: 12n, incarnation: "9" });
    const client = new FakeClient([
      stream([head(old)], serviceError(Code.Unavailable, "UNAVAILABLE")),
      stream([], serviceError(Code.FailedPrecondition, "LANE_INCARNATION_CHANGED", { incarnation: "9" })),
      stream([head(recreated)]),
    ]);
    const updates = await take(client, 2, { onRetry: (info) => retries.push(info) });
    assert.deepEqual(
      client.calls.map((c) => [c.afterRevision, c.incarnation]),
      [[undefined, undefined], [10n, "7"], [undefined, undefined]],
    );
    assert.deepEqual(updates.map((u) => [u.kind, u.snapshot.incarnation]), [["snapshot", "7"], ["snapshot", "9"]]);
    assert.deepEqual(retries.map((r) => r.mode), ["resume", "resnapshot"]);
    assert.equal(retries[1]!.error?.reason, "LANE_INCARNATION_CHANGED");
  });

  it("learns the incarnation from heartbeats and refuses a heartbeat of another", () => {
    assert.equal(checkIncarnation("", "5"), "5");
    assert.equal(checkIncarnation("5", ""), "5");
    assert.equal(checkIncarnation("5", "5"), "5");
    assert.throws(() => checkIncarnation("5", "6"), WatchProtocolError);
  });

  it("watches afresh after navigation_end, yielding the rebasing group first", async () => {
    const navEnd = event(12, { case: "navigationEnd", value: { runId: "nav-1", tipId: "e-x" } });
    const moved = create(LaneSnapshotSchema, { laneId: LANE, revision: 12n, tipId: "e-x" });
    const client = new FakeClient([
      stream([head(base()), group(toolStart(11, "c")), group(navEnd), group(toolStart(13, "never"))]),
      stream([head(moved)]),
    ]);
    const updates = await take(client, 4);
    assert.deepEqual(updates.map((u) => [u.kind, u.rebase]), [
      ["snapshot", false],
      ["events", false],
      ["events", true],
      ["snapshot", false],
    ]);
    assert.ok(client.calls[0]!.signal.aborted, "the rebased stream was cancelled");
    assert.equal(client.calls[1]!.afterRevision, undefined);
    assert.equal(updates[3]!.snapshot.tipId, "e-x");
  });
});

describe("watchLane: stopping", () => {
  it("throws a LaneError with the ErrorInfo for an error it cannot recover from", async () => {
    const client = new FakeClient([stream([], serviceError(Code.NotFound, "LANE_NOT_FOUND", { laneId: LANE }))]);
    await assert.rejects(take(client, 1), (error: unknown) => {
      assert.ok(error instanceof LaneError);
      assert.equal(error.code, Code.NotFound);
      assert.equal(error.reason, "LANE_NOT_FOUND");
      assert.equal(error.metadata["laneId"], LANE);
      return true;
    });
    assert.equal(client.calls.length, 1);
  });

  it("treats the service's own INTERNAL error as final", async () => {
    const client = new FakeClient([stream([], serviceError(Code.Internal, "INTERNAL"))]);
    await assert.rejects(take(client, 1), LaneError);
  });

  it("refuses a stream that breaks the protocol", async () => {
    const early = new FakeClient([stream([group(toolStart(1, "c"))])]);
    await assert.rejects(take(early, 1), WatchProtocolError);
    const stray = new FakeClient([stream([head(base()), chunk([])])]);
    await assert.rejects(take(stray, 2), WatchProtocolError);
    const twice = new FakeClient([stream([head(base()), head(base())])]);
    await assert.rejects(take(twice, 2), WatchProtocolError);
  });

  it("ends quietly when aborted while waiting for a message", async () => {
    const controller = new AbortController();
    const client = new FakeClient([stream([head(base())], "hang")]);
    const updates: WatchUpdate[] = [];
    for await (const update of watchLane(client, LANE, { ...fast, signal: controller.signal })) {
      updates.push(update);
      setTimeout(() => controller.abort(), 5);
    }
    assert.equal(updates.length, 1);
    assert.ok(client.calls[0]!.signal.aborted);
  });

  it("ends quietly when aborted during the backoff", async () => {
    const controller = new AbortController();
    const client = new FakeClient([stream([head(base())], serviceError(Code.Unavailable, "UNAVAILABLE"))]);
    const started = Date.now();
    const updates: WatchUpdate[] = [];
    const watch = watchLane(client, LANE, {
      backoff: { initialMs: 60_000, maxMs: 60_000 },
      signal: controller.signal,
      onRetry: () => setTimeout(() => controller.abort(), 5),
    });
    for await (const update of watch) {
      updates.push(update);
    }
    assert.equal(updates.length, 1);
    assert.equal(client.calls.length, 1);
    assert.ok(Date.now() - started < 10_000, "the backoff was cut short");
  });

  it("cancels the call when the consumer leaves the loop", async () => {
    const client = new FakeClient([stream([head(base()), group(toolStart(11, "c"))], "hang")]);
    await take(client, 1);
    assert.ok(client.calls[0]!.signal.aborted);
  });

  it("does not call at all when already aborted", async () => {
    const client = new FakeClient([]);
    const updates: WatchUpdate[] = [];
    for await (const update of watchLane(client, LANE, { signal: AbortSignal.abort() })) {
      updates.push(update);
    }
    assert.deepEqual(updates, []);
    assert.equal(client.calls.length, 0);
  });
});

describe("watchLane: a large transcript", () => {
  it("folds events onto an assembled snapshot of many chunks", async () => {
    const entries = Array.from({ length: 1_000 }, (_, i) => userEntry(`e${i}`, i + 1));
    const first = create(LaneSnapshotSchema, { laneId: LANE, revision: 1_000n, transcript: entries.slice(0, 100) });
    const chunks = Array.from({ length: 9 }, (_, i) => chunk(entries.slice(100 * (i + 1), 100 * (i + 2))));
    const added = userEntry("e1000", 1_001);
    const client = new FakeClient([stream([head(first, 9), ...chunks, group(entryAdded(1_001, added))])]);
    const updates = await take(client, 2);
    assert.equal(updates[0]!.snapshot.transcript.length, 1_000);
    assert.equal(updates[1]!.snapshot.transcript.length, 1_001);
    assert.equal(updates[1]!.snapshot.tipId, "e1000");
  });
});
