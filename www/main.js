// The page: controls and output. The model lives in worker.js, so the page never freezes
// while a token is computed; this file only sends requests and paints what comes back.
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });

const output = $('output');
const go = $('go');
let generating = false;
let ids = [];

for (const [input, shown] of [['temperature', 'temperature-value'], ['topk', 'topk-value'], ['topp', 'topp-value'], ['max', 'max-value']]) {
  const update = () => { $(shown).textContent = $(input).value; };
  $(input).addEventListener('input', update);
  update();
}

// What the device badge says; the adapter's description (or why the CPU path runs) is
// behind it, in its tooltip and the "device details" line.
const DEVICE_NAMES = { webgpu: 'WebGPU', cpu: 'CPU (WebAssembly)' };

function showDevice(device, reason) {
  $('device').textContent = DEVICE_NAMES[device] ?? device;
  $('device').className = `badge ${device}`;
  $('device').title = reason;
  $('device-reason').textContent = reason;
  $('device-details').hidden = false;
}

function status(text, error = false) {
  $('status').textContent = text;
  $('status').className = error ? 'error' : '';
}

function setState(state) {
  output.dataset.state = state;
  go.textContent = state === 'generating' ? 'Stop' : 'Generate';
  go.disabled = state === 'loading' || state === 'error';
}

go.addEventListener('click', () => {
  if (generating) {
    worker.postMessage({ type: 'stop' });
    go.disabled = true;
    return;
  }
  generating = true;
  ids = [];
  output.dataset.ids = '';
  output.replaceChildren();
  const prompt = document.createElement('span');
  prompt.className = 'prompt';
  prompt.textContent = $('prompt').value;
  output.append(prompt);
  $('rate').textContent = '–';
  $('first').textContent = '–';
  $('count').textContent = '0';
  setState('generating');
  status('generating…');
  const temperature = Number($('temperature').value);
  worker.postMessage({
    type: 'generate',
    prompt: $('prompt').value,
    options: {
      maxTokens: Number($('max').value),
      temperature,
      topK: Number($('topk').value),
      topP: Number($('topp').value),
      repetitionPenalty: temperature > 0 ? 1.1 : 1,
      seed: params.has('seed') ? Number(params.get('seed')) : undefined,
    },
  });
});

worker.onmessage = ({ data }) => {
  switch (data.type) {
    case 'progress': {
      $('load').max = data.total || 1;
      $('load').value = data.loaded;
      const mb = (x) => (x / 1e6).toFixed(1);
      status(data.total ? `loading the model… ${mb(data.loaded)} of ${mb(data.total)} MB` : `loading the model… ${mb(data.loaded)} MB`);
      break;
    }
    case 'loaded': {
      showDevice(data.device, data.reason);
      output.dataset.device = data.device;
      $('load').hidden = true;
      // A reply cannot outgrow the context: the prompt and the new tokens share it.
      const context = data.info.maxSeqLen;
      const cap = Math.max(1, Math.min(Number($('max').max), context - 1));
      $('max').max = String(cap);
      if (Number($('max').value) > cap) $('max').value = String(cap);
      $('max-value').textContent = $('max').value;
      $('max-note').textContent = `the model's context is ${context} tokens, prompt included`;
      const mb = (data.bytes / 1e6).toFixed(2);
      status(`model loaded: ${(data.info.parameters / 1e6).toFixed(2)}M parameters, ${mb} MB int8, in ${data.ms.toFixed(0)} ms`);
      setState('idle');
      break;
    }
    case 'tokens': {
      ids.push(...data.ids);
      // Kept at the bottom while the reader has not scrolled up.
      const atBottom = output.scrollHeight - output.scrollTop - output.clientHeight < 24;
      output.append(data.text);
      if (atBottom) output.scrollTop = output.scrollHeight;
      $('count').textContent = String(ids.length);
      if (data.firstMs !== null) $('first').textContent = `${data.firstMs.toFixed(0)} ms`;
      if (ids.length > 1 && data.lastMs > data.firstMs) {
        $('rate').textContent = (((ids.length - 1) * 1000) / (data.lastMs - data.firstMs)).toFixed(1);
      }
      break;
    }
    case 'done': {
      generating = false;
      const r = data.result;
      output.dataset.ids = ids.join(',');
      $('rate').textContent = Number.isFinite(r.tokensPerSecond) ? r.tokensPerSecond.toFixed(1) : '–';
      $('first').textContent = Number.isFinite(r.firstTokenMs) ? `${r.firstTokenMs.toFixed(0)} ms` : '–';
      $('count').textContent = String(r.tokens);
      output.dataset.rate = String(r.tokensPerSecond);
      output.dataset.first = String(r.firstTokenMs);
      output.dataset.finish = r.finish;
      status(`done (${r.finish}): ${r.tokens} tokens`);
      setState('done');
      break;
    }
    case 'error': {
      generating = false;
      status(data.message, true);
      if (data.fatal) $('load').hidden = true;
      setState(data.fatal ? 'error' : 'done');
      break;
    }
  }
};

worker.postMessage({
  type: 'load',
  device: params.get('device') ?? 'auto',
  weights: params.get('model') ?? 'models/model.rbw',
  tokenizer: params.get('tokenizer') ?? 'models/tokenizer.json',
});
