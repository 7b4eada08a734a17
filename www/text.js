// The Train page's Text tab (and the switch between the tabs): sends the text and the
// settings to lm-worker.js and paints the loss curves, the figures and the samples.
import { plot } from './plot.js';

const $ = (id) => document.getElementById(id);
const out = $('text-output');
const worker = new Worker(new URL('./lm-worker.js', import.meta.url), { type: 'module' });
let trainLoss = [];
let heldLoss = [];
let steps = 1;

for (const tab of ['tabular', 'text']) {
  $(`tab-${tab}-button`).addEventListener('click', () => {
    for (const t of ['tabular', 'text']) {
      $(`tab-${t}`).hidden = t !== tab;
      $(`tab-${t}-button`).classList.toggle('on', t === tab);
    }
  });
}
if (location.hash === '#text') $('tab-text-button').click();

async function loadExcerpt() {
  const r = await fetch('data/rust-book-excerpt.txt.gz');
  if (!r.ok) throw new Error(`fetching the excerpt: HTTP ${r.status}`);
  const text = await new Response(r.body.pipeThrough(new DecompressionStream('gzip'))).text();
  if ($('lm-text').value === '') $('lm-text').value = text;
  out.dataset.excerpt = String(text.length);
}
loadExcerpt().catch((e) => status(String(e.message ?? e), true));

function status(text, error = false) {
  $('lm-status').textContent = text;
  $('lm-status').style.color = error ? '#b00020' : '';
}

function setState(state) {
  out.dataset.state = state;
  const busy = state === 'training' || state === 'generating';
  $('lm-train').disabled = busy;
  $('lm-stop').disabled = state !== 'training';
  const trained = state === 'done' || (state === 'generating' && out.dataset.steps);
  for (const id of ['lm-generate', 'lm-download-model', 'lm-download-tokenizer']) $(id).disabled = busy || !trained;
}

function draw() {
  plot($('lm-loss'), [
    { points: trainLoss, color: '#b7410e' },
    { points: heldLoss, color: '#1f4e8c', dots: true },
  ], steps, 'step');
}

$('lm-train').addEventListener('click', () => {
  const text = $('lm-text').value;
  if (text.trim() === '') {
    status('paste some text first', true);
    return;
  }
  trainLoss = [];
  heldLoss = [];
  steps = Number($('lm-steps').value);
  delete out.dataset.steps;
  $('lm-sample').textContent = '';
  draw();
  setState('training');
  status('training the tokenizer…');
  worker.postMessage({
    type: 'train', text, vocabSize: Number($('lm-vocab').value), size: $('lm-size').value, steps,
    batch: Number($('lm-batch').value), seq: Number($('lm-seq').value), lr: Number($('lm-lr').value),
    seed: Number($('lm-seed').value), every: Number($('lm-every').value),
    device: new URLSearchParams(location.search).get('device') ?? $('lm-device-choice').value,
  });
});

$('lm-stop').addEventListener('click', () => {
  worker.postMessage({ type: 'stop' });
  $('lm-stop').disabled = true;
});

$('lm-generate').addEventListener('click', () => {
  setState('generating');
  $('lm-sample').textContent = '…';
  worker.postMessage({ type: 'generate', prompt: $('lm-prompt').value, temperature: Number($('lm-temperature').value), maxTokens: 48, seed: 1 });
});

for (const which of ['model', 'tokenizer']) {
  $(`lm-download-${which}`).addEventListener('click', () => worker.postMessage({ type: 'files', which }));
}

function save(name, blob) {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

let painted = 0;
worker.onmessage = ({ data }) => {
  if (data.type === 'ready') {
    $('lm-device').textContent = { webgpu: 'WebGPU', cpu: 'CPU (WebAssembly)' }[data.device] ?? data.device;
    $('lm-device').className = `badge ${data.device}`;
    $('lm-device').title = data.reason;
    $('lm-params').textContent = data.info.parameters.toLocaleString('en');
    out.dataset.device = data.device;
    status(`vocabulary of ${data.info.vocabSize} trained in ${data.tokenizerMs.toFixed(0)} ms; ${data.trainTokens.toLocaleString('en')} training and ${data.heldTokens.toLocaleString('en')} held-out tokens`);
  } else if (data.type === 'step') {
    trainLoss.push([data.step, data.loss]);
    $('lm-step').textContent = data.step;
    $('lm-train-loss').textContent = data.loss.toFixed(3);
    $('lm-rate').textContent = Math.round(data.tokensPerSecond).toLocaleString('en');
    out.dataset.step = String(data.step);
    const now = performance.now();
    if (now - painted > 16) {
      painted = now;
      requestAnimationFrame(draw);
    }
  } else if (data.type === 'held') {
    heldLoss.push([data.step, data.loss]);
    $('lm-held').textContent = data.loss.toFixed(3);
    draw();
  } else if (data.type === 'done') {
    draw();
    Object.assign(out.dataset, {
      steps: String(data.steps), heldFirst: String(data.first), heldLast: String(data.last), rate: String(data.tokensPerSecond),
    });
    status(`${data.stopped ? 'stopped' : 'done'} after ${data.steps} steps: held-out loss ${data.first.toFixed(3)} → ${data.last.toFixed(3)} nats per token, ${Math.round(data.tokensPerSecond).toLocaleString('en')} tokens/s`);
    setState('done');
  } else if (data.type === 'sampled') {
    const prompt = document.createElement('span');
    prompt.style.color = '#6b7480';
    prompt.textContent = $('lm-prompt').value;
    $('lm-sample').replaceChildren(prompt, data.text);
    out.dataset.ids = data.ids.join(',');
    setState('done');
  } else if (data.type === 'files') {
    if (data.which === 'model') save('model.rbw', new Blob([data.bytes], { type: 'application/octet-stream' }));
    else save('tokenizer.json', new Blob([data.tokenizer], { type: 'application/json' }));
  } else if (data.type === 'error') {
    status(data.message, true);
    setState(out.dataset.steps ? 'done' : 'error');
  }
};
