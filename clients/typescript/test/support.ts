/** Helpers shared by the tests. */
import assert from "node:assert/strict";
import { toJson } from "@bufbuild/protobuf";
import { LaneSnapshotSchema, type LaneSnapshot } from "../src/gen/lane/v1/snapshot_pb.js";

/** Every object (message, array, …) reachable from `value`. */
function objectsOf(value: unknown, into: Set<object> = new Set()): Set<object> {
  if (value === null || typeof value !== "object" || into.has(value)) {
    return into;
  }
  into.add(value);
  for (const child of Object.values(value)) {
    objectsOf(child, into);
  }
  return into;
}

/** Fail when `result` reaches any object that one of `inputs` reaches (structural sharing). */
export function assertSharesNothing(result: object, inputs: object[], label = ""): void {
  const inputObjects = new Set<object>();
  for (const input of inputs) {
    objectsOf(input, inputObjects);
  }
  const shared = [...objectsOf(result)].filter((object) => inputObjects.has(object));
  assert.equal(
    shared.length,
    0,
    `${label}: the result shares ${shared.length} object(s) with its inputs, e.g. ${JSON.stringify(
      shared[0],
      (_, v: unknown) => (typeof v === "bigint" ? `${v}n` : v),
    )?.slice(0, 200)}`,
  );
}

/** Both snapshots as canonical JSON, for a readable failure message. */
export function describeDiff(actual: LaneSnapshot, expected: LaneSnapshot): string {
  const show = (snapshot: LaneSnapshot): string =>
    JSON.stringify(toJson(LaneSnapshotSchema, snapshot), null, 1);
  return `snapshot differs\n--- actual\n${show(actual)}\n--- expected\n${show(expected)}`;
}
