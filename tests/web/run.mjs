// Browser test of the web app (web/, docs/reference/web.md): starts
// `lumen serve` on the embedded model with --runs and --train-data, drives Debian's chromium
// headless through playwright-core (from web/node_modules) and checks each
// page; writes screenshots of every page into OUT_DIR.
//   node tests/web/run.mjs path/to/lumen [OUT_DIR]
// Exit 0: all passed; 1: a check failed; 77: skipped (no chromium or no
// web/node_modules), reported by ctest as a skip.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const bin = process.argv[2];
const outDir = resolve(process.argv[3] || join(tmpdir(), 'lumen-web-screenshots'));
if (!bin) {
  console.error('usage: node tests/web/run.mjs LUMEN_BINARY [OUT_DIR]');
  process.exit(2);
}
const chromiumPath = process.env.LUMEN_CHROMIUM || '/usr/bin/chromium';
if (!existsSync(chromiumPath)) {
  console.log(`skip: no chromium at ${chromiumPath} (apt-get install chromium, or set LUMEN_CHROMIUM)`);
  process.exit(77);
}
let chromium;
try {
  ({ chromium } = createRequire(join(root, 'web/package.json'))('playwright-core'));
} catch {
  console.log('skip: web/node_modules has no playwright-core (npm ci --prefix web)');
  process.exit(77);
}
mkdirSync(outDir, { recursive: true });

