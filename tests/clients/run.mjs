// Real-client test: starts `lumen serve` (embedded model) and drives it with
// the official `openai` and `@anthropic-ai/sdk` packages; then runs the
// client-library checks (libraries.mjs: AI SDK, LangChain, Agents SDK)
// against it and against a `lumen synth tiny-qwen3` model with a ChatML
// chat template.
//   node tests/clients/run.mjs path/to/lumen
// Exits non-zero if any check failed. Needs `npm ci` in tests/clients.
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { libraryChecks } from "./libraries.mjs";

const bin = process.argv[2];
if (!bin) {
  console.error("usage: node run.mjs LUMEN_BINARY");
  process.exit(2);
}
const KEY = "client-test-key";

function startServer(extra = []) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, ["serve", ...extra, "--port", "0", "--parallel", "2", "--api-key", KEY],
                    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, LUMEN_THREADS: "1" } });
    let log = "";
    const timer = setTimeout(() => reject(new Error("server did not start:\n" + log)), 60000);
    p.stderr.on("data", (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, port: Number(m[1]), log: () => log }); }
    });
    p.on("exit", (code) => reject(new Error(`server exited ${code}:\n${log}`)));
  });
}

// A random PEFT LoRA adapter (q_proj and v_proj, rank 4) for the embedded
// stories260K (5 layers, dim 64, q 64 = 8 heads x 8, kv 32 = 4 heads x 8),
// written as adapter_config.json + adapter_model.safetensors (F32).
function writeStoryAdapter(dir) {
  mkdirSync(dir, { recursive: true });
  let seed = 12345;
  const rand = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 4294967296 * 0.4 - 0.2; };
  const r = 4, tensors = [];
  for (let l = 0; l < 5; l++) {
    for (const [mod, n] of [["q_proj", 64], ["v_proj", 32]]) {
      const name = `base_model.model.model.layers.${l}.self_attn.${mod}`;
      tensors.push([`${name}.lora_A.weight`, [r, 64]], [`${name}.lora_B.weight`, [n, r]]);
    }
  }
  const header = { __metadata__: { format: "pt" } };
  let offset = 0;
  const blobs = [];
  for (const [name, shape] of tensors) {
    const data = new Float32Array(shape[0] * shape[1]).map(rand);
    header[name] = { dtype: "F32", shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
    blobs.push(Buffer.from(data.buffer));
  }
  const h = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  writeFileSync(join(dir, "adapter_model.safetensors"), Buffer.concat([len, h, ...blobs]));
  writeFileSync(join(dir, "adapter_config.json"), JSON.stringify({
    peft_type: "LORA", r, lora_alpha: 8, target_modules: ["q_proj", "v_proj"],
    base_model_name_or_path: "stories260K",
  }));
}

const checks = [];
const check = (name, fn) => checks.push({ name, fn });

const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Weather for a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

check("openai: models.list", async ({ openai }) => {
  const page = await openai.models.list();
  assert.equal(page.data[0].id, "stories260K");
});

check("anthropic: models.list created_at is the real time", async ({ anthropic }) => {
  const page = await anthropic.models.list();
  const m = page.data[0];
  assert.equal(m.id, "stories260K");
  const t = Date.parse(m.created_at);
  assert.ok(Math.abs(t - Date.now()) < 24 * 3600 * 1000, m.created_at);
});

check("openai: chat non-streaming", async ({ openai }) => {
  const r = await openai.chat.completions.create({
    model: "stories260K", messages: [{ role: "user", content: "Once upon a time" }],
    max_tokens: 10, seed: 1,
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.equal(r.usage.completion_tokens, 10);
  assert.equal(r.choices[0].finish_reason, "length");
});

check("openai: chat streaming equals non-streaming", async ({ openai }) => {
  const req = { model: "stories260K", messages: [{ role: "user", content: "Lily" }], max_tokens: 12, seed: 5 };
  const full = await openai.chat.completions.create(req);
  const stream = await openai.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 12);
});

check("openai: tool messages round trip", async ({ openai }) => {
  const r = await openai.chat.completions.create({
    model: "stories260K", max_tokens: 4, tools,
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
        function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
      { role: "tool", tool_call_id: "call_1", content: "sunny" },
    ],
  });
  assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 10);
});

