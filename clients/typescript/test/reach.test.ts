/**
 * Failing fast and saying why, without a service: the diagnosis of transport failures, the
 * first-contact gate of a watch, the note of a retry that gave up, the hint of a LANE_BUSY
 * refusal. (The entry points against real services that fail: tests/integration/
 * test_typescript_fail_fast.py.)
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Code, ConnectError } from "@connectrpc/connect";
import { create, toBinary } from "@bufbuild/protobuf";
import { givingUp, withRetries } from "../src/commands.js";
import { LaneError, freeingHint, laneErrorFrom } from "../src/errors.js";
import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { FirstContact, ServiceUnreachable, diagnose, explained, isTransportFailure } from "../src/reach.js";

function transport(code: Code, message: string, cause?: { code: string; message: string }): LaneError {
  const error = new ConnectError(message, code, undefined, undefined, cause);
  return laneErrorFrom(error);
}

describe("diagnose", () => {
  it("names the cause and the fix of each transport failure", () => {
    const cases: [LaneError, boolean, string, string][] = [
      [transport(Code.Unavailable, "connect ECONNREFUSED 127.0.0.1:1"), false, "connection refused", "Is the service running"],
      [transport(Code.Unavailable, "getaddrinfo ENOTFOUND nowhere.invalid"), false, "unknown host", "host name"],
      [transport(Code.Internal, "ssl3_get_record:wrong version number"), true, "does not speak TLS", "plaintext address"],
      [transport(Code.Internal, "self-signed certificate"), true, "not trusted", "nodeOptions: { ca }"],
      [transport(Code.Canceled, "http/2 stream closed with error code CANCEL (0x8)"), false, "closed during set-up", "https://"],
      [transport(Code.DeadlineExceeded, "the operation timed out"), false, "no answer", "firewalls"],
    ];
    for (const [error, tls, cause, fix] of cases) {
      assert.ok(isTransportFailure(error), error.message);
      const found = diagnose(error, tls);
      assert.match(found.cause, new RegExp(cause), error.message);
      assert.ok(found.fix.includes(fix), `${error.message}: ${found.fix}`);
    }
  });

  it("leaves the service's own answers alone", () => {
    const refused = new ConnectError("lane x does not exist", Code.NotFound);
    refused.details.push({
      desc: ErrorInfoSchema,
      value: create(ErrorInfoSchema, { reason: "LANE_NOT_FOUND", domain: "lane.v1" }),
    });
    const error = laneErrorFrom(refused);
    assert.equal(isTransportFailure(error), false);
    assert.equal(explained(error, "h:1"), error);
  });
});

describe("explained", () => {
  it("makes a transport failure a ServiceUnreachable naming the target", () => {
    const error = explained(transport(Code.Unavailable, "connect ECONNREFUSED 127.0.0.1:1"), "127.0.0.1:1");
    assert.ok(error instanceof ServiceUnreachable);
    assert.equal(error.problem, "connection refused");
    assert.ok(error.message.startsWith("cannot reach the lane service at 127.0.0.1:1: connection refused."));
  });

  it("hints at namespaces for a lane not found when a token was sent", () => {
    const refused = new ConnectError("lane x does not exist", Code.NotFound);
    refused.details.push({
      desc: ErrorInfoSchema,
      value: create(ErrorInfoSchema, { reason: "LANE_NOT_FOUND", domain: "lane.v1" }),
    });
    assert.equal(explained(refused, "h:1").message, "lane x does not exist");
    assert.match(explained(refused, "h:1", true).message, /a token sees only its own namespace's lanes/);
  });

  it("says how to pass a token when the service refuses one", () => {
    const error = explained(new ConnectError("no token", Code.Unauthenticated), "h:1");
    assert.equal(error.code, Code.Unauthenticated);
    assert.match(error.message, /The service at h:1 needs a bearer token: pass \{ token \}/);
  });
});

describe("FirstContact", () => {
  const pause = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

  it("throws once the connect timeout passed before any message, never after one", async () => {
    const refused = transport(Code.Unavailable, "connect ECONNREFUSED 127.0.0.1:1");
    const gate = new FirstContact("127.0.0.1:1", 1);
    const reached = new FirstContact("127.0.0.1:1", 1);
    reached.made();
    await pause(5); // the (1 ms) connect timeout passes
    assert.throws(() => gate.check(refused), ServiceUnreachable);
    reached.check(refused); // an outage after first contact: ridden out
    new FirstContact("x", 0).check(refused); // 0: no gate
  });
});

describe("retries that give up", () => {
  it("say how many attempts they made", async () => {
    let attempts = 0;
    await assert.rejects(
      withRetries(
        async () => {
          attempts += 1;
          throw new ConnectError("connect ECONNREFUSED", Code.Unavailable);
        },
        { timeoutMs: 50, initialMs: 5, maxMs: 10 },
      ),
      (error: LaneError) => {
        assert.ok(attempts > 1);
        assert.equal(error.gaveUp?.attempts, attempts);
        assert.match(error.message, new RegExp(`\\(gave up after ${attempts} attempts in \\d+\\.\\ds\\)$`));
        return true;
      },
    );
    const once = new LaneError({ code: Code.Unavailable, message: "x" });
    assert.equal(givingUp(once, 1, Date.now()), once); // a single attempt is not a retry
  });
});

describe("LANE_BUSY", () => {
  const metadata = {
    laneId: "l1",
    openOperationId: "op1",
    operationKind: "run",
    leaseHolder: "d1",
    leaseExpires: "2026-01-01T00:00:00+00:00",
    leaseLive: "false",
    cancelRequested: "false",
  };

  it("says how to free the lane", () => {
    const hint = freeingHint(metadata);
    assert.ok(hint.includes("`lane abort l1`"));
    assert.ok(hint.includes('driver.recover("op1") takes the run over now'));
    assert.ok(hint.includes("LANE_ORPHAN_SECONDS"));
    assert.ok(freeingHint({ ...metadata, leaseLive: "true" }).includes("once its lease lapses (2026-01-01"));
    assert.ok(freeingHint({ ...metadata, cancelRequested: "true" }).startsWith("Its abort was requested"));
    assert.equal(freeingHint({}), "");
  });

  it("ends the message of a LANE_BUSY refusal", () => {
    const refused = new ConnectError("lane l1 already has open operation op1", Code.FailedPrecondition);
    refused.details.push({
      type: "google.rpc.ErrorInfo",
      value: toBinary(ErrorInfoSchema, create(ErrorInfoSchema, { reason: "LANE_BUSY", domain: "lane.v1", metadata })),
    });
    const error = laneErrorFrom(refused);
    assert.ok(error.message.startsWith("lane l1 already has open operation op1. To free the lane: `lane abort l1`"));
    assert.equal(error.metadata["leaseHolder"], "d1");
  });
});
