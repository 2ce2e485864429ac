// Chat: streams /v1/chat/completions; conversations live in localStorage.
import { streamEvents } from './api.js';
import { renderMarkdown } from './markdown.js';
import { h, field, loadJson, saveJson, fmtNum } from './util.js';

const KEY = 'lumen.conversations';
const SAMPLER_KEY = 'lumen.sampler';

const SAMPLER_FIELDS = [
  // [json field, label, attrs]
  ['temperature', 'Temperature', { type: 'number', step: '0.05', min: '0', value: '0.8' }],
  ['top_p', 'Top-p', { type: 'number', step: '0.01', min: '0', max: '1', value: '1' }],
  ['top_k', 'Top-k', { type: 'number', step: '1', min: '0', value: '0' }],
  ['min_p', 'Min-p', { type: 'number', step: '0.01', min: '0', max: '1', value: '0' }],
  ['repetition_penalty', 'Repetition penalty', { type: 'number', step: '0.05', min: '0', value: '1' }],
  ['presence_penalty', 'Presence penalty', { type: 'number', step: '0.1', value: '0' }],
  ['frequency_penalty', 'Frequency penalty', { type: 'number', step: '0.1', value: '0' }],
  ['seed', 'Seed (-1 random)', { type: 'number', step: '1', value: '-1' }],
  ['max_tokens', 'Max tokens', { type: 'number', step: '1', min: '1', value: '256' }],
];

function newConversation() {
  return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: 'New chat', system: '', messages: [] };
}

