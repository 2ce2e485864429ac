// Client libraries people build on, driven against `lumen serve` unmodified:
// the Vercel AI SDK (ai, @ai-sdk/openai, @ai-sdk/anthropic), LangChain JS
// (@langchain/openai) and the OpenAI Agents SDK (@openai/agents). Every
// structured output is checked against the JSON Schema the library sent, with
// ajv (an independent validator), and each library's own parse must succeed.
import assert from "node:assert/strict";
import Ajv from "ajv";
import Ajv2020 from "ajv/dist/2020.js";
import OpenAI from "openai";
import { z } from "zod";
import { generateObject, generateText, Output } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { ChatOpenAI } from "@langchain/openai";
import { Agent, OpenAIProvider, Runner, setTracingDisabled } from "@openai/agents";

// Records every request body (parsed) that a library sends, so a test can
// assert what went over the wire and validate replies against that schema.
export function recordingFetch() {
  const bodies = [];
  const f = async (url, init) => {
    if (init?.body && typeof init.body === "string") {
      try { bodies.push({ url: String(url), body: JSON.parse(init.body) }); } catch { /* not JSON */ }
    }
    return fetch(url, init);
  };
  f.bodies = bodies;
  return f;
}

// A schema whose every value is short (bounded strings, enums, ranges), so a
// random-weight model finishes it within the token budget.
const weather = z.object({
  city: z.string().max(10),
  sunny: z.boolean(),
  temperature: z.number().int().min(-40).max(50),
  kind: z.enum(["rain", "snow", "clear"]),
  tags: z.array(z.string().max(4)).max(2),
  note: z.string().max(6).nullable(),
});

function validate(schema, value, where) {
  // The draft the library declared ($schema), draft-07 otherwise.
  const Draft = /2020-12/.test(schema.$schema ?? "") ? Ajv2020 : Ajv;
  const ajv = new Draft({ strict: false, allErrors: true });
  const ok = ajv.validate(schema, value);
  assert.ok(ok, `${where}: ${JSON.stringify(value)} fails its schema: ${ajv.errorsText()}`);
}

// The schema a request carried: chat response_format or Responses text.format.
function sentSchema(body) {
  if (body.response_format?.type === "json_schema") return body.response_format.json_schema.schema;
  if (body.text?.format?.type === "json_schema") return body.text.format.schema;
  throw new Error(`no json_schema in ${JSON.stringify(body).slice(0, 300)}`);
}

export function libraryChecks(check) {
  check("ai-sdk: generateObject on chat completions (json_schema)", async ({ base, model, key }) => {
    const rec = recordingFetch();
    const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key, fetch: rec });
    const { object, finishReason } = await generateObject({
      model: openai.chat(model), schema: weather, prompt: "Weather in Paris as JSON.",
      maxOutputTokens: 300, seed: 1, maxRetries: 0,
    });
    assert.equal(finishReason, "stop");
    const body = rec.bodies.at(-1).body;
    assert.equal(body.response_format.type, "json_schema");
    validate(sentSchema(body), object, "generateObject");
    assert.ok(["rain", "snow", "clear"].includes(object.kind));
  });

  check("ai-sdk: generateText + Output.object on Responses (text.format json_schema)",
    async ({ base, model, key }) => {
      const rec = recordingFetch();
      const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key, fetch: rec });
      const r = await generateText({
        model: openai.responses(model), output: Output.object({ schema: weather }),
        prompt: "Weather in Oslo as JSON.", maxOutputTokens: 300, seed: 2, maxRetries: 0,
      });
      const body = rec.bodies.at(-1).body;
      assert.ok(rec.bodies.at(-1).url.endsWith("/responses"));
      assert.equal(body.text.format.type, "json_schema");
      validate(sentSchema(body), r.output, "Output.object");
      validate(sentSchema(body), JSON.parse(r.text), "Output.object text");
    });

  check("langchain: withStructuredOutput (default method: json_schema)", async ({ base, model, key }) => {
    const rec = recordingFetch();
    const llm = new ChatOpenAI({
      model, apiKey: key, maxTokens: 300, maxRetries: 0, seed: 3,
      configuration: { baseURL: `${base}/v1`, fetch: rec },
    });
    const structured = llm.withStructuredOutput(weather);
    const out = await structured.invoke("Weather in Rome as JSON.");
    const body = rec.bodies.at(-1).body;
    assert.equal(body.response_format.type, "json_schema");
    validate(sentSchema(body), out, "withStructuredOutput");
    assert.equal(typeof out.sunny, "boolean");
  });

  check("ai-sdk: unsupported schema keyword is a 400 naming it", async ({ base, model, key }) => {
    const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key });
    await assert.rejects(
      generateObject({
        model: openai.chat(model), schema: z.object({ mail: z.string().email() }),
        prompt: "x", maxOutputTokens: 20, maxRetries: 0,
      }),
      (e) => e.statusCode === 400 && /properties\.mail\.(format|pattern)/.test(e.message));
  });

  check("ai-sdk: Responses multi-turn sends item_reference, lumen resolves it",
    async ({ base, model, key }) => {
      const rec = recordingFetch();
      const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key, fetch: rec });
      const messages = [{ role: "user", content: "Tell me a story." }];
      const r1 = await generateText({ model: openai.responses(model), messages, maxOutputTokens: 8, seed: 4 });
      messages.push(...r1.response.messages, { role: "user", content: "And then?" });
      const r2 = await generateText({ model: openai.responses(model), messages, maxOutputTokens: 8, seed: 4 });
      const input = rec.bodies.at(-1).body.input;
      const ref = input.find((i) => i.type === "item_reference");
      assert.ok(ref, `no item_reference in ${JSON.stringify(input)}`);
      assert.match(ref.id, /^msg_/);
      assert.equal(typeof r2.text, "string");
      // The referenced reply is part of the second prompt.
      assert.ok(r2.usage.inputTokens > r1.usage.inputTokens + r1.usage.outputTokens,
        `${r2.usage.inputTokens} vs ${r1.usage.inputTokens} + ${r1.usage.outputTokens}`);
    });

  check("ai-sdk: Anthropic provider with its default max_tokens", async ({ base, model, key }) => {
    const rec = recordingFetch();
    const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: key, fetch: rec });
    const r = await generateText({ model: anthropic(model), prompt: "Hello", maxRetries: 0, seed: 5 });
    const body = rec.bodies.at(-1).body;
    assert.ok(body.max_tokens >= 4096, `max_tokens ${body.max_tokens}`);
    assert.ok(["length", "stop"].includes(r.finishReason), r.finishReason);
    assert.ok(r.usage.outputTokens > 0);
  });

  check("agents: a basic Agent run (Responses)", async ({ base, model, key }) => {
    const rec = recordingFetch();
    setTracingDisabled(true);
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, fetch: rec, maxRetries: 0 });
    const runner = new Runner({
      modelProvider: new OpenAIProvider({ openAIClient: client, useResponses: true }),
      tracingDisabled: true,
    });
    const agent = new Agent({
      name: "Storyteller", instructions: "Tell short stories.", model,
      modelSettings: { maxTokens: 12, temperature: 0.8 },
    });
    const result = await runner.run(agent, "Once upon a time");
    assert.equal(typeof result.finalOutput, "string");
    assert.ok(rec.bodies.some((b) => b.url.endsWith("/responses")));
  });
}
