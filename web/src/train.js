// Training watch: runs under `lumen serve --runs DIR`; the selected run's
// metrics.jsonl arrives over server-sent events (GET /lumen/runs/{name}/events)
// and feeds one uPlot chart per metric.
import uPlot from 'uplot';
import { getJson, streamEvents } from './api.js';
import { h, fmtNum } from './util.js';

const METRICS = [
  ['loss', 'loss'], ['nll', 'NLL'], ['l_w', 'l_w (chosen)'], ['l_r', 'l_r (rejected)'],
  ['margin', 'margin'], ['accuracy', 'accuracy'], ['lambda', 'lambda'], ['lr', 'learning rate'],
  ['tokens_per_s', 'tokens/s'],
];

export function mountTrain(root) {
  const runsList = h('ul', { class: 'runs', id: 'runs-list', 'aria-label': 'Runs' });
  const info = h('div', { class: 'run-info', id: 'run-info', role: 'status' });
  const charts = h('div', { class: 'charts', id: 'run-charts' });
  let controller = null;
  let plots = {};
  let data = null;
  let selected = '';
  let timer = 0;

  async function refresh() {
    try {
      const r = await getJson('/lumen/runs');
      if (!r.runs_dir) {
        runsList.replaceChildren(h('li', {}, 'No runs directory: start the server with --runs DIR (each subdirectory with a metrics.jsonl is a run, e.g. a lumen train --out).'));
        return;
      }
      if (!r.data.length) {
        runsList.replaceChildren(h('li', {}, `No runs under ${r.runs_dir} yet.`));
        return;
      }
      runsList.replaceChildren(...r.data.map((run) => {
        const live = run.seconds_since_update < 30;
        return h('li', { class: run.name === selected ? 'active' : '' },
          h('button', { type: 'button', class: 'link', 'data-run': run.name, onclick: () => open(run.name) }, run.name),
          h('span', { class: 'meta' }, ` ${run.method || ''} · ${run.reports} reports${run.last ? ` · step ${run.last.step}` : ''}${live ? ' · live' : ''}`));
      }));
    } catch (e) {
      runsList.replaceChildren(h('li', { class: 'error' }, `Error: ${e.message}`));
    }
  }

  function makePlots() {
    charts.replaceChildren();
    plots = {};
    data = { step: [], eval: [], control: [] };
    for (const [k] of METRICS) data[k] = [];
    const width = Math.max(260, Math.min(420, Math.floor((charts.clientWidth || 900) / 3) - 30));
    for (const [k, label] of METRICS) {
      const box = h('figure', { class: 'chart', 'data-metric': k }, h('figcaption', {}, label));
      charts.append(box);
      // The lambda controller's changes ("kind": "control" lines, or a new
      // "phase" in the reports) as dashed vertical lines on the lambda chart.
      const hooks = k !== 'lambda' ? {} : { draw: [(u) => {
        const c = u.ctx;
        c.save();
        c.strokeStyle = '#dc2626';
        c.setLineDash([4, 3]);
        for (const ev of data.control) {
          const x = Math.round(u.valToPos(ev.step, 'x', true));
          c.beginPath(); c.moveTo(x, u.bbox.top); c.lineTo(x, u.bbox.top + u.bbox.height); c.stroke();
        }
        c.restore();
      }] };
      plots[k] = new uPlot({
        width, height: 170, hooks,
        legend: { show: false },
        scales: { x: { time: false } },
        axes: [{ label: 'step', size: 30 }, { size: 56 }],
        series: [{ label: 'step' }, { label, stroke: '#3b82f6', width: 1.5, points: { show: true, size: 4 } }],
      }, [[], []], box);
    }
  }

  function addReport(j) {
    if (j.kind === 'control') data.control.push(j);
    if (j.kind !== 'train') {
      if (j.kind === 'eval') data.eval.push(j);
      return;
    }
    if (j.phase && data.lastPhase && j.phase !== data.lastPhase && !data.control.some((c) => c.step === j.step)) data.control.push({ step: j.step, phase: j.phase });
    if (j.phase) data.lastPhase = j.phase;
    data.step.push(j.step);
    for (const [k] of METRICS) data[k].push(typeof j[k] === 'number' ? j[k] : null);
  }

  function redraw() {
    for (const [k] of METRICS) plots[k].setData([data.step, data[k]]);
    const last = data.step.length ? data.step.at(-1) : null;
    const lastEval = data.eval.at(-1);
    info.textContent = `${selected}: ${data.step.length} reports${last !== null ? `, last step ${last}, loss ${fmtNum(data.loss.at(-1))}` : ''}` +
      (lastEval ? `; eval loss ${fmtNum(lastEval.loss)}` : '') +
      (data.control.length ? `; lambda controller: ${data.control.map((c) => `step ${c.step} ${c.phase || ''}`).join(', ')}` : '');
    charts.dataset.points = String(data.step.length);
  }

  async function open(name) {
    controller?.abort();
    selected = name;
    controller = new AbortController();
    makePlots();
    refresh();
    let queued = false;
    try {
      await streamEvents(`/lumen/runs/${encodeURIComponent(name)}/events`, {
        signal: controller.signal,
        onEvent: (d) => {
          try { addReport(JSON.parse(d)); } catch { return; }
          if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; redraw(); }); }
        },
      });
    } catch (e) {
      if (e.name !== 'AbortError') info.textContent = `Error: ${e.message}`;
    }
  }

  root.append(h('div', { class: 'train-page' },
    h('aside', { class: 'sidebar' }, h('h2', {}, 'Runs'), h('button', { type: 'button', id: 'runs-refresh', onclick: refresh }, 'Refresh'), runsList),
    h('section', { class: 'watch', 'aria-label': 'Metrics' }, info, charts)));
  refresh();
  timer = setInterval(refresh, 5000);
  return { stop: () => { controller?.abort(); clearInterval(timer); } };
}