check("openai: tool_choice named streams one call (SDK assembles the deltas)", async ({ openai }) => {
  const req = {
    model: "stories260K", max_tokens: 40, seed: 3, tools,
    tool_choice: { type: "function", function: { name: "get_weather" } },
    messages: [{ role: "user", content: "Weather in Paris?" }],
  };
  const full = await openai.chat.completions.create(req);
  const call = full.choices[0].message.tool_calls[0];
  assert.equal(full.choices[0].message.tool_calls.length, 1);
  assert.equal(call.function.name, "get_weather");
  const stream = openai.chat.completions.stream(req);
  const final = await stream.finalChatCompletion();
  const got = final.choices[0].message.tool_calls;
  assert.equal(got.length, 1);
  assert.equal(got[0].id, call.id.replace(full.id, final.id));
  assert.equal(got[0].function.name, "get_weather");
  assert.equal(got[0].function.arguments, call.function.arguments);
  assert.equal(final.choices[0].finish_reason, full.choices[0].finish_reason);
  if (full.choices[0].finish_reason === "tool_calls") {
    assert.equal(typeof JSON.parse(call.function.arguments), "object");
  } else {
    assert.equal(full.choices[0].finish_reason, "length");
  }
});

check("openai: completions with logprobs", async ({ openai }) => {
  const r = await openai.completions.create({ model: "stories260K", prompt: "Once upon", max_tokens: 4, logprobs: 2, temperature: 0 });
  assert.equal(r.choices[0].logprobs.tokens.length, 4);
});

check("openai: responses with previous_response_id", async ({ openai }) => {
  const r1 = await openai.responses.create({ model: "stories260K", input: "Tell me a story.", max_output_tokens: 6 });
  assert.equal(r1.object, "response");
  assert.equal(typeof r1.output_text, "string");
  const r2 = await openai.responses.create({ model: "stories260K", input: "More.", max_output_tokens: 6, previous_response_id: r1.id });
  assert.equal(r2.previous_response_id, r1.id);
  assert.ok(r2.usage.input_tokens > r1.usage.input_tokens);
  const stream = await openai.responses.create({ model: "stories260K", input: "Hi", max_output_tokens: 5, stream: true });
  const types = [];
  let delta = "";
  let done = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") delta += ev.delta;
    if (ev.type === "response.incomplete") done = ev.response;
  }
  // max_output_tokens cut it: OpenAI ends such a stream with response.incomplete.
  assert.equal(types[0], "response.created");
  assert.equal(types.at(-1), "response.incomplete");
  assert.equal(done.status, "incomplete");
  assert.equal(done.incomplete_details.reason, "max_output_tokens");
  assert.equal(done.output[0].content[0].text, delta);
});

check("openai: errors", async ({ openai, port }) => {
  await assert.rejects(
    openai.chat.completions.create({ model: "m", messages: [{ role: "robot", content: "x" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "messages[0].role");
  await assert.rejects(
    openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "x" }], max_tokens: -1 }),
    (e) => e.status === 400 && e.param === "max_tokens");
  const bad = new OpenAI({ apiKey: "wrong", baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
});

// The server runs with --adapter story=ADAPTER_DIR. Extra body fields pass
// through both SDKs as they are.
check("openai: adapter field changes the output and equals lumen generate --adapter", async ({ openai, adapterDir }) => {
  const req = { model: "stories260K", prompt: "Once upon a time", max_tokens: 12, temperature: 0 };
  const base = await openai.completions.create(req);
  const tuned = await openai.completions.create({ ...req, adapter: "story" });
  assert.notEqual(tuned.choices[0].text, base.choices[0].text);
  const gen = execFileSync(bin, ["generate", "Once upon a time", "-n", "12", "--temp", "0", "--no-echo",
                                 "--adapter", adapterDir], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, LUMEN_THREADS: "1" } });
  assert.equal(tuned.choices[0].text.trim(), gen.trim());
  const chat = { model: "stories260K", messages: [{ role: "user", content: "Lily" }], max_tokens: 10, temperature: 0 };
  const c0 = await openai.chat.completions.create(chat);
  const c1 = await openai.chat.completions.create({ ...chat, adapter: "story" });
  assert.notEqual(c1.choices[0].message.content, c0.choices[0].message.content);
  const list = await openai.get("/adapters");
  assert.equal(list.data[0].id, "story");
  assert.equal(list.data[0].rank, 4);
  assert.deepEqual(list.data[0].targets, ["q_proj", "v_proj"]);
  await assert.rejects(
    openai.chat.completions.create({ ...chat, adapter: "nope" }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "adapter" && /'nope'/.test(e.message));
});

check("anthropic: adapter field", async ({ anthropic }) => {
  const req = { model: "stories260K", max_tokens: 10, temperature: 0, messages: [{ role: "user", content: "Lily" }] };
  const m0 = await anthropic.messages.create(req);
  const m1 = await anthropic.messages.create({ ...req, adapter: "story" });
  assert.notEqual(m1.content[0].text, m0.content[0].text);
  const stream = anthropic.messages.stream({ ...req, adapter: "story" });
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, m1.content[0].text);
  await assert.rejects(
    anthropic.messages.create({ ...req, adapter: "nope" }),
    (e) => e instanceof Anthropic.BadRequestError && /'nope'/.test(e.message));
});