function startServer(args) {
  return new Promise((resolveP, reject) => {
    const p = spawn(bin, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 60000);
    p.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolveP({ proc: p, base: `http://127.0.0.1:${m[1]}`, log: () => log }); }
    });
    p.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}:\n${log}`)); });
  });
}

async function stopServer(s) {
  s.proc.removeAllListeners('exit');
  if (s.proc.exitCode !== null) return s.proc.exitCode;
  const exited = new Promise((r) => s.proc.on('exit', (code) => r(code)));
  s.proc.kill('SIGTERM');
  return exited;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// The default activation route on this CPU, as `lumen routes` resolves it:
// the bf16 prefill only where it is the faster (kernels::Bf16PrefillPays).
const defaultActRoute = /prefill products bf16/.test(execFileSync(bin, ['routes', '--for', 'serve'], { encoding: 'utf8' }))
  ? 'int8x2+bf16' : 'int8x2';
async function until(fn, what, ms = 20000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

const checks = [];
const check = (name, fn) => checks.push({ name, fn });

// --- HTTP-level checks of the serving side --------------------------------
check('http: / and assets with their content types', async ({ base }) => {
  const r = await fetch(`${base}/`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/html/);
  const html = await r.text();
  assert.match(html, /<script src="\/ui\/app.js">/);
  assert.doesNotMatch(html, /https?:\/\//, 'no external resources');
  const js = await fetch(`${base}/ui/app.js`);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  const css = await fetch(`${base}/ui/app.css`);
  assert.match(css.headers.get('content-type'), /^text\/css/);
  assert.doesNotMatch(await css.text(), /@import|url\(https?:/, 'no external fonts or styles');
});

check('http: /lumen/curve evaluates the identity and rejects a decreasing curve', async ({ base }) => {
  const post = (body) => fetch(`${base}/lumen/curve`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const ok = await post({ curve: { points: [[1, 1], [100, 100]] }, x: [0.01, 1, 50, 100] });
  assert.equal(ok.status, 200);
  const j = await ok.json();
  [0.01, 1, 50, 100].forEach((x, i) => assert.ok(Math.abs(j.y[i] - x) < 1e-9 * x, `${x} -> ${j.y[i]}`));
  const bad = await post({ curve: { points: [[1, 5], [10, 2], [100, 100]] }, x: [1] });
  assert.equal(bad.status, 400);
  const e = await bad.json();
  assert.match(e.error.message, /^curve\.points\[1\]/);
  const badX = await post({ curve: { points: [[1, 1], [100, 100]] }, x: [0] });
  assert.equal(badX.status, 400);
  assert.match((await badX.json()).error.message, /^x\[0\]/);
});

check('http: run names are confined to --runs', async ({ base }) => {
  for (const name of ['..', '%2e%2e', '..%2f..%2fetc', 'nope']) {
    const r = await fetch(`${base}/lumen/runs/${name}/events`);
    assert.ok(r.status === 404 || r.status === 400, `${name}: ${r.status}`);
  }
  const r = await fetch(`${base}/lumen/runs`);
  const j = await r.json();
  assert.ok(j.data.some((x) => x.name === 'short'), JSON.stringify(j));
});

check('http: starting a run is validated, confined and same-origin only', async ({ base, keyed }) => {
  const post = (body, headers = {}) => fetch(`${base}/lumen/runs`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const cross = await post({ name: 'x', data: 'uppercase' }, { Origin: 'http://evil.example' });
  assert.equal(cross.status, 403);
  const form = await fetch(`${base}/lumen/runs`, { method: 'POST', headers: { 'Content-Type': 'application/x-www-form-urlencoded' }, body: 'name=x&data=uppercase' });
  assert.equal(form.status, 415);
  for (const [body, param] of [[{ name: '../x', data: 'uppercase' }, 'name'], [{ name: 'x', data: '../../..' }, 'data'],
    [{ name: 'x', data: '/etc' }, 'data'], [{ name: 'x', data: 'uppercase', iters: 0 }, 'iters'], [{ name: 'x', data: 'uppercase', out: '/tmp' }, 'out'],
    [{ name: 'short', data: 'uppercase' }, 'name']]) {
    const r = await post(body);
    const e = await r.json();
    assert.ok(r.status === 400 || r.status === 409, `${JSON.stringify(body)}: ${r.status}`);
    assert.equal(e.error.param, param, JSON.stringify(e));
  }
  const del = await fetch(`${base}/lumen/runs/nope`, { method: 'DELETE' });
  assert.equal(del.status, 404);
  // The keyed server has no --train-data: refused; it serves runs/short as its adapter.
  const auth = { Authorization: 'Bearer k' };
  assert.equal((await fetch(`${keyed.base}/lumen/runs`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' })).status, 401);
  const off = await fetch(`${keyed.base}/lumen/runs`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...auth }, body: JSON.stringify({ name: 'x', data: 'uppercase' }) });
  assert.equal(off.status, 403);
  assert.match((await off.json()).error.message, /--train-data/);
  const runs = await (await fetch(`${keyed.base}/lumen/runs`, { headers: auth })).json();
  assert.equal(runs.data.find((r) => r.name === 'short').served, true);
  const info = await (await fetch(`${keyed.base}/lumen/info`, { headers: auth })).json();
  assert.equal(info.adapter, true);
  assert.equal(info.act_route, defaultActRoute);  // serve's default routes
});

// --- the pages ---------------------------------------------------------
check('chat: an answer streams in, with TTFT and tokens/s', async ({ page, base, requests }) => {
  await page.goto(`${base}/#chat`);
  await page.fill('#s-max_tokens', '60');
  await page.fill('#s-seed', '3');
  await page.fill('#chat-system', 'You tell short stories.');
  await page.fill('#chat-input', 'Tell me about Lily and the cat.');
  await page.click('#chat-send');
  await page.waitForSelector('.msg.assistant .stats', { timeout: 30000 });
  const body = requests.find((r) => r.url.endsWith('/v1/chat/completions'));
  assert.ok(body, 'a chat request was sent');
  assert.equal(body.json.stream, true);
  assert.equal(body.json.messages[0].role, 'system');
  assert.equal(body.json.max_tokens, 60);
  const text = await page.textContent('.msg.assistant .md');
  assert.ok(text.trim().length > 0, 'the answer is not empty');
  const stats = await page.textContent('.msg.assistant .stats');
  assert.match(stats, /60 tokens · TTFT \d+ ms · [\d.]+ tokens\/s/);
  // Persisted, and regenerate replaces the answer.
  const saved = await page.evaluate(() => JSON.parse(localStorage.getItem('lumen.conversations')));
  assert.equal(saved[0].messages.length, 2);
  await page.click('#chat-regen');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant .stats').length === 1 && !document.querySelector('#chat-regen').disabled);
  assert.equal(await page.locator('.msg').count(), 2);
  await page.screenshot({ path: join(outDir, 'web-chat.png') });
});

