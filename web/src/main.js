// The web app's entry: hash routing between the four pages, the API key box.
import 'uplot/dist/uPlot.min.css';
import 'highlight.js/styles/github.css';
import './style.css';
import { apiKey, setApiKey, getJson } from './api.js';
import { mountChat } from './chat.js';
import { mountCurve } from './curve.js';
import { mountTrain } from './train.js';
import { mountStatus } from './status.js';

const PAGES = { chat: mountChat, curve: mountCurve, train: mountTrain, status: mountStatus };
const ctx = { model: '' };
let active = null;

function route() {
  const name = (location.hash || '#chat').slice(1);
  const page = PAGES[name] ? name : 'chat';
  active?.stop?.();
  const root = document.getElementById('app');
  root.replaceChildren();
  root.dataset.page = page;
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.page === page) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  active = PAGES[page](root, ctx);
}

async function loadModel() {
  try {
    const m = await getJson('/v1/models');
    ctx.model = m.data?.[0]?.id || '';
    document.getElementById('model-name').textContent = ctx.model;
  } catch (e) {
    document.getElementById('model-name').textContent = e.status === 401 ? 'API key needed' : '';
  }
}

const key = document.getElementById('api-key');
key.value = apiKey();
key.addEventListener('change', () => { setApiKey(key.value.trim()); loadModel(); route(); });
window.addEventListener('hashchange', route);
loadModel();
route();
