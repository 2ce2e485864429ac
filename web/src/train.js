// Training watch: runs under `lumen serve --runs DIR`; the selected run's
// metrics.jsonl arrives over server-sent events (GET /lumen/runs/{name}/events)
// and feeds one uPlot chart per metric. With `--train-data DIR` the form starts
// a run (POST /lumen/runs: `lumen train` as a background job of the server),
// the list shows each job's state and progress, and Cancel sends it SIGINT
// (DELETE /lumen/runs/{name}: the trainer checkpoints and exits 0).
import uPlot from 'uplot';
import { getJson, postJson, deleteJson, streamEvents } from './api.js';
import { h, field, fmtNum, loadJson, saveJson } from './util.js';

const METHODS = ['sft', 'dpo', 'orpo', 'simpo', 'ipo', 'hinge'];
// Form fields sent as numbers: [request field, label, input attributes, default].
const NUM_FIELDS = [
  ['iters', 'Iterations', { min: '1', step: '1' }, '30'],
  ['lr', 'Learning rate', { min: '0', step: 'any' }, '0.003'],
  ['batch_size', 'Batch size', { min: '1', step: '1' }, '4'],
  ['rank', 'LoRA rank', { min: '1', step: '1' }, '8'],
  ['lambda', 'Lambda (ORPO)', { min: '0', step: 'any' }, '0.1'],
  ['steps_per_report', 'Report every (steps)', { min: '1', step: '1' }, '1'],
  ['save_every', 'Checkpoint every (steps, 0: at the end / on cancel)', { min: '0', step: '1' }, '0'],
  ['threads', 'Threads (empty: all cores)', { min: '1', step: '1' }, ''],
];

