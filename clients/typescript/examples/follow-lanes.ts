/**
 * Follow a lane list with the shipped `watchLanes` and print every update as one JSON line.
 *
 *   npx tsx examples/follow-lanes.ts PREFIX HOST:PORT
 *
 * For every update (the listing, each message of changes, a new listing after a reconnect) it
 * writes one line to stdout:
 *
 *   {"kind": "listing" | "changes", "relisted": bool, "lanes": {id: <LaneSummary as JSON>},
 *    "changed": [ids], "removed": [ids]}
 *
 * Follows until SIGTERM / SIGINT (exit 0); 1 when the watch fails; 2 on bad arguments.
 * tests/integration/test_typescript_watcher.py runs it with `node --import tsx`.
 */
import { toJson } from "@bufbuild/protobuf";
import { LaneError, LaneSummarySchema, createLaneClient, watchLanes } from "../src/index.js";

function writeLine(line: string): Promise<void> {
  return new Promise((resolve, reject) => {
    process.stdout.write(`${line}\n`, (error) => (error ? reject(error) : resolve()));
  });
}

async function main(): Promise<number> {
  const [prefix, address, ...extra] = process.argv.slice(2);
  if (prefix === undefined || !address || extra.length > 0) {
    console.error("usage: npx tsx examples/follow-lanes.ts PREFIX HOST:PORT");
    return 2;
  }
  const controller = new AbortController();
  const stop = (): void => controller.abort();
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  const client = createLaneClient(address, { token: process.env.LANE_TOKEN || undefined });
  try {
    for await (const update of watchLanes(client, {
      prefix,
      signal: controller.signal,
      backoff: { initialMs: 50, maxMs: 300 },
      onRetry: (info) => console.error(`follow-lanes: listing again in ${Math.round(info.delayMs)} ms`),
    })) {
      const lanes = Object.fromEntries(
        [...update.lanes].map(([laneId, line]) => [laneId, toJson(LaneSummarySchema, line)]),
      );
      await writeLine(
        JSON.stringify({
          kind: update.kind,
          relisted: update.relisted,
          lanes,
          changed: update.changed.map((line) => line.laneId),
          removed: update.removed.map((removal) => removal.laneId),
        }),
      );
    }
    return 0;
  } catch (error) {
    const what = error instanceof LaneError ? `${error.codeName} ${error.reason}: ${error.message}` : error;
    console.error("follow-lanes: watch failed:", what);
    return 1;
  }
}

process.exit(await main());
