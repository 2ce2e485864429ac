// Load test for `lumen serve` (not part of ctest): C concurrent streaming chat
// clients for D seconds over loopback; every stream must end with
// finish_reason and data: [DONE] and parse as JSON throughout.
//   node tools/load_test.mjs [--url http://127.0.0.1:8080] [--clients 16]
//        [--seconds 60] [--max-tokens 64] [--api-key KEY]
// Prints requests, failures, p50/p99 time to first token and aggregate
// generated tokens/s (completion tokens from include_usage / wall time).
const args = Object.fromEntries(process.argv.slice(2).reduce((a, v, i, all) =>
  (v.startsWith("--") ? [...a, [v.slice(2), all[i + 1]]] : a), []));
const url = args.url ?? "http://127.0.0.1:8080";
const clients = Number(args.clients ?? 16);
const seconds = Number(args.seconds ?? 60);
const maxTokens = Number(args["max-tokens"] ?? 64);
const headers = { "content-type": "application/json" };
if (args["api-key"]) headers.authorization = `Bearer ${args["api-key"]}`;

const ttft = [];
let requests = 0, failures = 0, tokens = 0;
const deadline = Date.now() + seconds * 1000;
const prompts = ["Once upon a time", "The little dog", "Lily went to the park", "Tom had a red ball"];

async function one(i) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST", headers,
    body: JSON.stringify({
      messages: [{ role: "user", content: prompts[i % prompts.length] }],
      max_tokens: maxTokens, stream: true, stream_options: { include_usage: true }, seed: i,
    }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const decoder = new TextDecoder();
  let buf = "", first = true, finished = false, done = false, usage = null;
  for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ")) throw new Error(`garbled event: ${ev.slice(0, 80)}`);
      const data = ev.slice(6);
      if (data === "[DONE]") { done = true; continue; }
      const j = JSON.parse(data);  // throws on garbled JSON
      if (j.usage) usage = j.usage;
      for (const c of j.choices) {
        if (first && c.delta?.content) { ttft.push(performance.now() - t0); first = false; }
        if (c.finish_reason) finished = true;
      }
    }
  }
  if (!done || !finished || !usage) throw new Error("stream ended without finish_reason/usage/[DONE]");
  tokens += usage.completion_tokens;
}

async function worker(w) {
  let n = 0;
  while (Date.now() < deadline) {
    requests++;
    try { await one(w * 100000 + n++); } catch (e) { failures++; console.error(`client ${w}: ${e.message}`); }
  }
}

const t0 = performance.now();
await Promise.all(Array.from({ length: clients }, (_, w) => worker(w)));
const wall = (performance.now() - t0) / 1000;
ttft.sort((a, b) => a - b);
const q = (p) => (ttft.length ? ttft[Math.min(ttft.length - 1, Math.floor(p * ttft.length))] : NaN);
console.log(JSON.stringify({
  clients, seconds: Number(wall.toFixed(1)), requests, failures,
  ttft_ms_p50: Number(q(0.5).toFixed(1)), ttft_ms_p99: Number(q(0.99).toFixed(1)),
  completion_tokens: tokens, tokens_per_s: Number((tokens / wall).toFixed(1)),
}));
process.exit(failures ? 1 : 0);
