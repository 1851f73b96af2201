/**
 * An agent run through the lane service from TypeScript: a scripted model asks for two real
 * tools at once, a shell command and a file read; the Driver runs them in parallel and commits
 * every step, so `lane watch LANE_ID` or the web view shows the run live, and a second
 * `agent.ts` would take it over if this one died.
 *
 *     npx tsx examples/agent.ts [LANE_ID] [host:port]      # default 127.0.0.1:50051
 *
 * `LANE_TOKEN` is sent as the bearer token when set.
 */
import { exec } from "node:child_process";
import { readFile } from "node:fs/promises";
import { Driver, OperationResultStatus, ScriptedModel, connectLane, defineTool, errorResult } from "../src/index.js";

const laneId = process.argv[2] ?? `agent-${Date.now()}`;
const target = process.argv[3] ?? "127.0.0.1:50051";

/** Runs a shell command; never replayed after a crash (its effect may not be repeatable). */
const shell = defineTool<{ command: string }>({
  name: "shell",
  description: "Run a shell command and return its output.",
  parameters: {
    type: "object",
    properties: { command: { type: "string", minLength: 1 } },
    required: ["command"],
    additionalProperties: false,
  },
  replay: "never",
  execute: (args, ctx) =>
    new Promise((resolve) => {
      const child = exec(args.command, { signal: ctx.signal, timeout: 60_000 }, (error, stdout, stderr) => {
        const output = `${stdout}${stderr}`.trimEnd();
        resolve(error ? errorResult(`${error.message}\n${output}`.trim()) : output || "(no output)");
      });
      child.stdout?.once("data", () => void ctx.progress("running…").catch(() => undefined));
    }),
});

/** Reads a text file; safe to run again after a crash. */
const readTextFile = defineTool<{ path: string; maxBytes?: number }>({
  name: "read_file",
  description: "Read a text file.",
  parameters: {
    type: "object",
    properties: { path: { type: "string" }, maxBytes: { type: "integer", minimum: 1 } },
    required: ["path"],
    additionalProperties: false,
  },
  replay: "safe",
  async execute(args) {
    const text = await readFile(args.path, { encoding: "utf8" });
    const limit = args.maxBytes ?? 4000;
    return { content: text.slice(0, limit), details: { bytes: text.length, truncated: text.length > limit } };
  },
});

const model = new ScriptedModel(
  [
    {
      text: "Let me look at the machine and the package at once.",
      calls: [
        { name: "shell", args: { command: "uname -a && sleep 2 && ls" } },
        { name: "read_file", args: { path: "package.json", maxBytes: 400 } },
      ],
    },
  ],
  { finalText: "Both tools answered; done." },
);

const lanes = connectLane(target, { token: process.env["LANE_TOKEN"] || undefined });
const driver = new Driver(lanes, laneId, [shell, readTextFile], {
  model: model.model,
  abortGraceMs: 5_000,
  log: (line) => console.error(line),
});
console.error(`driving lane ${laneId} at ${target}: lane watch ${laneId}`);
const result = await driver.run("What machine is this, and which package is here?");
console.log(`run ${result.operationId} ended ${OperationResultStatus[result.status]} after ${result.turns} turns`);
process.exit(result.status === OperationResultStatus.COMPLETED ? 0 : 1);
