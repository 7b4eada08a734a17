// The model, off the page's thread. Messages in: load (an .rbw model and its tokenizer by
// URL, or a GGUF file by URL or as a File the page was given), generate (a prompt, or with
// `chat` the user's next message through the model's chat template), reset, stop.
// Messages out: progress (bytes of the model read), loaded, tokens (the text and ids of
// the tokens since the last such message, with the first's and the newest's times), done,
// error.
import { loadModel } from './pkg/index.js';

let model = null;
let stopRequested = false;

// The body of `r` as bytes, with a `progress` message to the page at most every 50 ms
// (bytes read, and the total where the server says it).
async function readWithProgress(body, total) {
  const reader = body.getReader();
  const parts = [];
  let loaded = 0;
  let posted = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    loaded += value.length;
    if (performance.now() - posted > 50) {
      posted = performance.now();
      postMessage({ type: 'progress', loaded, total });
    }
  }
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  postMessage({ type: 'progress', loaded, total: total || loaded });
  return bytes;
}

async function load({ device, weights, tokenizer, gguf, file }) {
  const t0 = performance.now();
  const get = async (url) => {
    const r = await fetch(url);
    if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status}`);
    return r;
  };
  // A model loaded before is freed first: two in the wasm heap may not fit.
  model?.dispose();
  model = null;
  let bytes;
  let json;
  let name;
  if (file) {
    name = file.name;
    bytes = await readWithProgress(file.stream(), file.size);
  } else if (gguf) {
    name = gguf.split('/').pop();
    const r = await get(gguf);
    bytes = await readWithProgress(r.body, Number(r.headers.get('content-length')) || 0);
  } else {
    name = weights.split('/').pop();
    const [w, t] = await Promise.all([get(weights), get(tokenizer)]);
    bytes = await readWithProgress(w.body, Number(w.headers.get('content-length')) || 0);
    json = await t.text();
  }
  model = await loadModel(bytes, json, { device });
  postMessage({
    type: 'loaded',
    device: model.device(),
    reason: model.deviceReason(),
    info: model.info(),
    chat: model.chatTemplate() !== undefined,
    name,
    bytes: bytes.length,
    ms: performance.now() - t0,
  });
}

// Tokens go to the page at most once a frame (16 ms; the first at once): a message per
// token costs tens of microseconds, a fifth of the CPU path's time per token, and a
// screen shows no more than one update a frame anyway.
const BATCH_MS = 16;

async function generate({ prompt, options, chat }) {
  stopRequested = false;
  let batch = { text: '', ids: [] };
  let posted = -Infinity;
  // The live figures: the first token's time from the call, and the time of the newest,
  // so the page shows tokens/s as `generate` will report it (tokens after the first over
  // the time after it) while it runs.
  const t0 = performance.now();
  let firstMs = null;
  let lastMs = null;
  const flush = () => {
    if (batch.ids.length === 0) return;
    postMessage({ type: 'tokens', ...batch, firstMs, lastMs });
    batch = { text: '', ids: [] };
    posted = performance.now();
  };
  try {
    const run = chat ? model.chatTurn.bind(model) : model.generate.bind(model);
    const result = await run(prompt, options, (text, id) => {
      lastMs = performance.now() - t0;
      firstMs ??= lastMs;
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
    else if (data.type === 'reset') model?.reset();
  } catch (e) {
    postMessage({ type: 'error', message: String(e && e.message ? e.message : e), fatal: data.type === 'load' });
  }
};
