/**
 * Runs every reducer conformance vector of tests/conformance (format: its README.md). The
 * folder is listed at run time, so a vector added there is picked up with no code change.
 */
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { clone, equals, fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { HarnessEventSchema, type HarnessEvent } from "../src/gen/lane/v1/events_pb.js";
import { LaneSnapshotSchema, type LaneSnapshot } from "../src/gen/lane/v1/snapshot_pb.js";
import { EVENT_KINDS, apply, fold, type EventKind } from "../src/reducer.js";
import { assertSharesNothing, describeDiff } from "./support.js";

const VECTOR_DIR = fileURLToPath(new URL("../../../tests/conformance/", import.meta.url));

interface RawStep {
  event: JsonValue;
  expected: JsonValue;
  rebase?: boolean;
}

interface RawVector {
  name: string;
  description: string;
  initial: JsonValue;
  steps: RawStep[];
}

interface Step {
  event: HarnessEvent;
  expected: LaneSnapshot;
  rebase: boolean;
}

interface Vector {
  file: string;
  raw: RawVector;
  initial: LaneSnapshot;
  steps: Step[];
}

function loadVectors(): Vector[] {
  const files = readdirSync(VECTOR_DIR)
    .filter((name) => name.endsWith(".json"))
    .sort();
  return files.map((file) => {
    const raw = JSON.parse(readFileSync(VECTOR_DIR + file, "utf8")) as RawVector;
    // fromJson rejects unknown field names, so a misspelt field fails here.
    return {
      file,
      raw,
      initial: fromJson(LaneSnapshotSchema, raw.initial),
      steps: raw.steps.map((step) => ({
        event: fromJson(HarnessEventSchema, step.event),
        expected: fromJson(LaneSnapshotSchema, step.expected),
        rebase: step.rebase ?? false,
      })),
    };
  });
}

const vectors = loadVectors();

describe("conformance vectors", () => {
  it("the folder holds vectors", () => {
    assert.ok(vectors.length > 0, `no *.json in ${VECTOR_DIR}`);
  });

  it("together the vectors use every HarnessEvent kind the reducer knows", () => {
    const used = new Set<EventKind>();
    for (const vector of vectors) {
      for (const step of vector.steps) {
        if (step.event.kind.case !== undefined) {
          used.add(step.event.kind.case);
        }
      }
    }
    const missing = [...EVENT_KINDS].filter((kind) => !used.has(kind));
    assert.deepEqual(missing, []);
  });

  for (const vector of vectors) {
    describe(vector.file, () => {
      it("is well formed canonical proto3 JSON", () => {
        assert.equal(vector.raw.name, vector.file.replace(/\.json$/, ""));
        assert.ok(vector.raw.steps.length > 0, "steps is empty");
        // protobuf-es prints the same JSON back: field names, int64 strings, enum names,
        // timestamps and omitted defaults all agree with the Python mapping.
        assert.deepEqual(toJson(LaneSnapshotSchema, vector.initial), vector.raw.initial);
        vector.steps.forEach((step, index) => {
          const raw = vector.raw.steps[index]!;
          assert.deepEqual(toJson(HarnessEventSchema, step.event), raw.event, `step ${index} event`);
          assert.deepEqual(
            toJson(LaneSnapshotSchema, step.expected),
            raw.expected,
            `step ${index} expected`,
          );
        });
      });

      it("each step folds to its expected snapshot, immutably", () => {
        let current = vector.initial;
        vector.steps.forEach((step, index) => {
          const inputBefore = clone(LaneSnapshotSchema, current);
          const eventBefore = clone(HarnessEventSchema, step.event);
          const reduction = apply(current, step.event);
          assert.ok(
            equals(LaneSnapshotSchema, reduction.snapshot, step.expected),
            `step ${index}: ${describeDiff(reduction.snapshot, step.expected)}`,
          );
          assert.equal(reduction.rebase, step.rebase, `step ${index}: rebase`);
          assert.ok(equals(LaneSnapshotSchema, current, inputBefore), `step ${index}: input changed`);
          assert.ok(equals(HarnessEventSchema, step.event, eventBefore), `step ${index}: event changed`);
          assertSharesNothing(reduction.snapshot, [current, step.event], `step ${index}`);
          current = reduction.snapshot;
        });
      });

      it("folding all events at once gives the last expected snapshot", () => {
        const reduction = fold(
          vector.initial,
          vector.steps.map((step) => step.event),
        );
        const last = vector.steps[vector.steps.length - 1]!;
        assert.ok(
          equals(LaneSnapshotSchema, reduction.snapshot, last.expected),
          describeDiff(reduction.snapshot, last.expected),
        );
        assert.equal(
          reduction.rebase,
          vector.steps.some((step) => step.rebase),
        );
      });
    });
  }
});
