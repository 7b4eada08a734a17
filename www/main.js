// The page: controls and output. The model lives in worker.js, so the page never freezes
// while a token is computed; this file only sends requests and paints what comes back.
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });

const output = $('output');
const go = $('go');
let generating = false;
let ids = [];
// A model with a chat template (a GGUF file's) is talked to a turn at a time: the prompt
// box holds the next message, the output the conversation, and the new tokens go to
// `target`, the reply being written.
let chatMode = false;
let target = output;

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
  go.textContent = state === 'generating' ? 'Stop' : chatMode ? 'Send' : 'Generate';
  go.disabled = state === 'loading' || state === 'error';
  $('new-chat').disabled = state !== 'idle' && state !== 'done';
}

function turn(role, text) {
  const div = document.createElement('div');
  div.className = `turn ${role}`;
  div.textContent = text;
  output.append(div);
  output.scrollTop = output.scrollHeight;
  return div;
}

go.addEventListener('click', () => {
  if (generating) {
    worker.postMessage({ type: 'stop' });
    go.disabled = true;
    return;
  }
  const text = $('prompt').value;
  if (chatMode && text.trim() === '') return;
  generating = true;
  ids = [];
  output.dataset.ids = '';
  if (chatMode) {
    turn('user', text);
    target = turn('assistant', '');
    $('prompt').value = '';
  } else {
    output.replaceChildren();
    const prompt = document.createElement('span');
    prompt.className = 'prompt';
    prompt.textContent = text;
    output.append(prompt);
    target = output;
  }
  $('rate').textContent = '–';
  $('first').textContent = '–';
  $('count').textContent = '0';
  setState('generating');
  status('generating…');
  const temperature = Number($('temperature').value);
  worker.postMessage({
    type: 'generate',
    chat: chatMode,
    prompt: text,
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
      chatMode = data.chat;
      $('new-chat').hidden = !chatMode;
      if (chatMode) {
        output.replaceChildren();
        $('prompt').value = params.get('message') ?? 'What is the capital of France?';
        $('prompt').rows = 2;
      }
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
      const what = data.name?.endsWith('.gguf') ? `${data.name} (${mb} MB GGUF, run in int8)` : `${mb} MB int8`;
      const talk = chatMode ? '; chat template from the file: each turn only the new tokens are fed' : '';
      status(`model loaded: ${(data.info.parameters / 1e6).toFixed(2)}M parameters, ${what}, in ${data.ms.toFixed(0)} ms${talk}`);
      setState('idle');
      break;
    }
    case 'tokens': {
      ids.push(...data.ids);
      // Kept at the bottom while the reader has not scrolled up.
      const atBottom = output.scrollHeight - output.scrollTop - output.clientHeight < 24;
      target.append(data.text);
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
      output.dataset.reply = r.text;
      output.dataset.fed = String(r.promptTokens);
      output.dataset.reused = String(r.reusedTokens ?? 0);
      const fed = chatMode ? `; ${r.promptTokens} tokens fed, ${r.reusedTokens} kept from earlier turns` : '';
      status(`done (${r.finish}): ${r.tokens} tokens${fed}`);
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

// A new model: from a chosen or dropped GGUF file, or by URL.
function load(source) {
  if (generating) worker.postMessage({ type: 'stop' });
  generating = false;
  chatMode = false;
  output.replaceChildren();
  $('load').hidden = false;
  $('load').value = 0;
  $('new-chat').hidden = true;
  setState('loading');
  status(source.file ? `reading ${source.file.name}…` : 'loading the model…');
  worker.postMessage({ type: 'load', device: params.get('device') ?? 'auto', ...source });
}

$('new-chat').addEventListener('click', () => {
  worker.postMessage({ type: 'reset' });
  output.replaceChildren();
  status('a new conversation');
});

$('file').addEventListener('change', () => {
  const file = $('file').files[0];
  if (file) load({ file });
});

// A file dropped anywhere on the page.
document.addEventListener('dragover', (e) => {
  e.preventDefault();
  document.body.classList.add('dropping');
});
document.addEventListener('dragleave', (e) => {
  if (e.relatedTarget === null) document.body.classList.remove('dropping');
});
document.addEventListener('drop', (e) => {
  e.preventDefault();
  document.body.classList.remove('dropping');
  const file = e.dataTransfer?.files?.[0];
  if (file) load({ file });
});

if (params.has('gguf')) load({ gguf: params.get('gguf') });
else {
  load({
    weights: params.get('model') ?? 'models/model.rbw',
    tokenizer: params.get('tokenizer') ?? 'models/tokenizer.json',
  });
}
