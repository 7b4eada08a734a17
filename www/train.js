// The Train page: builds the data set, sends it to train-worker.js, and paints the loss
// curve, the decision boundary (2-D data) and the figures the worker sends back.
import { plot } from './plot.js';
import { random } from './random.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const worker = new Worker(new URL('./train-worker.js', import.meta.url), { type: 'module' });
const out = $('train-output');
let training = false;
let losses = [];
let current = null; // the data set being trained on
let file = null; // the last trained network's file (an object)

/** Rows whose index is 4 mod 5 within their class go to the held-out set. */
function split(points, labels) {
  const seen = new Map();
  const train = { x: [], labels: [] };
  const test = { x: [], labels: [] };
  points.forEach((p, i) => {
    const k = seen.get(labels[i]) ?? 0;
    seen.set(labels[i], k + 1);
    const to = k % 5 === 4 ? test : train;
    to.x.push(p);
    to.labels.push(labels[i]);
  });
  return { train, test };
}

function xor() {
  const r = random(11);
  const points = [];
  const labels = [];
  for (let i = 0; i < 300; i++) {
    const p = [2 * r() - 1, 2 * r() - 1];
    points.push(p);
    labels.push(p[0] * p[1] > 0 ? 1 : 0);
  }
  return { points, labels, classes: ['opposite signs', 'same sign'] };
}

function spirals() {
  const r = random(5);
  const points = [];
  const labels = [];
  const n = 150;
  for (let c = 0; c < 2; c++) {
    for (let i = 0; i < n; i++) {
      const t = (i / n) * 3 * Math.PI + 0.4;
      const radius = t / (3 * Math.PI + 0.4);
      const angle = t + c * Math.PI;
      points.push([radius * Math.cos(angle) + 0.03 * (r() - 0.5), radius * Math.sin(angle) + 0.03 * (r() - 0.5)]);
      labels.push(c);
    }
  }
  return { points, labels, classes: ['arm A', 'arm B'] };
}

/** A CSV with a header row: every column but the last is a number, the last is the class. */
function parseCsv(text) {
  const lines = text.split(/\r?\n/).filter((l) => l.trim() !== '');
  if (lines.length < 3) throw new Error('the CSV needs a header row and at least two rows of data');
  const header = lines[0].split(',');
  if (header.length < 2) throw new Error('the CSV needs at least one input column and a class column');
  const points = [];
  const names = [];
  lines.slice(1).forEach((line, i) => {
    const cells = line.split(',');
    if (cells.length !== header.length) throw new Error(`CSV row ${i + 2} has ${cells.length} cells; the header has ${header.length}`);
    points.push(cells.slice(0, -1).map((c, j) => {
      const v = Number(c);
      if (c.trim() === '' || !Number.isFinite(v)) throw new Error(`CSV row ${i + 2}, column "${header[j]}": "${c}" is not a number`);
      return v;
    }));
    names.push(cells[cells.length - 1].trim());
  });
  const classes = [...new Set(names)];
  if (classes.length < 2) throw new Error('the class column has one value only');
  return { points, labels: names.map((n) => classes.indexOf(n)), classes };
}

async function loadData(kind) {
  if (kind === 'xor') return xor();
  if (kind === 'spirals') return spirals();
  if (kind === 'iris') {
    const r = await fetch('data/iris.csv');
    if (!r.ok) throw new Error(`fetching data/iris.csv: HTTP ${r.status}`);
    return parseCsv(await r.text());
  }
  const f = $('csv').files[0];
  if (!f) throw new Error('choose a CSV file first');
  return parseCsv(await f.text());
}

/** Standardized inputs (training mean and deviation), targets for the output layer. */
function prepare({ points, labels, classes }) {
  const { train, test } = split(points, labels);
  const width = points[0].length;
  const mean = Array.from({ length: width }, (_, j) => train.x.reduce((s, p) => s + p[j], 0) / train.x.length);
  const std = mean.map((m, j) => Math.sqrt(train.x.reduce((s, p) => s + (p[j] - m) ** 2, 0) / train.x.length) || 1);
  const scale = (p) => p.map((v, j) => (v - mean[j]) / std[j]);
  const two = classes.length === 2;
  const target = (k) => (two ? [k] : classes.map((_, i) => (i === k ? 1 : 0)));
  return {
    width, classes, two, scale, raw: points, labels,
    x: train.x.map(scale), y: train.labels.map(target),
    xTest: test.x.map(scale), yTest: test.labels.map(target),
  };
}

