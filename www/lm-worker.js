// The Train page's language model, off the page's thread. Messages in: train, stop,
// generate, files. Messages out: ready, step, held (a held-out loss), done, sampled,
// files, error.
import { initialize, Tokenizer, TransformerLm } from './pkg/index.js';
import { random } from './random.js';

let lm = null;
let tokenizer = null;
let model = null; // the trained model loaded for generation
let stopRequested = false;

/** One event-loop turn (a message through a channel: setTimeout(0) is clamped to 4 ms). */
function nextTurn() {
  return new Promise((resolve) => {
    const c = new MessageChannel();
    c.port1.onmessage = () => { c.port1.close(); resolve(); };
    c.port2.postMessage(null);
  });
}

/** The last tenth of the text, from a line break, is held out. */
function split(text) {
  let at = Math.floor(text.length * 0.9);
  const nl = text.lastIndexOf('\n', at);
  if (nl > text.length / 2) at = nl;
  return [text.slice(0, at), text.slice(at)];
}

const SIZES = {
  tiny: { dModel: 64, nLayers: 2, heads: 4, kvHeads: 2, headDim: 16, dFF: 192 },
  small: { dModel: 96, nLayers: 4, heads: 6, kvHeads: 2, headDim: 16, dFF: 256 },
};

async function train({ text, vocabSize, size, steps, batch, seq, lr, seed, every, device }) {
  stopRequested = false;
  await initialize();
  lm?.dispose();
  model?.dispose();
  lm = null;
  model = null;
  const [trainText, heldText] = split(text);
  const t0 = performance.now();
  tokenizer = Tokenizer.train(trainText, { vocabSize });
  const trainIds = tokenizer.encode(trainText);
  const heldIds = tokenizer.encode(heldText);
  if (trainIds.length < 2 * (seq + 1) || heldIds.length < seq + 1) {
    throw new Error(`the text is too short: ${trainIds.length} training and ${heldIds.length} held-out tokens for sequences of ${seq}`);
  }
  const tokenizerMs = performance.now() - t0;
  lm = await TransformerLm.create({ ...SIZES[size], vocabSize: tokenizer.vocabSize(), maxSeqLen: seq, seed, device, optimizer: { learningRate: lr } });
  // The held-out batch: up to 16 windows spread evenly over the held-out tokens.
  const windows = Math.min(16, Math.floor(heldIds.length / (seq + 1)));
  const held = Array.from({ length: windows }, (_, i) => {
    const at = Math.floor((i * (heldIds.length - seq - 1)) / Math.max(1, windows - 1));
    return heldIds.slice(at, at + seq + 1);
  });
  const heldLoss = async () => (await lm.evaluate(held)).loss;
  postMessage({
    type: 'ready', device: lm.device(), reason: lm.deviceReason(), info: lm.info(), tokenizerMs,
    trainTokens: trainIds.length, heldTokens: heldIds.length,
  });
  const first = await heldLoss();
  postMessage({ type: 'held', step: 0, loss: first });
  const r = random(seed);
  // Warmup over the first tenth, then a cosine down to a tenth of the peak.
  const warmup = Math.max(1, Math.floor(steps / 10));
  const rate = (s) => (s < warmup ? (lr * (s + 1)) / warmup
    : lr * (0.1 + 0.45 * (1 + Math.cos((Math.PI * (s - warmup)) / Math.max(1, steps - warmup)))));
  let tokens = 0;
  let ms = 0;
  let last = first;
  let done = 0;
  for (let step = 0; step < steps && !stopRequested; step++) {
    lm.setLearningRate(rate(step));
    const rows = Array.from({ length: batch }, () => {
      const at = Math.floor(r() * (trainIds.length - seq - 1));
      return trainIds.slice(at, at + seq + 1);
    });
    const s = await lm.trainStep(rows, { clip: 1 });
    tokens += s.tokens;
    ms += s.ms;
    done = step + 1;
    postMessage({ type: 'step', step: done, loss: s.loss, tokensPerSecond: (1000 * tokens) / ms });
    if (done % every === 0 || done === steps) {
      last = await heldLoss();
      postMessage({ type: 'held', step: done, loss: last });
    }
    await nextTurn();
  }
  if (done % every !== 0 && done !== steps) {
    last = await heldLoss();
    postMessage({ type: 'held', step: done, loss: last });
  }
  model = await lm.toModel(tokenizer, { device: 'cpu' });
  postMessage({ type: 'done', steps: done, stopped: stopRequested, first, last, tokensPerSecond: (1000 * tokens) / ms });
}

async function generate({ prompt, temperature, maxTokens, seed }) {
  if (model === null) throw new Error('train a model first');
  const out = await model.generate(prompt, { maxTokens, temperature, repetitionPenalty: 1, seed });
  postMessage({ type: 'sampled', text: out.text, ids: Array.from(out.ids), tokensPerSecond: out.tokensPerSecond });
}

onmessage = async ({ data }) => {
  if (data.type === 'stop') {
    stopRequested = true;
    return;
  }
  try {
    if (data.type === 'train') await train(data);
    else if (data.type === 'generate') await generate(data);
    else if (data.type === 'files') {
      const bytes = await lm.toBytes();
      postMessage({ type: 'files', which: data.which, bytes, tokenizer: JSON.stringify(tokenizer, null, 2) }, [bytes.buffer]);
    }
  } catch (e) {
    postMessage({ type: 'error', message: String(e && e.message ? e.message : e) });
  }
};
