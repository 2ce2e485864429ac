// Curve Designer: control points on a log-log plot of output against input
// probability (percent). The curve drawn is evaluated by the server
// (POST /lumen/curve, sample::Pchip), so the page shows exactly what the
// sampler applies; a curve the server rejects (e.g. decreasing) is shown
// with its error and cannot be sent.
import { postJson } from './api.js';
import { h, field, loadJson, saveJson, fmtNum } from './util.js';

const SVG = 'http://www.w3.org/2000/svg';
const LO = -4; // log10 of the smallest percent shown (0.0001%)
const HI = 2; // 100%
const W = 560, HT = 420, M = { l: 56, r: 16, t: 16, b: 44 };
const IDENTITY = [[0.01, 0.01], [1, 1], [10, 10], [100, 100]];
const SAMPLES = Array.from({ length: 121 }, (_, i) => 10 ** (LO + (i * (HI - LO)) / 120));

function s(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}
const px = (lx) => M.l + ((lx - LO) / (HI - LO)) * (W - M.l - M.r);
const py = (ly) => HT - M.b - ((ly - LO) / (HI - LO)) * (HT - M.t - M.b);
const ix = (X) => LO + ((X - M.l) / (W - M.l - M.r)) * (HI - LO);
const iy = (Y) => LO + ((HT - M.b - Y) / (HT - M.t - M.b)) * (HI - LO);
const clampL = (l) => Math.min(HI, Math.max(LO, l));
const round = (v) => Number(v.toPrecision(4));

// The server's rules (sample::ValidateCurve), checked before anything is
// sent, with its wording; null when the curve is valid.
export function checkCurve(points) {
  if (points.length < 2) return `curve.points: need at least 2 points, got ${points.length}`;
  for (let i = 0; i < points.length; i++) {
    for (const [k, name] of [[0, 'x'], [1, 'y']]) {
      const v = points[i][k];
      if (!Number.isFinite(v)) return `curve.points[${i}]: ${name} must be finite, got ${v}`;
      if (!(v > 0 && v <= 100)) return `curve.points[${i}]: ${name} must be a percentage in (0, 100], got ${v}`;
    }
    if (i === 0) continue;
    if (!(points[i][0] > points[i - 1][0])) return `curve.points[${i}]: x must be strictly increasing, got ${points[i][0]} after ${points[i - 1][0]}`;
    if (points[i][1] < points[i - 1][1]) return `curve.points[${i}]: y must not decrease, got ${points[i][1]} after ${points[i - 1][1]} (the sampler needs a monotone curve)`;
  }
  return null;
}

export function curveBody(points) {
  return { points: points.map(([x, y]) => [x, y]), allow_nonmonotone: false };
}

