// The model, off the page's thread. Messages in: load, generate, stop. Messages out:
// loaded, tokens (the text and ids of the tokens since the last such message), done, error.
import { loadModel } from './pkg/index.js';

let model = null;
let stopRequested = false;

async function load({ device, weights, tokenizer }) {
  const t0 = performance.now();
  const get = async (url) => {
    const r = await fetch(url);
    if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status}`);
    return r;
  };
  const [w, t] = await Promise.all([get(weights), get(tokenizer)]);
  const bytes = new Uint8Array(await w.arrayBuffer());
  model = await loadModel(bytes, await t.text(), { device });
  postMessage({
    type: 'loaded',
    device: model.device(),
    reason: model.deviceReason(),
    info: model.info(),
    bytes: bytes.length,
    ms: performance.now() - t0,
  });
}

// Tokens go to the page at most once a frame (16 ms; the first at once): a message per
// token costs tens of microseconds, a fifth of the CPU path's time per token, and a
// screen shows no more than one update a frame anyway.
const BATCH_MS = 16;

async function generate({ prompt, options }) {
  stopRequested = false;
  let batch = { text: '', ids: [] };
  let posted = -Infinity;
  const flush = () => {
    if (batch.ids.length === 0) return;
    postMessage({ type: 'tokens', ...batch });
    batch = { text: '', ids: [] };
    posted = performance.now();
  };
  try {
    const result = await model.generate(prompt, options, (text, id) => {
      batch.text += text;
      batch.ids.push(id);
      if (performance.now() - posted >= BATCH_MS) flush();
      return !stopRequested;
    });
    flush();
    postMessage({ type: 'done', result: { ...result, ids: Array.from(result.ids) } });
  } finally {
    flush();
  }
}

onmessage = async ({ data }) => {
  if (data.type === 'stop') {
    stopRequested = true;
    return;
  }
  try {
    if (data.type === 'load') await load(data);
    else if (data.type === 'generate') await generate(data);
  } catch (e) {
    postMessage({ type: 'error', message: String(e && e.message ? e.message : e), fatal: data.type === 'load' });
  }
};
