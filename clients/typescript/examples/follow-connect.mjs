// Follow a lane over the service's HTTP port (Connect or gRPC-Web) with the built package:
// plain JavaScript, no TypeScript loader, as an application that installed @lane/client runs it.
//
//   node follow-connect.mjs LANE_ID BASE_URL [connect|grpc-web]
//   node --conditions=browser follow-connect.mjs …    (the browser build, on fetch)
//
// The first stdout line names the file "@lane/client" resolved to: {"entry": "file:///…"}.
// Then one line per update, as examples/follow.ts prints them:
//   {"revision": "<n>", "kind": "snapshot" | "events", "snapshot": <LaneSnapshot as JSON>}
// Exits 0 on SIGTERM or SIGINT, 1 when the watch fails. LANE_TOKEN: the bearer token, if any.
// tests/integration/test_typescript_package.py copies it into an application directory.
import { toJson } from "@bufbuild/protobuf";
import { LaneSnapshotSchema, createLaneConnectClient, watchLane } from "@lane/client";

const [laneId, baseUrl, protocol = "connect"] = process.argv.slice(2);
if (!laneId || !baseUrl || (protocol !== "connect" && protocol !== "grpc-web")) {
  console.error("usage: node follow-connect.mjs LANE_ID BASE_URL [connect|grpc-web]");
  process.exit(2);
}

/** Write one line; resolves once it is handed to the OS. */
function writeLine(value) {
  return new Promise((resolve, reject) => {
    process.stdout.write(`${JSON.stringify(value)}\n`, (error) => (error ? reject(error) : resolve()));
  });
}

const controller = new AbortController();
process.on("SIGTERM", () => controller.abort());
process.on("SIGINT", () => controller.abort());

await writeLine({ entry: import.meta.resolve("@lane/client") });
const client = createLaneConnectClient(baseUrl, {
  protocol,
  token: process.env.LANE_TOKEN || undefined,
});
let status = 0;
try {
  for await (const update of watchLane(client, laneId, { signal: controller.signal })) {
    await writeLine({
      revision: update.snapshot.revision.toString(),
      kind: update.kind,
      snapshot: toJson(LaneSnapshotSchema, update.snapshot),
    });
  }
} catch (error) {
  console.error("follow-connect: watch failed:", error);
  status = 1;
}
process.exit(status);
