/**
 * Runs every framed-group vector of tests/conformance/frames (format: tests/conformance/README.md,
 * "Framed groups") through the part joiner and the reducer: a group sent in parts is applied only
 * whole, and a message between the parts of a group breaks the protocol.
 */
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { equals, fromJson, type JsonValue } from "@bufbuild/protobuf";
import { WatchLaneResponseSchema } from "../src/gen/lane/v1/lane_service_pb.js";
import { LaneSnapshotSchema } from "../src/gen/lane/v1/snapshot_pb.js";
import { PartJoiner, PartsError } from "../src/message-parts.js";
import { fold } from "../src/reducer.js";
import { describeDiff } from "./support.js";

const FRAMES_DIR = fileURLToPath(new URL("../../../tests/conformance/frames/", import.meta.url));

interface RawFrame {
  response: JsonValue;
  expected?: JsonValue;
  error?: boolean;
}

interface RawVector {
  name: string;
  initial: JsonValue;
  frames: RawFrame[];
}

const files = readdirSync(FRAMES_DIR)
  .filter((name) => name.endsWith(".json"))
  .sort();

describe("framed-group conformance vectors", () => {
  it("the folder holds vectors", () => {
    assert.ok(files.length >= 4, `too few *.json in ${FRAMES_DIR}`);
  });

  for (const file of files) {
    it(file, () => {
      const raw = JSON.parse(readFileSync(FRAMES_DIR + file, "utf8")) as RawVector;
      assert.equal(raw.name, file.replace(/\.json$/, ""));
      let snapshot = fromJson(LaneSnapshotSchema, raw.initial);
      const joiner = new PartJoiner(WatchLaneResponseSchema);
      raw.frames.forEach((frame, index) => {
        const response = fromJson(WatchLaneResponseSchema, frame.response);
        const part = response.item.case === "part" ? response.item.value : undefined;
        if (frame.error === true) {
          assert.throws(() => joiner.take(response, part), PartsError);
          assert.equal(index, raw.frames.length - 1);
          return;
        }
        const whole = joiner.take(response, part);
        if (whole !== undefined) {
          assert.equal(whole.item.case, "eventGroup");
          if (whole.item.case === "eventGroup") {
            snapshot = fold(snapshot, whole.item.value.events).snapshot;
          }
        }
        const expected = fromJson(LaneSnapshotSchema, frame.expected ?? null);
        assert.ok(equals(LaneSnapshotSchema, snapshot, expected), `frame ${index}: ${describeDiff(snapshot, expected)}`);
      });
    });
  }
});