check("anthropic: messages non-streaming and streaming", async ({ anthropic }) => {
  const m = await anthropic.messages.create({
    model: "stories260K", max_tokens: 8, system: "Be brief.",
    messages: [{ role: "user", content: "Hello" }],
  });
  assert.equal(m.type, "message");
  assert.equal(m.content[0].type, "text");
  assert.equal(m.stop_reason, "max_tokens");
  assert.equal(m.usage.output_tokens, 8);
  const stream = anthropic.messages.stream({
    model: "stories260K", max_tokens: 8, messages: [{ role: "user", content: "Hello" }],
  });
  let text = "";
  stream.on("text", (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, text);
  assert.equal(final.stop_reason, "max_tokens");
});

check("anthropic: tool_use / tool_result round trip", async ({ anthropic }) => {
  const m = await anthropic.messages.create({
    model: "stories260K", max_tokens: 4,
    tools: [{ name: "get_weather", description: "Weather", input_schema: { type: "object", properties: { city: { type: "string" } } } }],
    messages: [
      { role: "user", content: "Weather?" },
      { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny" }] },
    ],
  });
  assert.equal(m.type, "message");
});

check("anthropic: tool_choice any streams one tool_use block", async ({ anthropic }) => {
  const stream = anthropic.messages.stream({
    model: "stories260K", max_tokens: 30,
    tools: [{ name: "get_weather", description: "Weather", input_schema: { type: "object" } },
            { name: "search", description: "Search", input_schema: { type: "object" } }],
    tool_choice: { type: "any" },
    messages: [{ role: "user", content: "Weather?" }],
  });
  const m = await stream.finalMessage();
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, "tool_use");
  assert.ok(["get_weather", "search"].includes(m.content[0].name));
  assert.ok(["tool_use", "max_tokens"].includes(m.stop_reason));
});

check("anthropic: errors", async ({ anthropic }) => {
  await assert.rejects(
    anthropic.messages.create({ model: "m", messages: [{ role: "user", content: "x" }], max_tokens: 0 }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && /max_tokens/.test(e.message));
});

async function runChecks(list, server, ctx) {
  let failed = 0;
  for (const c of list) {
    try {
      await c.fn(ctx);
      console.log(`ok   ${c.name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${c.name}: ${e.stack ?? e}`);
    }
  }
  server.proc.removeAllListeners("exit");
  const exited = new Promise((r) => server.proc.on("exit", (code) => r(code)));
  server.proc.kill("SIGTERM");
  const code = await exited;
  if (code !== 0) { failed++; console.log(`FAIL server exit code ${code}:\n${server.log()}`); }
  return failed;
}

const libs = [];
libraryChecks((name, fn) => libs.push({ name, fn }));
let failed = 0, total = 0;

// The SDKs' defaults ask for more tokens than these small contexts hold (the
// Anthropic provider sends max_tokens 4096, generateObject 300 against 256):
// sections 1 and 2 run with --clamp-max-tokens (llama-server's rule), section
// 3 with the default refusal, which it checks as the SDKs report it.

// 1. The embedded stories260K with a mounted adapter: SDK checks, then the libraries.
{
  const adapterDir = mkdtempSync(join(tmpdir(), "lumen-clients-adapter-"));
  writeStoryAdapter(adapterDir);
  const server = await startServer(["--adapter", `story=${adapterDir}`, "--clamp-max-tokens"]);
  const base = `http://127.0.0.1:${server.port}`;
  const openai = new OpenAI({ apiKey: KEY, baseURL: `${base}/v1`, maxRetries: 0 });
  const anthropic = new Anthropic({ apiKey: KEY, baseURL: base, maxRetries: 0 });
  const all = [...checks, ...libs.map((c) => ({ ...c, name: `[stories260K] ${c.name}` }))];
  total += all.length;
  failed += await runChecks(all, server, { openai, anthropic, port: server.port, base, key: KEY, model: "stories260K", adapterDir });
  rmSync(adapterDir, { recursive: true, force: true });
}

// 2. A synth tiny-qwen3 (random weights, ChatML template): the libraries.
{
  const dir = mkdtempSync(join(tmpdir(), "lumen-clients-"));
  try {
    execFileSync(bin, ["synth", "tiny-qwen3", "--format", "hf", "-o", join(dir, "m")], { stdio: "ignore" });
    const server = await startServer([join(dir, "m"), "--alias", "tiny-qwen3", "--clamp-max-tokens"]);
    const base = `http://127.0.0.1:${server.port}`;
    const all = libs.map((c) => ({ ...c, name: `[tiny-qwen3] ${c.name}` }));
    total += all.length;
    failed += await runChecks(all, server, { port: server.port, base, key: KEY, model: "tiny-qwen3" });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
// 3. A synth embedding model (tiny-qwen3, last-token pooling): the OpenAI
// SDK's embeddings.create, and admission errors as the SDKs see them.
{
  const dir = mkdtempSync(join(tmpdir(), "lumen-clients-emb-"));
  try {
    execFileSync(bin, ["synth", "tiny-qwen3", "--format", "hf", "--pooling", "last", "-o", join(dir, "m")],
                 { stdio: "ignore" });
    const server = await startServer([join(dir, "m"), "--alias", "tiny-embed", "--ctx", "128"]);
    const base = `http://127.0.0.1:${server.port}`;
    const openai = new OpenAI({ apiKey: KEY, baseURL: `${base}/v1`, maxRetries: 0 });
    const anthropic = new Anthropic({ apiKey: KEY, baseURL: base, maxRetries: 0 });
    const input = ["The cat sat on the mat.", "A quick brown fox"];
    const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
    const emb = [
      { name: "[tiny-embed] openai: embeddings.create float", fn: async () => {
        const r = await openai.embeddings.create({ model: "tiny-embed", input, encoding_format: "float" });
        assert.equal(r.object, "list");
        assert.equal(r.data.length, 2);
        for (const [i, d] of r.data.entries()) {
          assert.equal(d.index, i);
          assert.equal(d.embedding.length, 64);
          assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5, String(norm(d.embedding)));
        }
        assert.ok(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens);
      } },
      { name: "[tiny-embed] openai: base64 decodes to the float vectors", fn: async () => {
        const f = await openai.embeddings.create({ model: "tiny-embed", input, encoding_format: "float" });
        const b = await openai.embeddings.create({ model: "tiny-embed", input, encoding_format: "base64" });
        // The SDK's default asks for base64 and decodes it to numbers itself.
        const d = await openai.embeddings.create({ model: "tiny-embed", input });
        for (let i = 0; i < 2; i++) {
          const buf = Buffer.from(b.data[i].embedding, "base64");
          const got = Array.from(new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4));
          assert.deepEqual(got, f.data[i].embedding);
          assert.deepEqual(Array.from(d.data[i].embedding), f.data[i].embedding);
        }
      } },
      { name: "[tiny-embed] openai: dimensions truncates and re-normalizes", fn: async () => {
        const r = await openai.embeddings.create({ model: "tiny-embed", input: "x", dimensions: 16, encoding_format: "float" });
        assert.equal(r.data[0].embedding.length, 16);
        assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
        await assert.rejects(
          openai.embeddings.create({ model: "tiny-embed", input: "x", dimensions: 65 }),
          (e) => e.status === 400 && e.param === "dimensions");
      } },
      { name: "[tiny-embed] admission: context_length_exceeded in both SDKs", fn: async () => {
        await assert.rejects(
          openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
          (e) => e.status === 400 && e.code === "context_length_exceeded" && e.param === "max_tokens");
        await assert.rejects(
          anthropic.messages.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 1000 }),
          (e) => e instanceof Anthropic.BadRequestError && /more than the context \(128 tokens\)/.test(e.message));
      } },
    ];
    total += emb.length;
    failed += await runChecks(emb, server, {});
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
console.log(failed ? `${failed} failed` : `all ${total} client checks passed`);
process.exit(failed ? 1 : 0);
