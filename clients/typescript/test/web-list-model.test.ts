/**
 * The web console's list model (web/src/list-model.ts) and event log (web/src/history.ts),
 * without a browser: filters read from and written to the address, the page of rows a filter
 * shows with its status counts, and the log's groups (a gap is noticed; a revision inside a
 * commit shows the lane before that commit).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { HarnessEventSchema, type HarnessEvent } from "../src/gen/lane/v1/events_pb.js";
import {
  LaneStatus,
  LaneSummarySchema,
  type LaneSummary,
} from "../src/gen/lane/v1/lane_service_pb.js";
import { OperationResultStatus } from "../src/gen/lane/v1/snapshot_pb.js";
import { LaneLog } from "../web/src/history.js";
import { filterOf, PAGE_ROWS, queryOf, viewOf } from "../web/src/list-model.js";

const NOW = 1_000_000_000;

function lane(laneId: string, activityMs: number, status = LaneStatus.IDLE, result = OperationResultStatus.UNSPECIFIED): LaneSummary {
  return create(LaneSummarySchema, {
    laneId,
    status,
    lastResultStatus: result,
    lastActivityTime: timestampFromMs(activityMs),
  });
}

function events(first: number, last: number): HarnessEvent[] {
  const out: HarnessEvent[] = [];
  for (let revision = first; revision <= last; revision++) {
    out.push(create(HarnessEventSchema, { revision: BigInt(revision) }));
  }
  return out;
}

describe("the web console's list model", () => {
  it("reads the filters from the address and writes them back", () => {
    const filter = filterOf({ status: "running,bogus,faulted", result: "failed", since: "1h", sort: "id", page: "3", prefix: "web-" });
    assert.deepEqual([...filter.statuses].sort(), ["faulted", "running"]);
    assert.equal(filter.result, "failed");
    assert.deepEqual(filterOf(queryOf(filter)), filter);
    // Unknown values fall back to "any", never to an error.
    const loose = filterOf({ result: "exploded", since: "2y", page: "-1", sort: "size" });
    assert.deepEqual([loose.result, loose.since, loose.page, loose.sort], ["", "", 1, "activity"]);
  });

  it("shows the page a filter names, most recently active first, with counts per status", () => {
    const lanes = [
      lane("old-failed", NOW - 2 * 3_600_000, LaneStatus.IDLE, OperationResultStatus.FAILED),
      lane("new-failed", NOW - 60_000, LaneStatus.IDLE, OperationResultStatus.FAILED),
      lane("running", NOW - 1_000, LaneStatus.RUNNING),
      lane("idle", NOW - 30_000),
    ];
    const all = viewOf(lanes, filterOf({}), NOW);
    assert.deepEqual(all.rows.map((l) => l.laneId), ["running", "idle", "new-failed", "old-failed"]);
    assert.deepEqual(all.counts, { running: 1, idle: 3 });
    const failedLastHour = viewOf(lanes, filterOf({ result: "failed", since: "1h" }), NOW);
    assert.deepEqual(failedLastHour.rows.map((l) => l.laneId), ["new-failed"]);
    const running = viewOf(lanes, filterOf({ status: "running" }), NOW);
    assert.deepEqual(running.rows.map((l) => l.laneId), ["running"]);
    assert.deepEqual(running.counts, all.counts); // the status filter leaves the counts whole
    const byId = viewOf(lanes, filterOf({ sort: "id" }), NOW);
    assert.deepEqual(byId.rows.map((l) => l.laneId), ["idle", "new-failed", "old-failed", "running"]);
  });

  it("orders lanes active within the same millisecond by their microseconds", () => {
    const at = (laneId: string, nanos: number): LaneSummary =>
      create(LaneSummarySchema, { laneId, lastActivityTime: { seconds: 1_700_000_000n, nanos } });
    const lanes = [at("a-first", 5_000_100), at("b-second", 5_000_900), at("c-third", 5_000_500)];
    assert.deepEqual(viewOf(lanes, filterOf({}), NOW).rows.map((l) => l.laneId), ["b-second", "c-third", "a-first"]);
  });

  it("pages by PAGE_ROWS and keeps the page within the pages there are", () => {
    const lanes = Array.from({ length: PAGE_ROWS + 3 }, (_, i) => lane(`l${String(i).padStart(3, "0")}`, NOW - i));
    const second = viewOf(lanes, filterOf({ page: "2" }), NOW);
    assert.deepEqual([second.page, second.pages, second.matching], [2, 2, PAGE_ROWS + 3]);
    assert.deepEqual(second.rows.map((l) => l.laneId), ["l050", "l051", "l052"]);
    assert.equal(viewOf(lanes, filterOf({ page: "9" }), NOW).page, 2);
  });
});

describe("the web console's event log", () => {
  it("holds whole groups in order, notices a gap, and finds the commit at a revision", () => {
    const log = new LaneLog();
    assert.equal(log.add(events(1, 1)), true);
    assert.equal(log.add(events(2, 5)), true);
    assert.equal(log.add(events(2, 5)), true); // held already
    assert.equal(log.add(events(8, 9)), false); // 6 and 7 are missing
    assert.equal(log.add(events(6, 9)), true);
    assert.deepEqual(log.groups.map((g) => [g.first, g.last]), [[1n, 1n], [2n, 5n], [6n, 9n]]);
    assert.equal(log.last, 9n);
    // At a revision ending a commit: that commit. Inside one: the commit before it.
    assert.deepEqual([1n, 4n, 5n, 6n, 9n, 50n].map((r) => log.groupAt(r)), [0, 0, 1, 1, 2, 2]);
  });
});