check('chat: logprobs view tints tokens and shows alternatives', async ({ page, base }) => {
  await page.goto(`${base}/#chat`);
  await page.check('#s-logprobs');
  await page.fill('#s-max_tokens', '12');
  await page.fill('#chat-input', 'Once upon a time');
  await page.click('#chat-send');
  await page.waitForSelector('.logprobs .tok');
  const title = await page.getAttribute('.logprobs .tok', 'title');
  assert.match(title, /^p = [\d.]+%\n"/);
  await page.uncheck('#s-logprobs');
});

check('chat: stop cancels the request and the server frees the slot', async ({ page, slow }) => {
  await page.goto(`${slow.base}/#chat`);
  await page.fill('#s-max_tokens', '1500');
  await page.fill('#chat-input', 'Go on');
  await page.click('#chat-send');
  await page.waitForFunction(() => (document.querySelector('.msg.assistant.streaming .md')?.textContent || '').length > 0, null, { timeout: 30000 });
  await page.click('#chat-stop');
  await page.waitForSelector('.msg.assistant .stats');
  assert.match(await page.textContent('.msg.assistant .stats'), /stopped/);
  const stats = await until(async () => {
    const s = await (await fetch(`${slow.base}/stats`)).json();
    return s.jobs.cancelled >= 1 && s.active_slots === 0 ? s : null;
  }, 'the job to be cancelled and its slot freed', 20000);
  assert.ok(stats.tokens.completion < 1500, `stopped early: ${stats.tokens.completion} tokens`);
});

check('curve: dragging a point changes the curve drawn and sent', async ({ page, base, requests }) => {
  await page.goto(`${base}/#curve`);
  await page.click('#curve-reset');
  await page.waitForFunction(() => (document.querySelector('#curve-line')?.getAttribute('points') || '').length > 0);
  const before = await page.getAttribute('#curve-line', 'points');
  const pt = page.locator('#curve-plot circle[data-index="1"]');
  const box = await pt.boundingBox();
  const cx = box.x + box.width / 2, cy = box.y + box.height / 2;
  requests.length = 0;
  await page.mouse.move(cx, cy);
  await page.mouse.down();
  for (let k = 1; k <= 6; k++) await page.mouse.move(cx, cy - 10 * k);
  await page.mouse.up();
  await page.waitForFunction((b) => document.querySelector('#curve-line').getAttribute('points') !== b, before);
  const sent = requests.filter((r) => r.url.endsWith('/lumen/curve')).at(-1);
  assert.ok(sent, 'the page asked the server for the curve');
  const p1 = sent.json.curve.points[1];
  assert.ok(Math.abs(p1[0] - 1) < 0.05, `point 1 kept its x: ${JSON.stringify(p1)}`);
  assert.ok(p1[1] > 1.5, `point 1 moved up: ${JSON.stringify(p1)}`);
  assert.equal(await page.inputValue('#pt-1-1'), String(p1[1]));
  // Sample N: both columns, and the curve the request carries is the dragged one.
  requests.length = 0;
  await page.fill('#sample-n', '2');
  await page.fill('#sample-len', '16');
  await page.click('#sample-run');
  await page.waitForFunction(() => document.querySelectorAll('#samples-curve .sample').length === 2 && document.querySelectorAll('#samples-default .sample').length === 2);
  const withCurve = requests.filter((r) => r.url.endsWith('/v1/completions') && r.json.curve);
  assert.equal(withCurve.length, 1);
  assert.deepEqual(withCurve[0].json.curve.points[1], p1);
  assert.equal(withCurve[0].json.n, 2);
  assert.match(await page.inputValue('#curve-export'), /--curve curve.json/);
});

check('curve: the distribution histogram renders before and after', async ({ page }) => {
  await page.click('#dist-run');
  await page.waitForSelector('#dist-chart rect.after');
  const bars = await page.locator('#dist-chart rect.before').count();
  assert.ok(bars >= 5, `${bars} bars`);
  assert.match(await page.textContent('#dist-entropy'), /before [\d.]+ nats, after [\d.]+ nats/);
  await page.screenshot({ path: join(outDir, 'web-curve.png'), fullPage: true });
});

check('curve: a decreasing curve says why and cannot be sent', async ({ page, requests }) => {
  requests.length = 0;
  await page.fill('#pt-2-1', '0.5');
  await page.press('#pt-2-1', 'Tab');
  await page.waitForFunction(() => document.querySelector('#curve-error').textContent.length > 0);
  assert.match(await page.textContent('#curve-error'), /cannot be sent: curve\.points\[2\]/);
  assert.ok(await page.isDisabled('#sample-run'));
  assert.ok(await page.isDisabled('#curve-save'));
  assert.ok(!requests.some((r) => r.json?.curve?.points?.[2]?.[1] === 0.5), 'the decreasing curve was never sent');
  requests.length = 0;
  await page.click('#curve-reset');
  await page.waitForFunction(() => !document.querySelector('#sample-run').disabled);
});

check('training: the watch plots a live run over server-sent events', async ({ page, base, runs }) => {
  // 1500 steps of ~12 ms on the embedded model: long enough to watch it grow
  // (40 steps finished in 0.5 s once LoRA's products were vectorized).
  const live = spawn(bin, ['train', '--data', join(root, 'tests/data/train/uppercase'), '--method', 'orpo',
    '--out', join(runs, 'live'), '--iters', '1500', '--steps-per-report', '1', '--lr', '3e-3', '-q', '-t', '1'], { stdio: 'ignore' });
  try {
    await until(() => existsSync(join(runs, 'live', 'metrics.jsonl')), 'the live run to start', 60000);
    await page.goto(`${base}/#train`);
    await page.click('#runs-refresh');
    await page.click('button[data-run="live"]');
    const n0 = await until(async () => Number(await page.getAttribute('#run-charts', 'data-points')) >= 2 && Number(await page.getAttribute('#run-charts', 'data-points')), 'two reports', 60000);
    const n1 = await until(async () => { const n = Number(await page.getAttribute('#run-charts', 'data-points')); return n > n0 && n; }, 'more reports while the run goes on', 60000);
    assert.ok(n1 > n0);
    assert.equal(await page.locator('#run-charts figure.chart').count(), 9);
    assert.equal(await page.locator('#run-charts canvas').count(), 9);
    await new Promise((r) => live.on('exit', r));
    await until(async () => Number(await page.getAttribute('#run-charts', 'data-points')) === 1500, 'all 1500 reports', 30000);
    await page.screenshot({ path: join(outDir, 'web-train.png'), fullPage: true });
  } finally {
    live.kill('SIGKILL');
  }
});

check('training: start a short run from the page and watch its charts fill', async ({ page, base, runs, requests }) => {
  await page.goto(`${base}/#train`);
  await page.waitForSelector('#train-data option[value="uppercase"]', { state: 'attached' });
  await page.fill('#train-name', 'page-short');
  await page.selectOption('#train-data', 'uppercase');
  await page.selectOption('#train-method', 'orpo');
  await page.fill('#train-iters', '15');
  await page.fill('#train-lr', '0.003');
  await page.fill('#train-batch-size', '4');
  await page.fill('#train-rank', '4');
  await page.fill('#train-steps-per-report', '1');
  await page.fill('#train-threads', '1');
  requests.length = 0;
  await page.click('#train-start');
  await until(() => requests.some((r) => r.url.endsWith('/lumen/runs') && r.json), 'the start request');
  const sent = requests.find((r) => r.url.endsWith('/lumen/runs') && r.json).json;
  assert.deepEqual({ name: sent.name, data: sent.data, method: sent.method, iters: sent.iters, lr: sent.lr, batch_size: sent.batch_size, rank: sent.rank },
    { name: 'page-short', data: 'uppercase', method: 'orpo', iters: 15, lr: 0.003, batch_size: 4, rank: 4 });
  // The page opens the run once its metrics.jsonl exists and plots all 15 reports.
  await page.waitForFunction(() => /^page-short:/.test(document.querySelector('#run-info').textContent), null, { timeout: 60000 });
  await until(async () => Number(await page.getAttribute('#run-charts', 'data-points')) === 15, 'all 15 reports of page-short', 60000);
  assert.equal(await page.locator('#run-charts canvas').count(), 9);
  await page.waitForSelector('#runs-list li[data-name="page-short"][data-state="finished"]', { timeout: 60000 });
  assert.match(await page.textContent('#runs-list li[data-name="page-short"] .job'), /finished · exit 0/);
  assert.ok(existsSync(join(runs, 'page-short', 'adapter_model.safetensors')));
  assert.ok(existsSync(join(runs, 'page-short', 'train.log')));
});

check('training: cancel a long run from the page: cancelled, with a checkpoint', async ({ page, runs }) => {
  await page.fill('#train-name', 'page-long');
  await page.fill('#train-iters', '100000');
  await page.fill('#train-save-every', '0');
  await page.click('#train-start');
  await page.waitForSelector('#runs-list li[data-name="page-long"][data-state="running"]', { timeout: 30000 });
  await page.waitForFunction(() => /^page-long:/.test(document.querySelector('#run-info').textContent), null, { timeout: 60000 });
  await until(async () => Number(await page.getAttribute('#run-charts', 'data-points')) >= 5, 'page-long to report', 60000);
  await page.waitForSelector('#runs-list li[data-name="page-long"] progress');
  await page.screenshot({ path: join(outDir, 'web-train-start.png'), fullPage: true });
  await page.click('#runs-list button[data-cancel="page-long"]');
  await page.waitForSelector('#runs-list li[data-name="page-long"][data-state="cancelled"]', { timeout: 60000 });
  const text = await page.textContent('#runs-list li[data-name="page-long"] .job');
  assert.match(text, /cancelled · exit 0 · checkpoint step-\d+/);
  assert.ok(existsSync(join(runs, 'page-long', 'checkpoints', 'latest')), 'a checkpoint was written');
  assert.ok(existsSync(join(runs, 'page-long', 'adapter_model.safetensors')));
});

check('status: model, architecture, memory and slots', async ({ page, base }) => {
  await page.goto(`${base}/#status`);
  await page.waitForFunction(() => /llama/.test(document.querySelector('#status-model')?.textContent || ''));
  const mem = await page.textContent('#status-memory');
  assert.match(mem, /weights/);
  // serve's default routes, as generate's (docs/reference/cli.md).
  await page.waitForFunction(() => /int8x2/.test(document.querySelector('#status-routes')?.textContent || ''));
  assert.match(await page.textContent('#status-routes'), new RegExp(`activation route \\(--act-route\\)${defaultActRoute.replace('+', '\\+')}.*KV cache type \\(--kv-type\\)f16`));
  assert.match(await page.textContent('#status-serving'), /slots busy \/ total0 \/ 2/);
  // Some traffic, so the tokens/s chart has something to show.
  const t0 = Date.now();
  while (Date.now() - t0 < 5000) {
    await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 200, n: 2 }) });
  }
  await sleep(2200);
  assert.match(await page.textContent('#status-serving'), /tokens\/s now[\d.]+/);
  await page.screenshot({ path: join(outDir, 'web-status.png') });
});

