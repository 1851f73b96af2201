/**
 * The TypeScript Driver in a process of its own, for the Python integration tests
 * (tests/integration/test_typescript_driver.py, test_driver_parity.py):
 *
 *     node --import tsx test/driver-process.ts '<json>'
 *
 * `{"kind": "case", "target", "lane", "case", "session"}` runs one case of
 * tests/driver_cases.json (the `echo` tool and the shared hooks, as the Python side builds
 * them) over the Driver's default DriveLane session, or unary RPCs with `"session": false`; its
 * result counts the RPCs made by method (`calls`). `{"kind": "crash", "target",
 * "lane", "driverId", "executions", "leaseSeconds", "plan", "operationId", "recover"}` runs (or,
 * with `recover`, takes over) a run of the crash plan with the recording tools `safe_read` and
 * `never_write`: every execution is appended to the `executions` file (JSON lines, synced)
 * before its effect begins, as tests/crash/recording.py commits a row, so the checker counts
 * executions whatever was killed when. `{"kind": "abort-grace", …}` runs a tool that ignores
 * the abort, to see the grace period's interruption.
 *
 * The last line of stdout is a JSON result (`{"status": "COMPLETED", "turns": 2}`); the
 * driver's log goes to stderr. Exit status 3: the lease was lost.
 */
import { closeSync, fsyncSync, openSync, readFileSync, writeSync } from "node:fs";
import type { Interceptor } from "@connectrpc/connect";
import {
  Driver,
  LeaseLost,
  OperationResultStatus,
  ScriptedModel,
  StopReason,
  ToolExecution,
  connectLane,
  defineTool,
  deny,
  errorResult,
  replaceArguments,
  type AnyTool,
  type Hooks,
  type ScriptStep,
} from "../src/index.js";
import { sleep } from "../src/commands.js";

type Json = Record<string, unknown>;

const STOP_REASONS: Record<string, StopReason> = {
  stop: StopReason.STOP,
  length: StopReason.LENGTH,
  tool_use: StopReason.TOOL_USE,
};

function script(steps: Json[]): ScriptStep[] {
  return steps.map((step) => ({
    text: step["text"] as string,
    calls: ((step["tools"] as Json[] | undefined) ?? []).map((call) => ({
      name: call["name"] as string,
      args: call["args"] as Json | string,
      ...(call["id"] === undefined ? {} : { id: call["id"] as string }),
    })),
    ...(step["stop_reason"] === undefined ? {} : { stopReason: STOP_REASONS[step["stop_reason"] as string]! }),
  }));
}

/** The shared cases' tool: waits `delay` seconds, reports progress, fails when asked. */
const echo = defineTool<{ text: string; delay?: number; fail?: boolean }>({
  name: "echo",
  parameters: {
    type: "object",
    properties: { text: { type: "string" }, delay: { type: "number", minimum: 0 }, fail: { type: "boolean" } },
    required: ["text"],
    additionalProperties: false,
  },
  replay: "safe",
  async execute(args, ctx) {
    await ctx.progress(`working on ${args.text}`);
    await sleep((args.delay ?? 0) * 1000);
    if (args.fail) {
      throw new Error(`echo failed: ${args.text}`);
    }
    return `echo: ${args.text}`;
  },
});

/** The shared cases' hooks (the Python side has the same rules). */
function caseHooks(abort: () => Promise<void>): Hooks {
  return {
    beforeTool: [
      async (event) => {
        const text = event.args["text"];
        if (text === "forbidden") {
          return deny("forbidden text");
        }
        if (text === "secret") {
          return replaceArguments({ ...event.args, text: "[redacted]" });
        }
        if (text === "abort") {
          await abort();
        }
        return undefined;
      },
    ],
    afterTool: [(event) => (event.args["text"] === "patch me" ? { content: "patched" } : undefined)],
  };
}

async function runCase(config: Json, log: (line: string) => void): Promise<Json> {
  const spec = config["case"] as Json;
  // The RPCs the driver made, by method: whether its commands went over a session.
  const calls: Record<string, number> = {};
  const counted: Interceptor = (next) => (request) => {
    calls[request.method.name] = (calls[request.method.name] ?? 0) + 1;
    return next(request);
  };
  const lanes = connectLane(config["target"] as string, { interceptors: [counted] });
  let driver: Driver | undefined = undefined;
  driver = new Driver(lanes, config["lane"] as string, [echo], {
    ...(config["session"] === false ? { session: false } : {}),
    hooks: caseHooks(async () => {
      await driver!.abort();
    }),
    settings: { toolExecution: spec["mode"] === "sequential" ? ToolExecution.SEQUENTIAL : ToolExecution.PARALLEL },
    model: new ScriptedModel(script(spec["steps"] as Json[])).model,
    log,
  });
  const result = await driver.run(`case ${spec["name"] as string}`);
  return { status: OperationResultStatus[result.status], turns: result.turns, calls };
}

