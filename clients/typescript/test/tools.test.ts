import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { LaneError, Reason, reasonName } from "../src/errors.js";
import { isRetryable, withRetries } from "../src/commands.js";
import { AgentMessageSchema, ToolResultSchema, UsageSchema } from "../src/gen/lane/v1/messages_pb.js";
import { ScriptedModel } from "../src/model.js";
import { defineTool, toResultProto } from "../src/tools.js";

const tool = defineTool({
  name: "echo",
  parameters: {
    type: "object",
    properties: { text: { type: "string" }, n: { type: "integer", minimum: 1 } },
    required: ["text"],
    additionalProperties: false,
  },
  execute: async () => "",
});

describe("Tool.validate (Ajv)", () => {
  it("accepts arguments that match and says where others do not", () => {
    assert.equal(tool.validate({ text: "hi", n: 2 }), undefined);
    assert.equal(tool.validate({ text: 5 }), "invalid arguments for tool echo at /text: must be string");
    assert.match(tool.validate({}) ?? "", /^invalid arguments for tool echo: must have required property 'text'$/);
    assert.equal(tool.validate([]), "arguments of tool echo must be a JSON object");
  });

  it("refuses a schema that is not one when the tool is declared", () => {
    assert.throws(() => defineTool({ name: "bad", parameters: { type: "nonsense" }, execute: async () => "" }));
    assert.throws(() => defineTool({ name: "", parameters: { type: "object" }, execute: async () => "" }));
  });

  it("takes draft-07 schemas by their $schema", () => {
    const old = defineTool({
      name: "old",
      parameters: { $schema: "http://json-schema.org/draft-07/schema#", type: "object", items: [{ type: "string" }] },
      execute: async () => "",
    });
    assert.equal(old.validate({}), undefined);
  });
});

describe("toResultProto", () => {
  it("normalizes like the service: absent stays absent, terminate only when true", () => {
    const { result, isError } = toResultProto("plain");
    assert.equal(isError, false);
    assert.deepEqual(result.content.map((b) => b.block.value), [create(ToolResultSchema, { content: [{ block: { case: "text", value: { text: "plain" } } }] }).content[0]!.block.value]);
    assert.equal(result.detailsJson, undefined);
    assert.equal(result.usage, undefined);
    assert.equal(result.terminate, false);
  });

  it("keeps details as JSON text, usage, error flag and terminate", () => {
    const usage = create(UsageSchema, { input: 3n });
    const { result, isError } = toResultProto({ content: ["a", "b"], details: { n: 1 }, usage, isError: true, terminate: true });
    assert.equal(isError, true);
    assert.deepEqual(result.content.map((b) => (b.block.case === "text" ? b.block.value.text : "")), ["a", "b"]);
    assert.equal(result.detailsJson, '{"n":1}');
    assert.equal(result.usage?.input, 3n);
    assert.equal(result.terminate, true);
  });
});

describe("ScriptedModel", () => {
  const user = create(AgentMessageSchema, { message: { case: "user", value: {} } });
  const assistant = create(AgentMessageSchema, { message: { case: "assistant", value: {} } });
  it("answers the step the transcript is at, so a takeover picks up where it was", () => {
    const model = new ScriptedModel([{ text: "one" }, { text: "two" }]);
    assert.equal(model.stepIndex([user]), 0);
    assert.equal(model.stepIndex([user, assistant]), 1);
    assert.equal(model.stepIndex([user, assistant, assistant, user]), 0);
  });
});

describe("commands", () => {
  const refusal = (code: Code, reason: Reason): LaneError => new LaneError({ code, message: "no", reason: reasonName(reason) });

  it("retries only what left nothing written", () => {
    assert.equal(isRetryable(new LaneError({ code: Code.Unavailable, message: "down" })), true);
    assert.equal(isRetryable(refusal(Code.ResourceExhausted, Reason.DATABASE_BUSY)), true);
    assert.equal(isRetryable(refusal(Code.ResourceExhausted, Reason.TOO_MANY_WATCHERS)), false);
    assert.equal(isRetryable(refusal(Code.Aborted, Reason.STALE_LEASE)), false);
  });

  it("sends again after a retryable failure and gives up on any other", async () => {
    let attempts = 0;
    const answer = await withRetries(async () => {
      attempts += 1;
      if (attempts < 3) {
        throw new LaneError({ code: Code.Unavailable, message: "down" });
      }
      return "ok";
    }, { initialMs: 1, maxMs: 2 });
    assert.deepEqual([answer, attempts], ["ok", 3]);
    attempts = 0;
    await assert.rejects(
      withRetries(async () => {
        attempts += 1;
        throw refusal(Code.Aborted, Reason.STALE_LEASE);
      }),
      (error: LaneError) => error.reasonCode === Reason.STALE_LEASE,
    );
    assert.equal(attempts, 1);
  });
});