export function mountCurve(root, ctx) {
  let points = loadJson('lumen.curve.points', IDENTITY);
  let selected = -1;
  let valid = false;
  let evalSeq = 0;
  let pending = false;

  const svg = s('svg', { viewBox: `0 0 ${W} ${HT}`, class: 'curve-plot', id: 'curve-plot', role: 'img', 'aria-label': 'Curve: output probability against input probability, log-log' });
  const grid = s('g', { class: 'grid' });
  for (let d = LO; d <= HI; d++) {
    grid.append(s('line', { x1: px(d), x2: px(d), y1: py(LO), y2: py(HI) }), s('line', { x1: px(LO), x2: px(HI), y1: py(d), y2: py(d) }));
    const lab = `${10 ** d >= 1 ? 10 ** d : (10 ** d).toFixed(-d)}%`;
    const tx = s('text', { x: px(d), y: HT - M.b + 16, 'text-anchor': 'middle' }); tx.textContent = lab;
    const ty = s('text', { x: M.l - 6, y: py(d) + 4, 'text-anchor': 'end' }); ty.textContent = lab;
    grid.append(tx, ty);
  }
  const xl = s('text', { x: (M.l + W - M.r) / 2, y: HT - 6, 'text-anchor': 'middle', class: 'axis-label' }); xl.textContent = 'input probability';
  const yl = s('text', { x: 14, y: (M.t + HT - M.b) / 2, 'text-anchor': 'middle', class: 'axis-label', transform: `rotate(-90 14 ${(M.t + HT - M.b) / 2})` }); yl.textContent = 'output probability (before normalizing)';
  grid.append(xl, yl);
  const identity = s('line', { x1: px(LO), y1: py(LO), x2: px(HI), y2: py(HI), class: 'identity' });
  const clip = s('clipPath', { id: 'curve-clip' });
  clip.append(s('rect', { x: px(LO), y: py(HI), width: px(HI) - px(LO), height: py(LO) - py(HI) }));
  const path = s('polyline', { class: 'curve', id: 'curve-line', fill: 'none', 'clip-path': 'url(#curve-clip)' });
  const dots = s('g', { class: 'points' });
  svg.append(clip, grid, identity, path, dots);

  const error = h('div', { class: 'error', role: 'alert', id: 'curve-error' });
  const table = h('table', { class: 'points-table' });
  const exportBox = h('textarea', { id: 'curve-export', rows: '7', readonly: true });

  function persist() { saveJson('lumen.curve.points', points); }

  function drawPoints() {
    dots.replaceChildren();
    points.forEach(([x, y], i) => {
      const c = s('circle', { cx: px(Math.log10(x)), cy: py(Math.log10(y)), r: 7, class: i === selected ? 'pt selected' : 'pt', tabindex: 0, 'data-index': i, role: 'slider', 'aria-label': `Point ${i + 1}: ${round(x)}% to ${round(y)}%`, 'aria-valuenow': round(y) });
      c.addEventListener('pointerdown', (e) => startDrag(e, i));
      c.addEventListener('focus', () => { selected = i; markSelected(); });
      c.addEventListener('keydown', (e) => keyMove(e, i));
      dots.append(c);
    });
  }
  function markSelected() {
    for (const c of dots.children) c.classList.toggle('selected', Number(c.dataset.index) === selected);
  }

  function drawTable() {
    table.replaceChildren(h('thead', {}, h('tr', {}, h('th', {}, '#'), h('th', {}, 'input %'), h('th', {}, 'output %'))));
    const tb = h('tbody');
    points.forEach(([x, y], i) => {
      const mk = (v, k, label) => {
        const inp = h('input', { type: 'number', step: 'any', min: '0', max: '100', value: String(round(v)), 'aria-label': label, id: `pt-${i}-${k}` });
        inp.addEventListener('change', () => {
          const n = Number(inp.value);
          if (!(n > 0 && n <= 100)) { inp.value = String(round(points[i][k])); return; }
          points[i][k] = n;
          if (k === 0) points.sort((a, b) => a[0] - b[0]);
          changed(true);
        });
        return inp;
      };
      tb.append(h('tr', { class: i === selected ? 'selected' : '' }, h('td', {}, String(i + 1)), h('td', {}, mk(x, 0, `Point ${i + 1} input percent`)), h('td', {}, mk(y, 1, `Point ${i + 1} output percent`))));
    });
    table.append(tb);
  }

  function startDrag(e, i) {
    e.preventDefault();
    selected = i;
    const c = e.target;
    c.setPointerCapture(e.pointerId);
    const rect = svg.getBoundingClientRect();
    const scale = W / rect.width;
    const move = (ev) => {
      const lx = clampL(ix((ev.clientX - rect.left) * scale));
      const ly = clampL(iy((ev.clientY - rect.top) * scale));
      let x = 10 ** lx;
      const lo = i > 0 ? points[i - 1][0] * 1.001 : 1e-4;
      const hi = i < points.length - 1 ? points[i + 1][0] / 1.001 : 100;
      x = Math.min(hi, Math.max(lo, x));
      points[i] = [round(x), round(10 ** ly)];
      c.setAttribute('cx', px(Math.log10(points[i][0])));
      c.setAttribute('cy', py(Math.log10(points[i][1])));
      changed(false);
    };
    const up = () => {
      c.removeEventListener('pointermove', move);
      c.removeEventListener('pointerup', up);
      c.removeEventListener('pointercancel', up);
      changed(true);
    };
    c.addEventListener('pointermove', move);
    c.addEventListener('pointerup', up);
    c.addEventListener('pointercancel', up);
  }

  function keyMove(e, i) {
    const step = e.shiftKey ? 0.25 : 0.05;
    const [x, y] = points[i];
    let lx = Math.log10(x), ly = Math.log10(y);
    if (e.key === 'ArrowUp') ly += step;
    else if (e.key === 'ArrowDown') ly -= step;
    else if (e.key === 'ArrowLeft') lx -= step;
    else if (e.key === 'ArrowRight') lx += step;
    else if (e.key === 'Delete' || e.key === 'Backspace') { removePoint(); return; }
    else return;
    e.preventDefault();
    const lo = i > 0 ? points[i - 1][0] * 1.001 : 1e-4;
    const hi = i < points.length - 1 ? points[i + 1][0] / 1.001 : 100;
    points[i] = [round(Math.min(hi, Math.max(lo, 10 ** clampL(lx)))), round(10 ** clampL(ly))];
    changed(true);
    dots.children[i]?.focus();
  }

  function addPoint(x, y) {
    if (x === undefined) {
      // Into the widest gap (in log x), on the current curve's straight line.
      let best = 0;
      for (let k = 1; k < points.length; k++) {
        if (Math.log10(points[k][0] / points[k - 1][0]) > Math.log10(points[best + 1][0] / points[best][0])) best = k - 1;
      }
      const [a, b] = [points[best], points[best + 1]];
      x = Math.sqrt(a[0] * b[0]);
      y = Math.sqrt(a[1] * b[1]);
    }
    if (points.some((p) => Math.abs(Math.log10(p[0] / x)) < 0.01)) return;
    points.push([round(x), round(y)]);
    points.sort((p, q) => p[0] - q[0]);
    selected = points.findIndex((p) => p[0] === round(x));
    changed(true);
  }

  function removePoint() {
    if (selected < 0 || points.length <= 2) return;
    points.splice(selected, 1);
    selected = Math.min(selected, points.length - 1);
    changed(true);
  }

  svg.addEventListener('dblclick', (e) => {
    if (e.target.tagName === 'circle') return;
    const rect = svg.getBoundingClientRect();
    const scale = W / rect.width;
    addPoint(10 ** clampL(ix((e.clientX - rect.left) * scale)), 10 ** clampL(iy((e.clientY - rect.top) * scale)));
  });

  // Redraw now; ask the server for the curve (one request in flight, the
  // latest points win).
  function changed(full) {
    if (full) { drawPoints(); drawTable(); persist(); }
    updateExport();
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; evaluate(); });
  }

  async function evaluate() {
    const seq = ++evalSeq;
    const body = { curve: curveBody(points), x: SAMPLES };
    try {
      const why = checkCurve(points);
      if (why) throw new Error(why);
      const r = await postJson('/lumen/curve', body);
      if (seq !== evalSeq) return;
      valid = true;
      error.textContent = '';
      path.setAttribute('points', r.y.map((y, k) => `${px(Math.log10(SAMPLES[k]))},${py(Math.max(LO - 1, Math.min(HI + 1, Math.log10(y))))}`).join(' '));
      path.classList.remove('invalid');
    } catch (e) {
      if (seq !== evalSeq) return;
      valid = false;
      error.textContent = `This curve cannot be sent: ${e.message}`;
      path.classList.add('invalid');
    }
    svg.classList.toggle('invalid', !valid);
    for (const b of needValid) b.disabled = !valid;
    updateExport();
  }

  function updateExport() {
    const c = curveBody(points);
    exportBox.value = valid
      ? `curve.json (lumen generate ... --curve curve.json):\n${JSON.stringify(c)}\n\nrequest field:\n"curve": ${JSON.stringify(c)}`
      : 'The curve is not valid; fix it to export.';
    download.href = valid ? `data:application/json,${encodeURIComponent(JSON.stringify(c, null, 1))}` : '#';
  }

  const download = h('a', { class: 'button', download: 'curve.json', id: 'curve-download', href: '#' }, 'Download curve.json');
  const useInChat = h('button', { type: 'button', id: 'curve-save', onclick: () => { saveJson('lumen.curve', curveBody(points)); saveStatus.textContent = 'Saved: tick "Saved curve" in the chat sampler to use it.'; } }, 'Save for chat');
  const saveStatus = h('span', { role: 'status' });

  // --- next-token distribution before / after the curve -------------------
  const prompt = field('Prompt', { tag: 'textarea', id: 'dist-prompt', rows: '2' });
  prompt.input.value = loadJson('lumen.curve.prompt', 'Once upon a time, there was a little');
  const distBtn = h('button', { type: 'button', id: 'dist-run', onclick: showDistribution }, 'Show next-token distribution');
  const distOut = h('div', { class: 'dist', id: 'dist-out', 'aria-live': 'polite' });

  const baseSampler = { temperature: 1, top_p: 1, top_k: 0, min_p: 0, repetition_penalty: 1 };

  async function topLogprobs(withCurve) {
    const body = { model: ctx.model || 'lumen', prompt: prompt.input.value, max_tokens: 1, logprobs: 20, seed: 1, ...baseSampler };
    if (withCurve) body.curve = curveBody(points);
    const r = await postJson('/v1/completions', body);
    const top = r.choices?.[0]?.logprobs?.top_logprobs?.[0] || {};
    return Object.entries(top).map(([token, lp]) => ({ token, p: Math.exp(lp) }));
  }

  const entropy = (ps) => -ps.reduce((a, { p }) => a + (p > 0 ? p * Math.log(p) : 0), 0);

  async function showDistribution() {
    saveJson('lumen.curve.prompt', prompt.input.value);
    distOut.textContent = 'Computing…';
    try {
      const [before, after] = await Promise.all([topLogprobs(false), valid ? topLogprobs(true) : Promise.resolve(null)]);
      const afterMap = new Map((after || []).map((t) => [t.token, t.p]));
      before.sort((a, b) => b.p - a.p);
      const max = Math.max(...before.map((t) => t.p), ...(after || []).map((t) => t.p), 1e-9);
      const bw = 24, gap = 8, ch = 180;
      const chart = s('svg', { viewBox: `0 0 ${before.length * (bw + gap) + 40} ${ch + 70}`, class: 'hist', id: 'dist-chart', role: 'img', 'aria-label': 'Top next tokens: probability before (blue) and after (orange) the curve' });
      before.forEach((t, k) => {
        const x0 = 30 + k * (bw + gap);
        const hb = (t.p / max) * ch, ha = ((afterMap.get(t.token) || 0) / max) * ch;
        chart.append(s('rect', { x: x0, y: ch - hb + 10, width: bw / 2, height: hb, class: 'before' }),
          s('rect', { x: x0 + bw / 2, y: ch - ha + 10, width: bw / 2, height: ha, class: 'after' }));
        const tl = s('text', { x: x0 + bw / 2, y: ch + 22, transform: `rotate(50 ${x0 + bw / 2} ${ch + 22})`, class: 'tok-label' });
        tl.textContent = JSON.stringify(t.token).slice(1, -1).slice(0, 10);
        chart.append(tl);
      });
      const rows = before.map((t) => h('tr', {}, h('td', {}, h('code', {}, JSON.stringify(t.token))), h('td', {}, `${(100 * t.p).toFixed(2)}%`), h('td', {}, after ? `${(100 * (afterMap.get(t.token) || 0)).toFixed(2)}%` : '-')));
      distOut.replaceChildren(
        h('p', { class: 'legend' }, h('span', { class: 'sw before' }), ' before (T = 1)  ', h('span', { class: 'sw after' }), ' after the curve'),
        h('p', { id: 'dist-entropy' }, `Entropy of the top ${before.length}: before ${fmtNum(entropy(before))} nats` + (after ? `, after ${fmtNum(entropy(after))} nats` : ' (curve invalid: not applied)')),
        chart,
        h('table', { class: 'tokens' }, h('thead', {}, h('tr', {}, h('th', {}, 'token'), h('th', {}, 'before'), h('th', {}, 'after'))), h('tbody', {}, rows)));
    } catch (e) {
      distOut.textContent = `Error: ${e.message}`;
    }
  }

  // --- Sample N side by side, and blind A/B --------------------------------
  const nField = field('N', { type: 'number', id: 'sample-n', min: '1', max: '8', value: '3' });
  const lenField = field('Max tokens', { type: 'number', id: 'sample-len', min: '1', max: '256', value: '40' });
  const sampleBtn = h('button', { type: 'button', id: 'sample-run', onclick: sampleN }, 'Sample N');
  const abBtn = h('button', { type: 'button', id: 'ab-run', onclick: blindAB }, 'Blind A/B');
  const samplesOut = h('div', { class: 'samples', id: 'samples-out', 'aria-live': 'polite' });
  const tally = loadJson('lumen.curve.tally', { curve: 0, default: 0 });
  const tallyView = h('span', { id: 'ab-tally' });
  const showTally = () => { tallyView.textContent = `A/B tally: curve ${tally.curve}, default ${tally.default}`; };
  showTally();
  const needValid = [sampleBtn, abBtn, useInChat];

  async function complete(n, withCurve, seed) {
    const body = { model: ctx.model || 'lumen', prompt: prompt.input.value, n, max_tokens: Number(lenField.input.value) || 40, seed, ...baseSampler };
    if (withCurve) body.curve = curveBody(points);
    const r = await postJson('/v1/completions', body);
    return r.choices.map((c) => c.text);
  }

  async function sampleN() {
    if (!valid) return;
    const n = Math.max(1, Math.min(8, Number(nField.input.value) || 1));
    const seed = Math.floor(Math.random() * 1e6);
    samplesOut.textContent = 'Sampling…';
    try {
      const [a, b] = await Promise.all([complete(n, true, seed), complete(n, false, seed)]);
      const col = (title, texts, id) => h('div', { class: 'col', id }, h('h4', {}, title), ...texts.map((t) => h('p', { class: 'sample' }, prompt.input.value, h('b', {}, t))));
      samplesOut.replaceChildren(col('With the curve', a, 'samples-curve'), col('Default (T = 1)', b, 'samples-default'));
    } catch (e) {
      samplesOut.textContent = `Error: ${e.message}`;
    }
  }

  async function blindAB() {
    if (!valid) return;
    const seed = Math.floor(Math.random() * 1e6);
    samplesOut.textContent = 'Sampling…';
    try {
      const [[c], [d]] = await Promise.all([complete(1, true, seed), complete(1, false, seed + 1)]);
      const curveFirst = Math.random() < 0.5;
      const pair = curveFirst ? [['curve', c], ['default', d]] : [['default', d], ['curve', c]];
      const pick = (k) => () => {
        tally[pair[k][0]]++;
        saveJson('lumen.curve.tally', tally);
        showTally();
        samplesOut.replaceChildren(h('p', {}, `You picked ${'AB'[k]}: it was ${pair[k][0] === 'curve' ? 'the curve' : 'the default'}.`));
      };
      samplesOut.replaceChildren(...pair.map(([, t], k) => h('div', { class: 'col' }, h('h4', {}, `Sample ${'AB'[k]}`), h('p', { class: 'sample' }, prompt.input.value, h('b', {}, t)), h('button', { type: 'button', onclick: pick(k) }, `${'AB'[k]} is better`))));
    } catch (e) {
      samplesOut.textContent = `Error: ${e.message}`;
    }
  }

  root.append(h('div', { class: 'curve-page' },
    h('section', { class: 'designer', 'aria-label': 'Curve' },
      h('h2', {}, 'Control-point curve'),
      h('p', { class: 'hint' }, 'Drag points (or focus one and use the arrow keys); double-click the plot to add a point. The line is the server\'s PCHIP curve (POST /lumen/curve).'),
      svg, error,
      h('div', { class: 'buttons' },
        h('button', { type: 'button', id: 'curve-add', onclick: () => addPoint() }, 'Add point'),
        h('button', { type: 'button', id: 'curve-remove', onclick: removePoint }, 'Remove selected point'),
        h('button', { type: 'button', id: 'curve-reset', onclick: () => { points = IDENTITY.map((p) => [...p]); selected = -1; changed(true); } }, 'Reset to identity')),
      table,
      h('h3', {}, 'Export'),
      h('label', { for: 'curve-export' }, 'Curve JSON, --curve file and request field'),
      exportBox,
      h('div', { class: 'buttons' }, download, useInChat, saveStatus)),
    h('section', { class: 'probe', 'aria-label': 'Distribution and samples' },
      h('h2', {}, 'Next-token distribution'),
      prompt.wrap, distBtn, distOut,
      h('h2', {}, 'Samples'),
      h('div', { class: 'row' }, nField.wrap, lenField.wrap, sampleBtn, abBtn, tallyView),
      samplesOut)));
  changed(true);
  return {};
}
