import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  LaneError,
  Reason,
  codeName,
  errorInfoOf,
  laneErrorFrom,
  reasonFromName,
  reasonName,
  reasonOf,
} from "../src/errors.js";
import { ErrorInfoSchema, RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { reconnectDelay } from "../src/watch.js";

const info = {
  reason: "REVISION_OUT_OF_RANGE",
  domain: "lane.v1",
  metadata: { laneId: "lane-1", floor: "100", head: "250" },
};

describe("laneErrorFrom", () => {
  it("decodes the ErrorInfo of a ConnectError as received from the wire", () => {
    // As the gRPC transport hands it over: the detail still encoded, named by its type.
    const wire = new ConnectError("cannot resume lane lane-1 after revision 7", Code.OutOfRange);
    wire.details.push({
      type: "google.rpc.ErrorInfo",
      value: toBinary(ErrorInfoSchema, create(ErrorInfoSchema, info)),
    });
    const error = laneErrorFrom(wire);
    assert.ok(error instanceof LaneError);
    assert.ok(error instanceof Error);
    assert.equal(error.code, Code.OutOfRange);
    assert.equal(error.codeName, "OUT_OF_RANGE");
    assert.equal(error.reason, "REVISION_OUT_OF_RANGE");
    assert.equal(error.domain, "lane.v1");
    assert.deepEqual({ ...error.metadata }, info.metadata);
    assert.equal(error.message, "cannot resume lane lane-1 after revision 7");
    assert.equal(error.cause, wire);
  });

  it("decodes an ErrorInfo given as a message", () => {
    const error = laneErrorFrom(
      new ConnectError("lane lane-9 not found", Code.NotFound, undefined, [
        { desc: ErrorInfoSchema, value: { reason: "LANE_NOT_FOUND", domain: "lane.v1", metadata: { laneId: "lane-9" } } },
      ]),
    );
    assert.equal(error.reason, "LANE_NOT_FOUND");
    assert.equal(error.metadata["laneId"], "lane-9");
    assert.equal(errorInfoOf(error.cause as ConnectError)?.reason, "LANE_NOT_FOUND");
  });

  it("leaves reason, domain and metadata empty without an ErrorInfo", () => {
    const error = laneErrorFrom(new ConnectError("stream reset", Code.Internal));
    assert.equal(error.code, Code.Internal);
    assert.equal(error.reason, "");
    assert.equal(error.domain, "");
    assert.deepEqual({ ...error.metadata }, {});
  });

  it("maps non-Connect errors through ConnectError.from", () => {
    assert.equal(laneErrorFrom(new Error("boom")).code, Code.Unknown);
    assert.equal(laneErrorFrom(new DOMException("stop", "AbortError")).code, Code.Canceled);
  });

  it("returns a LaneError unchanged", () => {
    const error = new LaneError({ code: Code.Aborted, message: "lost" });
    assert.equal(laneErrorFrom(error), error);
  });

  it("freezes the metadata", () => {
    const error = new LaneError({ code: Code.Aborted, message: "m", metadata: { a: "1" } });
    assert.throws(() => {
      (error.metadata as Record<string, string>)["a"] = "2";
    });
  });
});

describe("codeName", () => {
  it("spells codes as gRPC does", () => {
    assert.equal(codeName(Code.InvalidArgument), "INVALID_ARGUMENT");
    assert.equal(codeName(Code.ResourceExhausted), "RESOURCE_EXHAUSTED");
    assert.equal(codeName(Code.Canceled), "CANCELLED");
    assert.equal(codeName(Code.Unavailable), "UNAVAILABLE");
  });
});

describe("Reason", () => {
  it("is the contract's enum: a refusal's reason string maps to it and back", () => {
    const wire = new ConnectError("lease held", Code.FailedPrecondition, undefined, [
      { desc: ErrorInfoSchema, value: { reason: "LEASE_HELD", domain: "lane.v1", metadata: {} } },
    ]);
    assert.equal(reasonOf(wire), Reason.LEASE_HELD);
    assert.equal(laneErrorFrom(wire).reasonCode, Reason.LEASE_HELD);
    assert.equal(reasonName(Reason.STALE_LEASE), "STALE_LEASE");
    assert.equal(reasonFromName("WATCHER_TOO_SLOW"), Reason.WATCHER_TOO_SLOW);
  });

  it("gives UNSPECIFIED for no reason and for one newer than this client", () => {
    assert.equal(reasonOf(new ConnectError("connection refused", Code.Unavailable)), Reason.UNSPECIFIED);
    assert.equal(reasonFromName("A_REASON_FROM_THE_FUTURE"), Reason.UNSPECIFIED);
    assert.equal(reasonFromName(""), Reason.UNSPECIFIED);
  });

  it("holds every reason docs/errors.md lists", async () => {
    const { readFile } = await import("node:fs/promises");
    const docs = await readFile(new URL("../../../docs/errors.md", import.meta.url), "utf8");
    const rows = docs.split("\n").filter((line) => line.startsWith("| ") && !line.startsWith("| code"));
    const listed = rows.flatMap((row) => [...(row.split("|")[2] ?? "").matchAll(/`([A-Z][A-Z_]+)`/g)].map((m) => m[1]));
    assert.ok(listed.length > 50);
    for (const name of listed) {
      assert.notEqual(reasonFromName(name ?? ""), Reason.UNSPECIFIED, name);
    }
  });
});

describe("RetryInfo", () => {
  const refusal = (delay?: { seconds: bigint; nanos: number }): ConnectError => {
    const wire = new ConnectError("too many watchers of lane lane-1", Code.ResourceExhausted);
    wire.details.push({
      type: "google.rpc.ErrorInfo",
      value: toBinary(ErrorInfoSchema, create(ErrorInfoSchema, { ...info, reason: "TOO_MANY_WATCHERS" })),
    });
    if (delay !== undefined) {
      wire.details.push({
        type: "google.rpc.RetryInfo",
        value: toBinary(RetryInfoSchema, create(RetryInfoSchema, { retryDelay: delay })),
      });
    }
    return wire;
  };

  it("gives the service's retry delay, kept by withMessage", () => {
    const error = laneErrorFrom(refusal({ seconds: 2n, nanos: 500_000_000 }));
    assert.equal(error.retryAfterMs, 2500);
    assert.equal(error.withMessage("again").retryAfterMs, 2500);
    assert.equal(laneErrorFrom(refusal()).retryAfterMs, undefined);
  });

  it("makes a watch wait at least that long before reconnecting", () => {
    const asked = laneErrorFrom(refusal({ seconds: 3n, nanos: 0 }));
    const silent = laneErrorFrom(refusal());
    for (let failures = 1; failures <= 3; failures += 1) {
      assert.ok(reconnectDelay(failures, {}, asked) >= 3000);
      assert.ok(reconnectDelay(failures, {}, silent) <= 400);
      assert.ok(reconnectDelay(failures, {}, undefined) <= 400);
    }
  });
});