const GRID = 48;

function extent(points) {
  const xs = points.map((p) => p[0]);
  const ys = points.map((p) => p[1]);
  const pad = (lo, hi) => [lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo)];
  return [pad(Math.min(...xs), Math.max(...xs)), pad(Math.min(...ys), Math.max(...ys))];
}

/** The boundary's grid, in the network's (standardized) coordinates. */
function grid(data) {
  const [[x0, x1], [y0, y1]] = extent(data.raw);
  const cells = [];
  for (let j = 0; j < GRID; j++) {
    for (let i = 0; i < GRID; i++) {
      cells.push(data.scale([x0 + ((i + 0.5) / GRID) * (x1 - x0), y1 - ((j + 0.5) / GRID) * (y1 - y0)]));
    }
  }
  return cells;
}

function drawBoundary(values) {
  const c = $('boundary').getContext('2d');
  const { width, height } = c.canvas;
  c.clearRect(0, 0, width, height);
  if (!current || current.width !== 2 || !current.two) {
    c.fillStyle = '#5b6570';
    c.font = '13px system-ui';
    c.fillText('drawn for two inputs and two classes', 12, height / 2);
    return;
  }
  const cw = width / GRID;
  const ch = height / GRID;
  if (values) {
    // The region of the orange class (output near 1) in light orange, the blue one's in
    // light blue, mixed in between.
    const mix = (a, b, p) => Math.round(a + (b - a) * p);
    values.forEach((p, k) => {
      c.fillStyle = `rgb(${mix(200, 246, p)}, ${mix(218, 205, p)}, ${mix(242, 180, p)})`;
      c.fillRect((k % GRID) * cw, Math.floor(k / GRID) * ch, cw + 0.5, ch + 0.5);
    });
  }
  const [[x0, x1], [y0, y1]] = extent(current.raw);
  current.raw.forEach((p, i) => {
    c.fillStyle = current.labels[i] === 1 ? '#b7410e' : '#1f4e8c';
    c.beginPath();
    c.arc(((p[0] - x0) / (x1 - x0)) * width, ((y1 - p[1]) / (y1 - y0)) * height, 2.4, 0, 2 * Math.PI);
    c.fill();
  });
}

function drawLoss() {
  const n = Math.max(losses.length, Number($('epochs').value) || losses.length);
  const points = losses.map((l, i) => [i + 1, l]);
  plot($('loss'), [{ points, color: '#b7410e', width: 2 }], n, 'epoch');
}

function status(text, error = false) {
  $('status').textContent = text;
  $('status').className = error ? 'error' : '';
}

function setState(state) {
  out.dataset.state = state;
  training = state === 'training';
  $('train').disabled = training;
  $('stop').disabled = !training;
  $('download').disabled = training || file === null;
}

const DEFAULTS = {
  spirals: { layers: '16 tanh, 16 tanh', lr: 0.03, epochs: 300, batch: 16 },
  xor: { layers: '8 tanh', lr: 0.05, epochs: 100, batch: 16 },
  iris: { layers: '16 relu', lr: 0.01, epochs: 200, batch: 16 },
  csv: { layers: '16 relu', lr: 0.01, epochs: 200, batch: 16 },
};

$('dataset').addEventListener('change', () => {
  const kind = $('dataset').value;
  $('csv').disabled = kind !== 'csv';
  const d = DEFAULTS[kind];
  $('layers').value = d.layers;
  $('lr').value = d.lr;
  $('epochs').value = d.epochs;
  $('batch').value = d.batch;
});

// A CSV dropped anywhere on the Tabular tab becomes the data set.
const tabular = $('tab-tabular');
tabular.addEventListener('dragover', (e) => {
  e.preventDefault();
  e.dataTransfer.dropEffect = 'copy';
});
tabular.addEventListener('drop', (e) => {
  e.preventDefault();
  if (e.dataTransfer.files.length === 0) return;
  $('csv').files = e.dataTransfer.files;
  $('dataset').value = 'csv';
  $('dataset').dispatchEvent(new Event('change'));
  status(`${e.dataTransfer.files[0].name}: press Train`);
});