function defaultName() {
  const d = new Date();
  const p = (n) => String(n).padStart(2, '0');
  return `run-${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}

// "running 12 / 30", "cancelled · exit 0 · checkpoint step-00000012", ...
function jobText(job, run) {
  const step = run?.last?.step;
  const iters = job.params?.iters;
  if (job.state === 'running') {
    const prog = step !== undefined ? ` ${step}${iters ? ` / ${iters}` : ''}` : ' (starting)';
    return `${job.cancel_requested ? 'cancelling' : 'running'}${prog}`;
  }
  const parts = [job.state];
  if (job.exit_code !== null) parts.push(`exit ${job.exit_code}`);
  if (job.signal !== null) parts.push(`signal ${job.signal}`);
  if (job.checkpoint) parts.push(`checkpoint ${job.checkpoint}`);
  return parts.join(' · ');
}

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
  let ticks = 0;
  let active = false;      // a job runs or a started run waits for its metrics: poll every second
  let pendingOpen = '';    // a run started from the form, opened once its metrics.jsonl exists
  const items = new Map();  // run name -> its row in the list

  // --- the start form -------------------------------------------------------
  const saved = loadJson('lumen.trainForm', {});
  const form = h('form', { class: 'train-form', id: 'train-form', 'aria-label': 'Start a training run' });
  const name = field('Run name', { id: 'train-name', value: defaultName(), required: true, maxlength: '200' });
  const dataSel = field('Data directory', { tag: 'select', id: 'train-data' });
  const method = field('Method', { tag: 'select', id: 'train-method' });
  for (const m of METHODS) method.input.append(h('option', { value: m, selected: m === (saved.method || 'orpo') }, m));
  const schedule = field('Lambda schedule', { tag: 'select', id: 'train-schedule' });
  for (const m of ['static', 'adaptive']) schedule.input.append(h('option', { value: m, selected: m === (saved.lambda_schedule || 'static') }, m));
  const nums = NUM_FIELDS.map(([k, label, attrs, dflt]) => [k, field(label, { type: 'number', ...attrs, id: `train-${k.replace(/_/g, '-')}`, value: String(saved[k] ?? dflt) })]);
  const startBtn = h('button', { type: 'submit', id: 'train-start' }, 'Start run');
  const formErr = h('div', { class: 'error', id: 'train-error', role: 'alert' });
  const formNote = h('p', { class: 'meta', id: 'train-note' });
  form.append(h('fieldset', {}, h('legend', {}, 'Start a run'), formNote,
    h('div', { class: 'row' }, name.wrap, dataSel.wrap, method.wrap, schedule.wrap, ...nums.map(([, f]) => f.wrap)),
    h('div', { class: 'buttons' }, startBtn), formErr));
  let dataDirs = null;

  function setDataDirs(r) {
    if (!r.runs_dir || !r.train_data_dir) {
      startBtn.disabled = true;
      formNote.textContent = !r.runs_dir
        ? 'Starting runs needs lumen serve --runs DIR --train-data DIR.'
        : 'Starting runs needs lumen serve --train-data DIR (the directory whose subdirectories runs may read).';
      return;
    }
    const key = JSON.stringify(r.train_data);
    if (key === dataDirs) return;
    dataDirs = key;
    const cur = dataSel.input.value || saved.data;
    dataSel.input.replaceChildren(...r.train_data.map((d) => h('option', { value: d, selected: d === cur }, d)));
    startBtn.disabled = !r.train_data.length;
    formNote.textContent = r.train_data.length
      ? `Runs train the served model on a directory under ${r.train_data_dir} and write into ${r.runs_dir}/<name>.`
      : `No directory under ${r.train_data_dir} holds a train.jsonl.`;
  }

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    formErr.textContent = '';
    const body = { name: name.input.value.trim(), data: dataSel.input.value, method: method.input.value };
    if (method.input.value === 'orpo' || method.input.value === 'simpo') body.lambda_schedule = schedule.input.value;
    for (const [k, f] of nums) {
      if (f.input.value.trim() === '') continue;
      if (k === 'lambda' && method.input.value !== 'orpo') continue;
      body[k] = Number(f.input.value);
    }
    const keep = { ...body };
    delete keep.name;
    saveJson('lumen.trainForm', keep);
    startBtn.disabled = true;
    try {
      await postJson('/lumen/runs', body);
      pendingOpen = body.name;
      name.input.value = defaultName();
      await refresh();
    } catch (e) {
      formErr.textContent = `Cannot start: ${e.message}`;
    } finally {
      startBtn.disabled = false;
    }
  });

  async function cancel(runName, btn) {
    btn.disabled = true;
    try {
      await deleteJson(`/lumen/runs/${encodeURIComponent(runName)}`);
    } catch (e) {
      formErr.textContent = `Cannot cancel ${runName}: ${e.message}`;
    }
    refresh();
  }

  async function refresh() {
    try {
      const r = await getJson('/lumen/runs');
      setDataDirs(r);
      if (!r.runs_dir) {
        runsList.replaceChildren(h('li', {}, 'No runs directory: start the server with --runs DIR (each subdirectory with a metrics.jsonl is a run, e.g. a lumen train --out).'));
        return;
      }
      const runs = new Map(r.data.map((run) => [run.name, run]));
      const jobs = new Map((r.jobs || []).map((j) => [j.name, j]));
      const names = [...new Set([...runs.keys(), ...jobs.keys()])].sort();
      active = !!pendingOpen || (r.jobs || []).some((j) => j.state === 'running');
      if (!names.length) {
        items.clear();
        runsList.replaceChildren(h('li', {}, `No runs under ${r.runs_dir} yet.`));
        return;
      }
      // Rows are updated in place (a row rebuilt under the pointer would
      // swallow a click on it): structure changes only when its signature does.
      const rows = names.map((n) => {
        const run = runs.get(n);
        const job = jobs.get(n);
        const live = run && run.seconds_since_update < 30;
        const sig = JSON.stringify([!!run, !!run?.served, job?.state, job?.cancel_requested, job?.checkpoint, job?.state === 'failed' ? job.log_tail : '']);
        let item = items.get(n);
        if (!item || item.sig !== sig) {
          const label = run
            ? h('button', { type: 'button', class: 'link', 'data-run': n, onclick: () => open(n) }, n)
            : h('span', { class: 'name' }, n);
          const meta = h('span', { class: 'meta' });
          const li = h('li', { 'data-name': n }, h('div', { class: 'run-head' }, label, meta));
          if (run?.served) li.append(h('a', { class: 'button small', href: '#chat', id: `chat-with-${n}`, title: 'lumen serve was started with --adapter on this run: chat uses it' }, 'Chat with this adapter'));
          item = { sig, li, meta, state: null, progress: null };
          if (job) {
            const st = h('div', { class: `job state-${job.state}` });
            item.state = h('span', { class: 'job-state' });
            st.append(item.state);
            const iters = job.params?.iters;
            if (job.state === 'running' && iters) {
              item.progress = h('progress', { max: String(iters), value: '0', 'aria-label': `Progress of ${n}` });
              st.append(item.progress);
            }
            if (job.state === 'running' && !job.cancel_requested) {
              const btn = h('button', { type: 'button', class: 'small', 'data-cancel': n, 'aria-label': `Cancel run ${n}` }, 'Cancel');
              btn.addEventListener('click', () => cancel(n, btn));
              st.append(btn);
            }
            if (job.state === 'failed' && job.log_tail) {
              st.append(h('details', {}, h('summary', {}, 'log'), h('pre', { class: 'log' }, job.log_tail)));
            }
            li.append(st);
          }
          items.set(n, item);
        }
        item.li.className = n === selected ? 'active' : '';
        item.li.dataset.state = job?.state || '';
        item.meta.textContent = run ? ` ${run.method || ''} · ${run.reports} reports${run.last ? ` · step ${run.last.step}` : ''}${live ? ' · live' : ''}` : '';
        if (job) item.state.textContent = jobText(job, run);
        if (item.progress) item.progress.value = run?.last?.step || 0;
        return item.li;
      });
      for (const n of [...items.keys()]) if (!runs.has(n) && !jobs.has(n)) items.delete(n);
      if (rows.length !== runsList.children.length || rows.some((li, i) => runsList.children[i] !== li)) runsList.replaceChildren(...rows);
      if (pendingOpen && runs.has(pendingOpen)) {
        const n = pendingOpen;
        pendingOpen = '';
        open(n);
      } else if (pendingOpen && jobs.get(pendingOpen)?.state !== 'running') {
        pendingOpen = '';  // it ended before writing metrics: its log is in the list
      }
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
    h('section', { class: 'watch', 'aria-label': 'Metrics' }, form, info, charts)));
  refresh();
  // Every second while a job runs, every 5 s otherwise.
  timer = setInterval(() => { if (active || ++ticks % 5 === 0) refresh(); }, 1000);
  return { stop: () => { controller?.abort(); clearInterval(timer); } };
}
