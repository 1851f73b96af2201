/**
 * Focused tests of the contract's tool-row rules (docs/contract.md) and of the fold's immutability; the conformance
 * vectors cover every kind, these pin the rules the service is built around one by one.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { clone, create, equals } from "@bufbuild/protobuf";
import { HarnessEventSchema } from "../src/gen/lane/v1/events_pb.js";
import { ToolResultSchema } from "../src/gen/lane/v1/messages_pb.js";
import { LaneSnapshotSchema } from "../src/gen/lane/v1/snapshot_pb.js";
import { EVENT_KINDS, apply, fold, isRebase } from "../src/reducer.js";
import {
  LANE,
  RUN,
  entryAdded,
  event,
  running,
  runningSnapshot,
  rows,
  settled,
  textResult,
  toolEnd,
  toolResultEntry,
  toolStart,
  toolUpdate,
} from "./fixtures.js";
import { assertSharesNothing } from "./support.js";

describe("tool_start", () => {
  it("appends a running row per new call, in order", () => {
    const { snapshot } = fold(runningSnapshot(10), [toolStart(11, "call-0"), toolStart(12, "call-1")]);
    assert.deepEqual(rows(snapshot), ["call-0:running", "call-1:running"]);
    assert.equal(snapshot.revision, 12n);
  });

  it("upserts a duplicate call in place with fresh args and no stale result", () => {
    const before = runningSnapshot(20, [
      running("call-0", '{"n":1}', textResult("half way")),
      running("call-1"),
    ]);
    const { snapshot } = apply(before, toolStart(21, "call-0", '{"n":2}'));
    assert.deepEqual(rows(snapshot), ["call-0:running", "call-1:running"]);
    const row = snapshot.operation!.runningTools[0]!.state;
    assert.equal(row.case, "running");
    assert.equal(row.value.argumentsJson, '{"n":2}');
    assert.equal(row.value.result, undefined);
  });

  it("turns a settled row back into a fresh running row (safe replay)", () => {
    const { snapshot } = apply(runningSnapshot(5, [settled("call-0")]), toolStart(6, "call-0"));
    assert.deepEqual(rows(snapshot), ["call-0:running"]);
  });
});

describe("tool_update", () => {
  it("replaces the running row's progress result", () => {
    const start = runningSnapshot(5, [running("call-0", "{}", textResult("1%"))]);
    const { snapshot } = apply(start, toolUpdate(6, "call-0", "50%"));
    const row = snapshot.operation!.runningTools[0]!.state;
    assert.ok(row.case === "running" && equals(ToolResultSchema, row.value.result!, textResult("50%")));
  });

  it("ignores a settled row and a missing row", () => {
    const start = runningSnapshot(5, [settled("call-0", "{}", "final")]);
    const { snapshot } = fold(start, [toolUpdate(6, "call-0", "late"), toolUpdate(7, "call-9", "x")]);
    const expected = clone(LaneSnapshotSchema, start);
    expected.revision = 7n;
    assert.ok(equals(LaneSnapshotSchema, snapshot, expected));
  });
});

describe("tool_end", () => {
  it("settles the running row in place, keeping the row's arguments", () => {
    const start = runningSnapshot(7, [running("call-0", '{"a":1}', textResult("progress")), running("call-1")]);
    const { snapshot } = apply(start, toolEnd(8, "call-1", "out"));
    assert.deepEqual(rows(snapshot), ["call-0:running", "call-1:settled"]);
    const row = snapshot.operation!.runningTools[1]!.state;
    assert.equal(row.case, "settled");
    assert.equal(row.value.argumentsJson, "{}");
    assert.ok(equals(ToolResultSchema, row.value.result!, textResult("out")));
  });

  it("gives a settled row a result even when the event has none", () => {
    const end = toolEnd(8, "call-0", "x");
    assert.equal(end.kind.case, "toolEnd");
    if (end.kind.case === "toolEnd") {
      end.kind.value.result = undefined;
    }
    const { snapshot } = apply(runningSnapshot(7, [running("call-0")]), end);
    const row = snapshot.operation!.runningTools[0]!.state;
    assert.ok(row.case === "settled" && row.value.result !== undefined);
  });

  it("never creates a row", () => {
    const start = runningSnapshot(7, [running("call-0")]);
    const { snapshot } = apply(start, toolEnd(8, "call-5", "out"));
    assert.deepEqual(rows(snapshot), ["call-0:running"]);
  });

  it("never creates a row on a lane without an operation", () => {
    const idle = create(LaneSnapshotSchema, { laneId: LANE, revision: 3n });
    const { snapshot } = apply(idle, toolEnd(4, "call-0", "out"));
    assert.equal(snapshot.operation, undefined);
    assert.equal(snapshot.revision, 4n);
  });
});

describe("entry_added", () => {
  it("removes only its own call's row, whatever the other rows' states", () => {
    const start = runningSnapshot(30, [settled("call-0"), settled("call-1"), running("call-2")]);
    const { snapshot } = apply(start, entryAdded(31, toolResultEntry(31, "call-1")));
    assert.deepEqual(rows(snapshot), ["call-0:settled", "call-2:running"]);
    assert.equal(snapshot.tipId, "e-r-call-1");
    assert.equal(snapshot.transcript.length, 1);
    assert.equal(snapshot.stats?.messageCount, 1n);
  });

  it("appends a toolResult entry without a row and removes nothing", () => {
    const start = runningSnapshot(30, [running("call-0")]);
    const { snapshot } = apply(start, entryAdded(31, toolResultEntry(31, "call-7")));
    assert.deepEqual(rows(snapshot), ["call-0:running"]);
    assert.equal(snapshot.transcript.length, 1);
  });
});

describe("turn_end", () => {
  it("removes no tool rows", () => {
    const start = runningSnapshot(40, [settled("call-0"), running("call-1")]);
    const { snapshot } = apply(start, event(41, { case: "turnEnd", value: { runId: RUN, turnId: "t-1" } }));
    assert.deepEqual(rows(snapshot), ["call-0:settled", "call-1:running"]);
    assert.equal(snapshot.revision, 41n);
  });
});

describe("a wrong run id", () => {
  it("is ignored by every run-scoped event, which still moves the revision", () => {
    const start = runningSnapshot(50, [running("call-0", "{}", textResult("p")), settled("call-1")]);
    const stale = "run-0";
    const events = [
      toolStart(51, "call-2", "{}", stale),
      toolUpdate(52, "call-0", "stale", stale),
      toolEnd(53, "call-0", "stale", stale),
      event(54, { case: "operationAbort", value: { operationId: stale } }),
      event(55, { case: "retryScheduled", value: { runId: stale, attempt: 1, maxAttempts: 3 } }),
      event(56, { case: "runSuspend", value: { runId: stale } }),
      event(57, { case: "runEnd", value: { runId: stale, tipId: "elsewhere" } }),
    ];
    const { snapshot } = fold(start, events);
    const expected = clone(LaneSnapshotSchema, start);
    expected.revision = 57n;
    assert.ok(equals(LaneSnapshotSchema, snapshot, expected));
  });
});

describe("the envelope", () => {
  it("ignores another lane's events entirely", () => {
    const start = runningSnapshot(60, [running("call-0")]);
    const other = toolEnd(99, "call-0", "x");
    other.laneId = "lane-2";
    const usage = event(100, { case: "usage", value: { totals: { input: 5n } } }, "lane-2");
    const { snapshot } = fold(start, [other, usage]);
    assert.ok(equals(LaneSnapshotSchema, snapshot, start));
  });

  it("applies a lane-less fault without moving the revision", () => {
    const fault = event(0, { case: "fault", value: { code: "X", message: "boom" } }, "");
    const { snapshot } = apply(runningSnapshot(60), fault);
    assert.equal(snapshot.faulted, true);
    assert.equal(snapshot.revision, 60n);
  });

  it("moves the revision for a kind the client does not know", () => {
    const unknown = create(HarnessEventSchema, { laneId: LANE, revision: 61n });
    const { snapshot, rebase } = apply(runningSnapshot(60), unknown);
    assert.equal(snapshot.revision, 61n);
    assert.equal(rebase, false);
  });
});

describe("rebase", () => {
  it("is signalled by navigation_end only", () => {
    const nav = event(70, { case: "navigationEnd", value: { runId: "nav-1" } });
    assert.equal(isRebase(nav), true);
    assert.equal(apply(runningSnapshot(69), nav).rebase, true);
    assert.equal(fold(runningSnapshot(69), [toolStart(70, "c"), nav, toolStart(72, "d")]).rebase, true);
    assert.equal(isRebase(toolStart(70, "c")), false);
    assert.equal(fold(runningSnapshot(69), []).rebase, false);
  });
});

describe("immutability", () => {
  it("never changes its inputs and returns a snapshot that shares nothing with them", () => {
    const start = runningSnapshot(80, [running("call-0", "{}", textResult("p")), settled("call-1")]);
    const events = [
      toolStart(81, "call-2"),
      toolUpdate(82, "call-2", "half"),
      toolEnd(83, "call-2", "full"),
      entryAdded(84, toolResultEntry(84, "call-1")),
      event(85, { case: "usage", value: { totals: { input: 5n } } }),
      event(86, { case: "queueUpdate", value: { queues: [{ entryId: "q-1" }] } }),
    ];
    const startBefore = clone(LaneSnapshotSchema, start);
    const eventsBefore = events.map((e) => clone(HarnessEventSchema, e));
    const { snapshot } = fold(start, events);
    assert.ok(equals(LaneSnapshotSchema, start, startBefore));
    events.forEach((e, i) => assert.ok(equals(HarnessEventSchema, e, eventsBefore[i]!)));
    assert.notEqual(snapshot, start);
    assertSharesNothing(snapshot, [start, ...events]);
  });

  it("returns a new snapshot even for an event that changes nothing", () => {
    const start = runningSnapshot(90);
    const { snapshot } = apply(start, toolEnd(91, "nope", "x", "run-0"));
    assert.notEqual(snapshot, start);
    assertSharesNothing(snapshot, [start]);
  });
});

describe("EVENT_KINDS", () => {
  it("covers every case of the HarnessEvent.kind oneof", () => {
    const oneof = HarnessEventSchema.oneofs.find((o) => o.name === "kind");
    assert.ok(oneof);
    const cases = oneof.fields.map((field) => field.localName).sort();
    assert.deepEqual([...EVENT_KINDS].sort(), cases);
    assert.equal(cases.length, 28);
  });
});
