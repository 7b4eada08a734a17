// The model, off the page's thread. Messages in: load, generate, stop. Messages out:
// loaded, token (one per new token), done, error.
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

async function generate({ prompt, options }) {
  stopRequested = false;
  const result = await model.generate(prompt, options, (text, id) => {
    postMessage({ type: 'token', text, id });
    return !stopRequested;
  });
  postMessage({ type: 'done', result: { ...result, ids: Array.from(result.ids) } });
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