function hiddenLayers(text) {
  if (text.trim() === '') return [];
  return text.split(',').map((part) => {
    const [units, activation = 'relu'] = part.trim().split(/\s+/);
    const n = Number(units);
    if (!Number.isInteger(n) || n < 1) throw new Error(`hidden layer "${part.trim()}": write a width and an activation, like "16 relu"`);
    return { units: n, activation };
  });
}

$('train').addEventListener('click', async () => {
  try {
    file = null;
    losses = [];
    setState('training');
    status('preparing the data…');
    current = prepare(await loadData($('dataset').value));
    drawLoss();
    drawBoundary(null);
    $('boundary-caption').textContent = 'decision boundary (2-D data)';
    const layers = [
      ...hiddenLayers($('layers').value),
      current.two ? { units: 1, activation: 'sigmoid' } : { units: current.classes.length, activation: 'softmax' },
    ];
    const spec = {
      inputSize: current.width, layers, seed: Number($('seed').value),
      loss: current.two ? 'binary_cross_entropy' : 'categorical_cross_entropy',
      learningRate: Number($('lr').value), device: params.get('device') ?? $('device').value,
    };
    const fit = { epochs: Number($('epochs').value), batchSize: Number($('batch').value), seed: Number($('seed').value) };
    const twoD = current.width === 2 && current.two;
    for (const k of ['epoch', 'loss-value', 'train-accuracy', 'test-accuracy', 'rate']) $(k).textContent = '–';
    status(`training on ${current.x.length} rows, holding out ${current.xTest.length}…`);
    worker.postMessage({
      type: 'train', spec, fit, every: twoD ? 10 : 25, grid: twoD ? grid(current) : null,
      data: { x: current.x, y: current.y, xTest: current.xTest, yTest: current.yTest },
    });
  } catch (e) {
    status(String(e.message ?? e), true);
    setState('error');
  }
});

$('stop').addEventListener('click', () => {
  worker.postMessage({ type: 'stop' });
  $('stop').disabled = true;
});

$('download').addEventListener('click', () => {
  const blob = new Blob([JSON.stringify(file, null, 2)], { type: 'application/json' });
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = 'network.json';
  a.click();
  URL.revokeObjectURL(a.href);
});

// The device badge's words; the adapter's description is its tooltip.
const DEVICE_NAMES = { webgpu: 'WebGPU', cpu: 'CPU (WebAssembly)' };
const pct = (v) => `${(100 * v).toFixed(1)}%`;
let painted = 0;

worker.onmessage = ({ data }) => {
  if (data.type === 'ready') {
    $('device-badge').textContent = DEVICE_NAMES[data.device] ?? data.device;
    $('device-badge').className = `badge ${data.device}`;
    $('device-badge').title = data.reason;
    out.dataset.device = data.device;
  } else if (data.type === 'epoch') {
    losses.push(data.loss);
    out.dataset.epochs = String(data.epoch);
    out.dataset.loss = String(data.loss);
    $('epoch').textContent = data.epoch;
    $('loss-value').textContent = data.loss.toFixed(4);
    // Live: the rows of an epoch over its time, as the final figure counts them.
    if (data.ms > 0 && current) $('rate').textContent = Math.round((current.x.length * 1000) / data.ms).toLocaleString('en');
    // The curve at most once a frame.
    const now = performance.now();
    if (now - painted > 16) {
      painted = now;
      requestAnimationFrame(drawLoss);
    }
  } else if (data.type === 'boundary') {
    drawBoundary(data.values);
    $('boundary-caption').textContent = `decision boundary after ${data.epoch} epochs`;
  } else if (data.type === 'done') {
    file = data.file;
    drawLoss();
    Object.assign(out.dataset, {
      accuracy: String(data.trainAccuracy), testAccuracy: String(data.testAccuracy),
      testLoss: String(data.testLoss), rate: String(data.samplesPerSecond), epochs: String(data.epochs),
    });
    $('train-accuracy').textContent = pct(data.trainAccuracy);
    $('test-accuracy').textContent = pct(data.testAccuracy);
    $('rate').textContent = Math.round(data.samplesPerSecond).toLocaleString('en');
    status(`${data.stopped ? 'stopped' : 'done'} after ${data.epochs} epochs: held-out accuracy ${pct(data.testAccuracy)}, held-out loss ${data.testLoss.toFixed(4)}`);
    setState('done');
  } else if (data.type === 'error') {
    status(data.message, true);
    setState('error');
  }
};

drawLoss();
drawBoundary(null);
