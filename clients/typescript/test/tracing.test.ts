/**
 * Trace context on the client's calls: with an OpenTelemetry context active (and the W3C
 * propagator registered, as the SDK for Node does), each call carries its `traceparent`; without
 * one, or with `tracing: false`, none. A real gRPC connection to an in-process connect-node
 * server that records the headers it gets.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { ConnectRouter } from "@connectrpc/connect";
import { context, propagation, trace, TraceFlags } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { createLaneClient } from "../src/client.js";
import { LaneService } from "../src/gen/lane/v1/lane_service_pb.js";
import { startGrpcServer, type GrpcServer } from "./grpc-server.js";

const seen: (string | null)[] = [];
let server: GrpcServer;

function routes(router: ConnectRouter): void {
  router.service(LaneService, {
    async *watchLane(_request, ctx) {
      seen.push(ctx.requestHeader.get("traceparent"));
    },
  });
}

before(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  server = await startGrpcServer(routes);
});

after(async () => {
  await server.stop(); // the clients keep their connections open
  propagation.disable();
  context.disable();
});

const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_ID = "00f067aa0ba902b7";

async function watchOnce(tracing?: boolean): Promise<string | null | undefined> {
  const client = createLaneClient(server.address, tracing === undefined ? {} : { tracing });
  seen.length = 0;
  for await (const _ of client.watchLane({ laneId: "lane-1" })) {
    assert.fail("no message expected");
  }
  return seen[0];
}

function inSpan<T>(work: () => Promise<T>): Promise<T> {
  const span = trace.wrapSpanContext({ traceId: TRACE_ID, spanId: SPAN_ID, traceFlags: TraceFlags.SAMPLED });
  return context.with(trace.setSpan(context.active(), span), work);
}

describe("trace context", () => {
  it("sends the active span's traceparent with a call", async () => {
    assert.equal(await inSpan(() => watchOnce()), `00-${TRACE_ID}-${SPAN_ID}-01`);
  });

  it("sends none outside a trace", async () => {
    assert.equal(await watchOnce(), null);
  });

  it("sends none with tracing: false", async () => {
    assert.equal(await inSpan(() => watchOnce(false)), null);
  });
});
