// Requests to this server: the API key (if the user gave one) on every call,
// errors turned into Error(message from the server's error body), and a
// server-sent-events reader over fetch (EventSource cannot send headers).

export function apiKey() {
  return localStorage.getItem('lumen.apiKey') || '';
}

export function setApiKey(k) {
  if (k) localStorage.setItem('lumen.apiKey', k);
  else localStorage.removeItem('lumen.apiKey');
}

function headers(extra = {}) {
  const h = { ...extra };
  const k = apiKey();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

async function errorFrom(res) {
  let msg = `HTTP ${res.status}`;
  try {
    const j = await res.json();
    msg = j?.error?.message || msg;
  } catch { /* not JSON */ }
  const e = new Error(msg);
  e.status = res.status;
  return e;
}

export async function getJson(path, opts = {}) {
  const res = await fetch(path, { headers: headers(), signal: opts.signal });
  if (!res.ok) throw await errorFrom(res);
  return res.json();
}

export async function getText(path) {
  const res = await fetch(path, { headers: headers() });
  if (!res.ok) throw await errorFrom(res);
  return res.text();
}

export async function postJson(path, body, opts = {}) {
  const res = await fetch(path, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
    signal: opts.signal,
  });
  if (!res.ok) throw await errorFrom(res);
  return res.json();
}

export async function deleteJson(path) {
  const res = await fetch(path, { method: 'DELETE', headers: headers() });
  if (!res.ok) throw await errorFrom(res);
  return res.json();
}

// Calls onEvent(dataString, eventName) for each SSE event of a GET or POST.
// Resolves when the stream ends; rejects on HTTP errors; abort via signal.
export async function streamEvents(path, { body, signal, onEvent }) {
  const init = { headers: headers(), signal };
  if (body !== undefined) {
    init.method = 'POST';
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (!res.ok) throw await errorFrom(res);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
      let data = [];
      let name = 'message';
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        else if (line.startsWith('event:')) name = line.slice(6).trim();
      }
      if (data.length) onEvent(data.join('\n'), name);
    }
  }
}
