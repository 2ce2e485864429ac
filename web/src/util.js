// Small DOM helpers shared by the pages.

// h('div', {class: 'x', onclick: f}, child, 'text', ...) -> element.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

let uid = 0;
// A labelled input: returns {wrap, input}.
export function field(label, attrs = {}) {
  const id = attrs.id || `f${++uid}`;
  const tag = attrs.tag || 'input';
  const input = h(tag, { ...attrs, id, tag: undefined });
  const wrap = h('div', { class: 'field' }, h('label', { for: id }, label), input);
  return { wrap, input };
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return '-';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

export function fmtNum(n, digits = 3) {
  if (n === null || n === undefined || Number.isNaN(n)) return '-';
  if (Number.isInteger(n)) return String(n);
  const a = Math.abs(n);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return n.toExponential(2);
  return n.toFixed(digits);
}

export function loadJson(key, dflt) {
  try {
    const v = localStorage.getItem(key);
    return v ? JSON.parse(v) : dflt;
  } catch {
    return dflt;
  }
}

export function saveJson(key, v) {
  localStorage.setItem(key, JSON.stringify(v));
}