/** Append one execution to the file, synced, before the effect begins. */
function recordExecution(path: string, row: Json): number {
  let attempt = 1;
  try {
    for (const line of readFileSync(path, "utf8").split("\n")) {
      if (line && (JSON.parse(line) as Json)["tool_call_id"] === row["tool_call_id"]) {
        attempt += 1;
      }
    }
  } catch {
    // no execution yet
  }
  const fd = openSync(path, "a");
  try {
    writeSync(fd, `${JSON.stringify({ ...row, attempt_no: attempt, started_at: new Date().toISOString() })}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return attempt;
}

function recordingTools(executions: string, driverId: string): AnyTool[] {
  const parameters = {
    type: "object",
    properties: {
      steps: { type: "integer", minimum: 1 },
      delay: { type: "number", minimum: 0 },
      checkpoint: { type: "boolean" },
    },
    required: ["steps", "delay"],
    additionalProperties: false,
  };
  return (["safe_read", "never_write"] as const).map((name) =>
    defineTool<{ steps: number; delay: number; checkpoint?: boolean }>({
      name,
      parameters,
      replay: name === "safe_read" ? "safe" : "never",
      async execute(args, ctx) {
        const attempt = recordExecution(executions, {
          lane_id: ctx.laneId,
          operation_id: ctx.operationId,
          tool_call_id: ctx.toolCallId,
          driver_id: driverId,
          replayed: ctx.replaying,
        });
        const report = (args.checkpoint ? ctx.checkpoint : ctx.progress).bind(ctx);
        for (let step = 1; step <= args.steps; step++) {
          await sleep(args.delay * 1000, ctx.signal);
          if (ctx.cancelled) {
            return errorResult(`${ctx.toolCallId} aborted after step ${step - 1}`);
          }
          await report(`${ctx.toolCallId} step ${step}/${args.steps}`);
        }
        return `${ctx.toolName} ${ctx.toolCallId} done (attempt ${attempt})`;
      },
    }),
  );
}

async function runCrash(config: Json, log: (line: string) => void): Promise<Json> {
  const lanes = connectLane(config["target"] as string);
  const lane = config["lane"] as string;
  const driverId = config["driverId"] as string;
  const plan = config["plan"] as Json;
  const operationId = config["operationId"] as string;
  const turns = plan["turns"] as Json[][];
  const model = new ScriptedModel(
    turns.map((calls, k) => ({
      text: `turn ${k} of ${operationId}`,
      calls: calls.map((call, index) => {
        const { name, ...args } = call;
        return { name: name as string, args, id: `${operationId}.t${k}.c${index}` };
      }),
    })),
    { finalText: `${operationId} done` },
  );
  const driver = new Driver(lanes, lane, recordingTools(config["executions"] as string, driverId), {
    driverId,
    leaseSeconds: config["leaseSeconds"] as number,
    settings: { toolExecution: plan["mode"] === "sequential" ? ToolExecution.SEQUENTIAL : ToolExecution.PARALLEL },
    model: model.model,
    retryMs: 60_000,
    log,
  });
  const result = config["recover"]
    ? await driver.recover(operationId, { waitMs: 60_000 })
    : await driver.run(`prompt ${operationId}`, { operationId });
  return { status: OperationResultStatus[result.status], turns: result.turns };
}

/** A tool that ignores the abort: after the grace period the call gets an INTERRUPTED result. */
async function runAbortGrace(config: Json, log: (line: string) => void): Promise<Json> {
  const lanes = connectLane(config["target"] as string);
  let observed = false;
  const stubborn = defineTool({
    name: "stubborn",
    parameters: { type: "object" },
    async execute(_args, ctx) {
      await ctx.checkpoint("halfway");
      ctx.signal.addEventListener("abort", () => {
        observed = true;
      });
      process.stdout.write(`${JSON.stringify({ started: ctx.toolCallId })}\n`);
      await new Promise(() => undefined); // never finishes on its own
      return "unreachable";
    },
  });
  const politeTool = defineTool({
    name: "polite",
    parameters: { type: "object" },
    async execute(_args, ctx) {
      await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
      return errorResult("stopped on the abort signal");
    },
  });
  const driver = new Driver(lanes, config["lane"] as string, [stubborn, politeTool], {
    abortGraceMs: config["graceMs"] as number,
    model: new ScriptedModel([
      { text: "two tools", calls: [{ name: "polite", args: {} }, { name: "stubborn", args: {} }, { name: "polite", args: {} }] },
    ]).model,
    settings: { toolExecution: ToolExecution.PARALLEL },
    log,
  });
  const result = await driver.run("abort me");
  return { status: OperationResultStatus[result.status], turns: result.turns, signalSeen: observed };
}

async function main(): Promise<number> {
  const config = JSON.parse(process.argv[2] ?? "{}") as Json;
  const log = (line: string): void => {
    process.stderr.write(`${new Date().toISOString()} ${line}\n`);
  };
  const kind = config["kind"];
  try {
    const result =
      kind === "case"
        ? await runCase(config, log)
        : kind === "crash"
          ? await runCrash(config, log)
          : await runAbortGrace(config, log);
    process.stdout.write(`${JSON.stringify(result)}\n`);
    return 0;
  } catch (error) {
    if (error instanceof LeaseLost) {
      log(`lease lost: ${error.message}`);
      return 3;
    }
    throw error;
  }
}

process.exitCode = await main();
// The abandoned stubborn tool keeps nothing alive that matters: leave at once.
process.exit();
