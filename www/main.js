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
    case 'loaded': {
      $('device').textContent = data.device;
      $('device').className = `badge ${data.device}`;
      $('device').title = data.reason;
      output.dataset.device = data.device;
      const mb = (data.bytes / 1e6).toFixed(2);
      status(`model loaded: ${(data.info.parameters / 1e6).toFixed(2)}M parameters, ${mb} MB int8, in ${data.ms.toFixed(0)} ms — ${data.reason}`);
      setState('idle');
      break;
    }
    case 'tokens': {
      ids.push(...data.ids);
      output.append(data.text);
      $('count').textContent = String(ids.length);
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
