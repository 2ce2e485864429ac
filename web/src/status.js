// Status: /lumen/info (model, architecture, memory, the active routes:
// --act-route, --kv-type, --adapter) and /stats every 2 s; tokens/s over time
// from the change in completion tokens between polls.
import uPlot from 'uplot';
import { getJson } from './api.js';
import { h, fmtBytes, fmtNum } from './util.js';

export function mountStatus(root) {
  const model = h('table', { class: 'kv', id: 'status-model' });
  const memory = h('table', { class: 'kv', id: 'status-memory' });
  const serving = h('table', { class: 'kv', id: 'status-serving' });
  const routes = h('table', { class: 'kv', id: 'status-routes' });
  const chartBox = h('figure', { class: 'chart wide' }, h('figcaption', {}, 'completion tokens/s (2 s intervals)'));
  const err = h('div', { class: 'error wide', role: 'alert' });
  const series = [[], []];
  let plot = null;
  let prev = null;
  let timer = 0;

  const rows = (t, pairs) => t.replaceChildren(...pairs.map(([k, v]) => h('tr', {}, h('th', { scope: 'row' }, k), h('td', {}, String(v)))));

  async function poll() {
    try {
      const [info, stats] = await Promise.all([getJson('/lumen/info'), getJson('/stats')]);
      err.textContent = '';
      const a = info.architecture;
      rows(model, [['model', info.model], ['format', info.format], ['family', a.family], ['layers', a.layers], ['dim (D)', a.dim],
        ['heads (H / Hkv)', `${a.heads} / ${a.kv_heads}`], ['head dim', a.head_dim], ['FFN dim', a.ffn_dim], ['vocabulary', a.vocab_size],
        ['trained context', a.max_ctx], ['parameters', info.parameters.toLocaleString()], ['adapter', info.adapter ? 'yes' : 'no']]);
      const m = info.memory;
      rows(memory, [['weights', fmtBytes(m.weight_bytes)], ['KV per slot', `${fmtBytes(m.kv_bytes_per_slot)} (${info.kv_type})`],
        ['KV in use', fmtBytes(m.kv_bytes_active)], ['prompt cache', fmtBytes(m.prompt_cache_bytes)], ['RSS', fmtBytes(m.rss_bytes)]]);
      rows(routes, [['activation route (--act-route)', info.act_route ?? '-'], ['KV cache type (--kv-type)', info.kv_type],
        ['adapter (--adapter)', info.adapter_dir || 'none']]);
      const now = stats.uptime_seconds;
      const tok = stats.tokens.completion;
      let tps = 0;
      if (prev && now > prev.t) tps = (tok - prev.tok) / (now - prev.t);
      prev = { t: now, tok };
      rows(serving, [['context per slot', info.context], ['slots busy / total', `${stats.active_slots} / ${stats.parallel}`],
        ['queue', `${stats.queue_depth} / ${stats.queue_limit}`], ['requests', stats.requests.total],
        ['jobs started / finished / cancelled', `${stats.jobs.started} / ${stats.jobs.finished} / ${stats.jobs.cancelled}`],
        ['tokens prompt / completion', `${stats.tokens.prompt} / ${stats.tokens.completion}`],
        ['prompt cache hits / misses', `${stats.prompt_cache.hits} / ${stats.prompt_cache.misses}`],
        ['mean rows per decode step', fmtNum(stats.batching.mean_rows_per_step, 2)], ['tokens/s now', fmtNum(tps, 1)], ['uptime', `${Math.round(now)} s`]]);
      series[0].push(now); series[1].push(tps);
      if (series[0].length > 300) { series[0].shift(); series[1].shift(); }
      plot?.setData(series);
    } catch (e) {
      err.textContent = `Error: ${e.message}`;
    }
  }

  root.append(h('div', { class: 'status-page' }, err,
    h('section', {}, h('h2', {}, 'Model'), model),
    h('section', {}, h('h2', {}, 'Memory'), memory),
    h('section', {}, h('h2', {}, 'Serving'), serving),
    h('section', {}, h('h2', {}, 'Active routes'), routes),
    h('section', { class: 'wide' }, chartBox, h('p', {}, 'Raw: ', h('a', { href: '/stats' }, '/stats'), ' · ', h('a', { href: '/metrics' }, '/metrics'), ' · ', h('a', { href: '/lumen/info' }, '/lumen/info')))));
  plot = new uPlot({ width: 640, height: 180, legend: { show: false }, scales: { x: { time: false } },
    axes: [{ label: 'uptime (s)', size: 30 }, { size: 56 }],
    series: [{}, { label: 'tokens/s', stroke: '#16a34a', width: 1.5 }] }, series, chartBox);
  poll();
  timer = setInterval(poll, 2000);
  return { stop: () => clearInterval(timer) };
}
