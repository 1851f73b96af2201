/**
 * Follow a lane with the shipped watcher and print every folded view as one JSON line.
 *
 *   npx tsx examples/follow.ts LANE_ID HOST:PORT [TARGET_REVISION]
 *
 * For every update `watchLane` yields (the initial snapshot, each folded event group, a fresh
 * snapshot after a re-snapshot) it writes one line to stdout and waits until the line is
 * flushed before folding the next one:
 *
 *   {"revision": "<n>", "kind": "snapshot" | "events", "snapshot": <LaneSnapshot as JSON>}
 *
 * `snapshot` is protobuf-es canonical JSON (`toJson(LaneSnapshotSchema, …)`): any protobuf
 * runtime can parse it back (Python: `json_format.Parse`). Resume after a dropped stream or a
 * service restart is the watcher's own; each retry is reported on stderr.
 *
 * Exits 0 once it printed a view at or past TARGET_REVISION (without one, it follows until
 * stopped), or on SIGTERM / SIGINT; 1 when the watch fails; 2 on bad arguments.
 * tests/integration/test_typescript_watcher.py runs it as `node --import tsx examples/follow.ts …`
 * (the loader the unit tests use): `npx` exits on SIGTERM without passing it on, so its exit
 * status would not be the follower's.
 */
import { toJson } from "@bufbuild/protobuf";
import { LaneError, LaneSnapshotSchema, createLaneClient, watchLane } from "../src/index.js";

const USAGE = "usage: npx tsx examples/follow.ts LANE_ID HOST:PORT [TARGET_REVISION]";

/** Write one line to stdout; resolves once it is handed to the OS (the pipe is flushed). */
function writeLine(line: string): Promise<void> {
  return new Promise((resolve, reject) => {
    process.stdout.write(`${line}\n`, (error) => (error ? reject(error) : resolve()));
  });
}

function parseTarget(value: string | undefined): bigint | undefined | null {
  if (value === undefined || value === "") {
    return undefined;
  }
  return /^\d+$/.test(value) ? BigInt(value) : null;
}

async function main(): Promise<number> {
  const [laneId, address, targetArg, ...extra] = process.argv.slice(2);
  const target = parseTarget(targetArg);
  if (!laneId || !address || target === null || extra.length > 0) {
    console.error(USAGE);
    return 2;
  }
  const controller = new AbortController();
  // `on`, not `once`: a signal delivered twice (to the process group and relayed by tsx) must
  // not fall through to the default action and kill the process mid-line.
  const stop = (): void => controller.abort();
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  // A service with auth on needs a bearer token: LANE_TOKEN, as for the Python `lane` CLI.
  const client = createLaneClient(address, { token: process.env.LANE_TOKEN || undefined });
  try {
    for await (const update of watchLane(client, laneId, {
      signal: controller.signal,
      onRetry: (info) => {
        const where = info.afterRevision === undefined ? "" : ` after ${info.afterRevision}`;
        const why = info.error ? ` (${info.error.codeName}: ${info.error.message})` : "";
        console.error(`follow: ${info.mode}${where} in ${Math.round(info.delayMs)} ms${why}`);
      },
    })) {
      const revision = update.snapshot.revision;
      await writeLine(
        JSON.stringify({
          revision: revision.toString(),
          kind: update.kind,
          snapshot: toJson(LaneSnapshotSchema, update.snapshot),
        }),
      );
      if (target !== undefined && revision >= target) {
        controller.abort(); // leaving the loop cancels the call
        break;
      }
    }
    return 0;
  } catch (error) {
    if (error instanceof LaneError) {
      console.error(`follow: watch failed: ${error.codeName} ${error.reason}: ${error.message}`);
    } else {
      console.error("follow: watch failed:", error);
    }
    return 1;
  }
}

// Exit explicitly: every line was flushed above, and an idle HTTP/2 session must not keep the
// process alive.
process.exit(await main());