check('a11y: every control has a label and is reachable by keyboard', async ({ page, base }) => {
  for (const p of ['chat', 'curve', 'train', 'status']) {
    await page.goto(`${base}/#${p}`);
    await page.waitForTimeout(300);
    const unlabelled = await page.evaluate(() => [...document.querySelectorAll('input, select, textarea, button, a[href]')]
      .filter((el) => {
        const named = (el.labels && el.labels.length) || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby') || (el.tagName !== 'INPUT' && el.textContent.trim());
        return !named || el.tabIndex < 0;
      }).map((el) => el.outerHTML.slice(0, 80)));
    assert.deepEqual(unlabelled, [], `${p}: unlabelled or unreachable controls`);
  }
  await page.goto('about:blank');  // a fresh document: Tab starts at the top
  await page.goto(`${base}/#chat`);
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.dataset.page), 'chat');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.dataset.page), 'curve');
});

// --- run --------------------------------------------------------------------
const tmp = mkdtempSync(join(tmpdir(), 'lumen-web-'));
const runs = join(tmp, 'runs');
mkdirSync(runs);
let failed = 0;
let server, slow, noUi, keyed, browser;
try {
  execFileSync(bin, ['train', '--data', join(root, 'tests/data/train/uppercase'), '--method', 'orpo', '--out', join(runs, 'short'), '--iters', '10', '-q', '-t', '1'], { stdio: 'inherit' });
  // A random-weight model slow enough (~100s of tokens/s) that Stop lands mid-answer.
  execFileSync(bin, ['synth', 'tiny-llama', '--dim', '512', '--layers', '8', '--ffn', '1536', '--heads', '8', '--kv-heads', '4', '--vocab', '4000', '--ctx', '2048', '-o', join(tmp, 'slow.gguf')], { stdio: 'ignore' });
  [server, slow, noUi, keyed] = await Promise.all([
    startServer(['--runs', runs, '--train-data', join(root, 'tests/data/train'), '--parallel', '2', '-t', '1']),
    startServer([join(tmp, 'slow.gguf'), '--parallel', '1', '-t', '1']),
    startServer(['--no-ui']),
    startServer(['--api-key', 'k', '--runs', runs, '--adapter', join(runs, 'short')]),
  ]);
  // --no-ui and --api-key, over plain HTTP.
  checks.unshift({ name: 'http: --no-ui answers 404 at /; with --api-key the page is public, /lumen/* needs the key', fn: async () => {
    assert.equal((await fetch(`${noUi.base}/`)).status, 404);
    assert.equal((await fetch(`${noUi.base}/ui/app.js`)).status, 404);
    assert.equal((await fetch(`${keyed.base}/`)).status, 200);
    assert.equal((await fetch(`${keyed.base}/ui/app.js`)).status, 200);
    assert.equal((await fetch(`${keyed.base}/lumen/info`)).status, 401);
    assert.equal((await fetch(`${keyed.base}/lumen/runs`)).status, 401);
    assert.equal((await fetch(`${keyed.base}/lumen/info`, { headers: { Authorization: 'Bearer k' } })).status, 200);
  } });
  browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.setDefaultTimeout(30000);
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  // Only this server's origins: anything else would be an external resource.
  const external = [];
  const requests = [];
  page.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith('http://127.0.0.1:') && !u.startsWith('data:')) external.push(u);
    let json = null;
    try { json = JSON.parse(r.postData() || 'null'); } catch { /* not JSON */ }
    requests.push({ url: u, json });
  });
  checks.push({ name: 'no console errors and no requests to other hosts', fn: async () => {
    assert.deepEqual(consoleErrors, []);
    assert.deepEqual(external, []);
  } });
  const ctx = { page, base: server.base, slow, keyed, runs, requests };
  for (const c of checks) {
    try {
      await c.fn(ctx);
      console.log(`ok   ${c.name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${c.name}: ${e.stack ?? e}`);
      await page.screenshot({ path: join(outDir, `fail-${checks.indexOf(c)}.png`) }).catch(() => {});
    }
  }
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e.stack ?? e}`);
} finally {
  await browser?.close();
  for (const s of [server, slow, noUi, keyed]) {
    if (!s) continue;
    const code = await stopServer(s);
    if (code !== 0) { failed++; console.log(`FAIL server exit code ${code}:\n${s.log()}`); }
  }
  rmSync(tmp, { recursive: true, force: true });
}
console.log(`screenshots: ${outDir}`);
console.log(`${checks.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
