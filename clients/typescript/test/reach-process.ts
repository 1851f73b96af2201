/**
 * The TypeScript SDK's entry points against a service, in a process of their own, for
 * tests/integration/test_typescript_fail_fast.py:
 *
 *     node --import tsx test/reach-process.ts '<json>'
 *
 * `{"kind": "entries", "target", "lane", "ca"?, "token"?, "connectTimeoutMs"}` tries each entry
 * point — a `LaneClient` command, its `watch`, `Driver.run`, and `watchLane` on the raw client —
 * with retries that never give up, so one that does not fail fast hangs (the test's guard then
 * fails it). `{"kind": "run", "target", "lane", "retryAfterMs"?}` drives one run with a scripted
 * model (after a first answer failing with that retry-after, when given).
 *
 * The last line of stdout is the JSON result: for `entries`, one `{entry, name, code, message,
 * target, problem, fix}` per entry point; for `run`, `{status, error}` or the thrown `{name,
 * code, reason, message}`.
 */
import { readFileSync } from "node:fs";
import {
  Driver,
  LaneClient,
  ModelError,
  OperationResultStatus,
  ScriptedModel,
  ServiceUnreachable,
  codeName,
  createLaneClient,
  laneErrorFrom,
  watchLane,
  type LaneClientOptions,
  type ModelRequest,
} from "../src/index.js";

type Json = Record<string, unknown>;

const config = JSON.parse(process.argv[2] ?? "{}") as Json;
const target = config["target"] as string;
const lane = config["lane"] as string;

const FOREVER = { timeoutMs: 3_600_000, initialMs: 50, maxMs: 200 };

function clientOptions(): LaneClientOptions {
  const options: LaneClientOptions = {};
  if (typeof config["ca"] === "string") {
    options.nodeOptions = { ca: readFileSync(config["ca"]) };
  }
  if (typeof config["token"] === "string") {
    options.token = config["token"];
  }
  return options;
}

function described(entry: string, thrown: unknown): Json {
  const error = laneErrorFrom(thrown);
  return {
    entry,
    name: thrown instanceof ServiceUnreachable ? "ServiceUnreachable" : (thrown as Error).name,
    code: codeName(error.code),
    reason: error.reason,
    message: error.message,
    target: thrown instanceof ServiceUnreachable ? thrown.target : null,
    problem: thrown instanceof ServiceUnreachable ? thrown.problem : null,
    fix: thrown instanceof ServiceUnreachable ? thrown.fix : null,
  };
}

async function firstUpdate(updates: AsyncGenerator<unknown>): Promise<void> {
  for await (const _ of updates) {
    return;
  }
}

const never = (): Promise<never> => new Promise(() => undefined);

async function entries(): Promise<Json[]> {
  const service = createLaneClient(target, clientOptions());
  const connectTimeoutMs = (config["connectTimeoutMs"] as number | undefined) ?? 5_000;
  const lanes = new LaneClient(service, { retry: FOREVER, connectTimeoutMs });
  const attempts: [string, () => Promise<unknown>][] = [
    ["command", () => lanes.createLane(lane)],
    ["watch", () => firstUpdate(lanes.watch(lane, { backoff: { initialMs: 50, maxMs: 200 } }))],
    ["driver", () => new Driver(lanes, lane, [], { retryMs: 3_600_000 }).run("hello", { model: never })],
    ["bare watch", () => firstUpdate(watchLane(service, lane, { connectTimeoutMs, backoff: { initialMs: 50, maxMs: 200 } }))],
  ];
  const results: Json[] = [];
  for (const [entry, attempt] of attempts) {
    try {
      await attempt();
      results.push({ entry, name: "none" });
    } catch (thrown) {
      results.push(described(entry, thrown));
    }
  }
  return results;
}

async function run(): Promise<Json> {
  const lanes = new LaneClient(createLaneClient(target, clientOptions()));
  const retryAfterMs = config["retryAfterMs"] as number | undefined;
  const scripted = new ScriptedModel([{ text: "done" }]);
  let asked = 0;
  const model = async (request: ModelRequest) => {
    asked += 1;
    if (retryAfterMs !== undefined && asked === 1) {
      throw new ModelError("Rate limit reached.", { retryable: true, retryAfterMs });
    }
    return scripted.answer(request);
  };
  try {
    const result = await new Driver(lanes, lane).run("go", { model });
    return {
      status: OperationResultStatus[result.status],
      error: result.result?.error?.message ?? null,
      asked,
    };
  } catch (thrown) {
    return described("run", thrown);
  }
}

const result = config["kind"] === "run" ? await run() : await entries();
process.stdout.write(`${JSON.stringify(result)}\n`);
process.exit(0);