export function mountChat(root, ctx) {
  let convs = loadJson(KEY, []);
  if (!convs.length) convs = [newConversation()];
  let current = convs[0];
  let controller = null;
  const saved = loadJson(SAMPLER_KEY, {});

  const list = h('ul', { class: 'conv-list', 'aria-label': 'Conversations' });
  const log = h('div', { class: 'chat-log', 'aria-live': 'polite', 'aria-label': 'Messages' });
  const input = h('textarea', { id: 'chat-input', rows: '3', placeholder: 'Message (Enter sends, Shift+Enter: new line)' });
  const sendBtn = h('button', { type: 'submit', id: 'chat-send' }, 'Send');
  const stopBtn = h('button', { type: 'button', id: 'chat-stop', disabled: true, onclick: () => controller?.abort() }, 'Stop');
  const regenBtn = h('button', { type: 'button', id: 'chat-regen', onclick: regenerate }, 'Regenerate');
  const status = h('div', { class: 'chat-status', role: 'status', id: 'chat-status' });
  const system = field('System prompt', { tag: 'textarea', id: 'chat-system', rows: '3' });
  system.input.addEventListener('input', () => { current.system = system.input.value; persist(); });

  const samplerInputs = {};
  const samplerBox = h('fieldset', { class: 'sampler' }, h('legend', {}, 'Sampler'));
  for (const [name, label, attrs] of SAMPLER_FIELDS) {
    const f = field(label, { ...attrs, id: `s-${name}` });
    if (saved[name] !== undefined) f.input.value = saved[name];
    f.input.addEventListener('change', saveSampler);
    samplerInputs[name] = f.input;
    samplerBox.append(f.wrap);
  }
  const check = (id, label, on) => {
    const input = h('input', { type: 'checkbox', id, checked: !!on });
    input.addEventListener('change', saveSampler);
    return { input, wrap: h('div', { class: 'field check' }, input, h('label', { for: id }, label)) };
  };
  const logprobs = check('s-logprobs', 'Logprobs (tint tokens, hover for alternatives)', saved.logprobs);
  const hlgOn = check('s-hlg', 'HLG tone curve', saved.hlg);
  const hlgFields = {};
  for (const [k, label, v] of [['width', 'HLG width', 4], ['shoulder', 'HLG shoulder', 4], ['toe', 'HLG toe', 6], ['pivot_offset', 'HLG pivot offset', 6]]) {
    const f = field(label, { type: 'number', step: '0.5', value: String(saved[`hlg_${k}`] ?? v), id: `s-hlg-${k}` });
    f.input.addEventListener('change', saveSampler);
    hlgFields[k] = f.input;
  }
  const pivot = field('HLG pivot', { tag: 'select', id: 's-hlg-pivot' });
  for (const p of ['top', 'entropy', 'median']) pivot.input.append(h('option', { value: p }, p));
  pivot.input.value = saved.hlg_pivot || 'top';
  pivot.input.addEventListener('change', saveSampler);
  const curveOn = check('s-curve', 'Saved curve (from the Curve Designer)', saved.curve);
  samplerBox.append(logprobs.wrap, hlgOn.wrap, ...Object.values(hlgFields).map((i) => i.parentElement), pivot.wrap, curveOn.wrap);

  function saveSampler() {
    const s = {};
    for (const [k, i] of Object.entries(samplerInputs)) s[k] = i.value;
    s.logprobs = logprobs.input.checked;
    s.hlg = hlgOn.input.checked;
    for (const [k, i] of Object.entries(hlgFields)) s[`hlg_${k}`] = i.value;
    s.hlg_pivot = pivot.input.value;
    s.curve = curveOn.input.checked;
    saveJson(SAMPLER_KEY, s);
  }

  function samplerBody() {
    const b = {};
    for (const [k, i] of Object.entries(samplerInputs)) {
      if (i.value === '') continue;
      const v = Number(i.value);
      if (k === 'seed' && v < 0) continue;
      b[k] = v;
    }
    if (logprobs.input.checked) { b.logprobs = true; b.top_logprobs = 5; }
    if (hlgOn.input.checked) {
      b.hlg = { enabled: true, pivot: pivot.input.value };
      for (const [k, i] of Object.entries(hlgFields)) b.hlg[k] = Number(i.value);
    } else if (curveOn.input.checked) {
      const c = loadJson('lumen.curve', null);
      if (c) b.curve = c;
    }
    return b;
  }

  function persist() {
    saveJson(KEY, convs);
  }

  function renderList() {
    list.replaceChildren(...convs.map((c) => h('li', { class: c === current ? 'active' : '' },
      h('button', { type: 'button', class: 'link', onclick: () => { current = c; render(); } }, c.title || 'Untitled'),
      h('button', { type: 'button', class: 'icon', 'aria-label': `Delete ${c.title}`, title: 'Delete', onclick: () => {
        convs = convs.filter((x) => x !== c);
        if (!convs.length) convs = [newConversation()];
        if (current === c) current = convs[0];
        persist();
        render();
      } }, '×'))));
  }

  function messageView(m, i) {
    const body = h('div', { class: 'body' });
    if (m.role === 'assistant') {
      if (m.logprobs && m.showLogprobs !== false && m.logprobs.length) {
        body.append(logprobView(m.logprobs));
      } else {
        fillAssistant(body, m.content || '');
      }
      for (const t of m.tool_calls || []) {
        body.append(h('div', { class: 'tool-call' }, h('strong', {}, `tool call: ${t.function?.name || '?'}`), h('pre', {}, t.function?.arguments || '')));
      }
    } else {
      body.textContent = m.content;
    }
    const actions = h('div', { class: 'actions' });
    if (m.role === 'user') {
      actions.append(h('button', { type: 'button', class: 'link', onclick: () => {
        input.value = m.content;
        current.messages = current.messages.slice(0, i);
        persist();
        render();
        input.focus();
      } }, 'Edit'));
    }
    if (m.stats) actions.append(h('span', { class: 'stats' }, m.stats));
    return h('div', { class: `msg ${m.role}` }, h('div', { class: 'role' }, m.role), body, actions);
  }

  // Reasoning in <think>...</think> goes into a collapsed block.
  function fillAssistant(el, text) {
    const m = /^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)$/.exec(text);
    el.replaceChildren();
    if (m) {
      const d = h('details', { class: 'reasoning' }, h('summary', {}, 'Reasoning'));
      d.insertAdjacentHTML('beforeend', renderMarkdown(m[1]));
      el.append(d);
      text = m[3];
    }
    const md = h('div', { class: 'md' });
    md.innerHTML = renderMarkdown(text);
    el.append(md);
  }

  function logprobView(lps) {
    const wrap = h('div', { class: 'logprobs', 'aria-label': 'Tokens tinted by probability' });
    for (const t of lps) {
      const p = Math.exp(t.logprob);
      const alts = (t.top_logprobs || []).map((a) => `${JSON.stringify(a.token)} ${(100 * Math.exp(a.logprob)).toFixed(1)}%`).join('\n');
      wrap.append(h('span', { class: 'tok', style: `background: hsla(${Math.round(120 * p)}, 70%, 50%, 0.35)`, title: `p = ${(100 * p).toFixed(1)}%\n${alts}` }, t.token));
    }
    return wrap;
  }

  function render() {
    renderList();
    system.input.value = current.system || '';
    log.replaceChildren(...current.messages.map(messageView));
    log.scrollTop = log.scrollHeight;
  }

  async function complete() {
    const msgs = [];
    if (current.system) msgs.push({ role: 'system', content: current.system });
    for (const m of current.messages) msgs.push({ role: m.role, content: m.content || '' });
    const reply = { role: 'assistant', content: '', logprobs: [] };
    current.messages.push(reply);
    const view = messageView(reply, current.messages.length - 1);
    view.classList.add('streaming');
    log.append(view);
    const body = view.querySelector('.body');
    controller = new AbortController();
    sendBtn.disabled = true; regenBtn.disabled = true; stopBtn.disabled = false;
    status.textContent = 'Generating…';
    const t0 = performance.now();
    let tFirst = 0;
    let tokens = 0;
    let usage = null;
    let finish = '';
    const toolCalls = [];
    try {
      await streamEvents('/v1/chat/completions', {
        signal: controller.signal,
        body: { model: ctx.model || 'lumen', messages: msgs, stream: true, stream_options: { include_usage: true }, ...samplerBody() },
        onEvent: (data) => {
          if (data === '[DONE]') return;
          const j = JSON.parse(data);
          if (j.usage) usage = j.usage;
          const c = j.choices?.[0];
          if (!c) return;
          if (c.finish_reason) finish = c.finish_reason;
          const d = c.delta || {};
          if (d.content) {
            if (!tFirst) tFirst = performance.now();
            reply.content += d.content;
          }
          for (const tc of d.tool_calls || []) {
            const slot = (toolCalls[tc.index || 0] ||= { function: { name: '', arguments: '' } });
            if (tc.function?.name) slot.function.name = tc.function.name;
            if (tc.function?.arguments) slot.function.arguments += tc.function.arguments;
          }
          for (const lp of c.logprobs?.content || []) { reply.logprobs.push(lp); tokens++; }
          if (!c.logprobs) tokens += d.content ? 1 : 0;
          fillAssistant(body, reply.content);
          log.scrollTop = log.scrollHeight;
        },
      });
    } catch (e) {
      if (e.name === 'AbortError') finish = 'stopped';
      else { finish = 'error'; reply.error = e.message; status.textContent = `Error: ${e.message}`; }
    }
    const t1 = performance.now();
    if (usage) tokens = usage.completion_tokens;
    if (toolCalls.length) reply.tool_calls = toolCalls;
    const ttft = tFirst ? tFirst - t0 : NaN;
    const tps = tFirst && t1 > tFirst && tokens > 1 ? (tokens - 1) / ((t1 - tFirst) / 1000) : NaN;
    reply.stats = `${tokens} tokens · TTFT ${fmtNum(ttft, 0)} ms · ${fmtNum(tps, 1)} tokens/s · ${finish || 'done'}`;
    if (!reply.logprobs.length) delete reply.logprobs;
    if (current.title === 'New chat') {
      const firstUser = current.messages.find((m) => m.role === 'user');
      if (firstUser) current.title = firstUser.content.slice(0, 40);
    }
    persist();
    view.replaceWith(messageView(reply, current.messages.length - 1));
    if (finish !== 'error') status.textContent = finish === 'stopped' ? 'Stopped.' : 'Done.';
    controller = null;
    sendBtn.disabled = false; regenBtn.disabled = false; stopBtn.disabled = true;
    renderList();
  }

  async function send(e) {
    e?.preventDefault();
    if (controller) return;
    const text = input.value.trim();
    if (!text) return;
    input.value = '';
    current.messages.push({ role: 'user', content: text });
    persist();
    render();
    await complete();
  }

  async function regenerate() {
    if (controller) return;
    while (current.messages.length && current.messages.at(-1).role === 'assistant') current.messages.pop();
    if (!current.messages.length) return;
    render();
    await complete();
  }

  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) send(e);
  });

  const form = h('form', { class: 'composer', onsubmit: send },
    h('label', { for: 'chat-input', class: 'sr-only' }, 'Message'), input,
    h('div', { class: 'buttons' }, sendBtn, stopBtn, regenBtn));

  root.append(h('div', { class: 'chat' },
    h('aside', { class: 'sidebar' },
      h('button', { type: 'button', id: 'chat-new', onclick: () => { current = newConversation(); convs.unshift(current); persist(); render(); input.focus(); } }, 'New chat'),
      list),
    h('section', { class: 'conversation', 'aria-label': 'Conversation' }, log, form, status),
    h('aside', { class: 'settings', 'aria-label': 'Settings' }, system.wrap, samplerBox)));
  render();
  return { stop: () => controller?.abort() };
}
