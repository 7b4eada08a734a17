// The Train page and the package's Network in headless Chromium, with WebGPU (SwiftShader)
// and again with WebGPU unavailable (the wasm CPU path): iris trains on the page to at
// least 90% held-out accuracy; three full-batch steps from seed 7 reach the native weights
// (tests/browser/out/train-native.json, written by the browser_network example); a network
// trained natively predicts the same in the page, and one trained in the page predicts the
// same natively. Screenshots of the page mid-training and after go to tests/browser/out/.
//
// Tolerance: 1e-6 of each tensor's (or output set's) largest magnitude. The page's
// backends differ from native only in the order of f32 sums; web/tests/network.rs measures
// the same comparison natively at up to 3.4e-7.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { serve } from '../../www/serve.mjs';
import { out, repo, skip, webgpu, launch, waitForState } from './common.mjs';


let server;
let origin;
let native;

before(async () => {
  if (skip) return;
  const file = join(out, 'train-native.json');
  if (!existsSync(file)) throw new Error(`${file} is missing: run tests/browser/run.sh, which writes it with the browser_network example`);
  native = JSON.parse(readFileSync(file, 'utf8'));
  server = await serve(0);
  origin = `http://127.0.0.1:${server.address().port}`;
});

after(() => server?.close());

/** max |got - want| / max |want|, failing on a length mismatch or a non-finite value. */
function relToScale(name, got, want) {
  assert.equal(got.length, want.length, `${name}: ${got.length} values, the reference has ${want.length}`);
  let scale = 1e-30;
  for (let i = 0; i < want.length; i++) {
    assert.ok(Number.isFinite(got[i]) && Number.isFinite(want[i]), `${name}: element ${i} is ${got[i]}, the reference has ${want[i]}`);
    scale = Math.max(scale, Math.abs(want[i]));
  }
  let worst = 0;
  for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got[i] - want[i]) / scale);
  return worst;
}

function assertSameFile(name, got, want) {
  assert.equal(got.layers.length, want.layers.length);
  let worst = 0;
  got.layers.forEach((layer, l) => {
    worst = Math.max(worst, relToScale(`${name} layer ${l} weights`, layer.weights.flat(), want.layers[l].weights.flat()));
    worst = Math.max(worst, relToScale(`${name} layer ${l} bias`, layer.bias, want.layers[l].bias));
  });
  assert.ok(worst <= 1e-6, `${name}: weights differ by ${worst} of their scale`);
  return worst;
}

const open = (args, path) => launch(`${origin}/${path}`, args, { width: 1040, height: 820 });

const waitState = (page, states, logs, timeout = 180_000) => waitForState(page, 'train-output', states, logs, timeout);

async function trainOnPage(page, logs, dataset, screenshotMid) {
  await page.selectOption('#dataset', dataset);
  await page.click('#train');
  if (screenshotMid) {
    await page.waitForFunction(() => Number(document.getElementById('train-output').dataset.epochs ?? 0) >= 40, null, { timeout: 120_000 });
    await page.screenshot({ path: join(out, screenshotMid), fullPage: true });
  }
  assert.equal(await waitState(page, ['done', 'error'], logs), 'done', await page.textContent('#status'));
  return page.evaluate(() => ({ ...document.getElementById('train-output').dataset }));
}

// SwiftShader by name: "auto" leaves a software adapter for the CPU path.
for (const [name, args, device] of [['WebGPU (SwiftShader)', webgpu, 'webgpu'], ['no WebGPU: the CPU path', [], 'cpu']]) {
  test(`the Train page trains iris and the two spirals on ${name}`, { skip }, async () => {
    const { browser, page, logs } = await open(args, `train.html?device=${device}`);
    try {
      const spirals = await trainOnPage(page, logs, 'spirals', `train-${device}-spirals-mid.png`);
      await page.screenshot({ path: join(out, `train-${device}-spirals-done.png`), fullPage: true });
      assert.equal(spirals.device, device);
      const iris = await trainOnPage(page, logs, 'iris');
      await page.screenshot({ path: join(out, `train-${device}-iris-done.png`), fullPage: true });
      const rate = Number(iris.rate);
      const n = native.native_samples_per_second;
      console.log(`${name}: spirals held-out accuracy ${(100 * spirals.testAccuracy).toFixed(1)}% after ${spirals.epochs} epochs; `
        + `iris ${(100 * iris.testAccuracy).toFixed(1)}% (held-out loss ${Number(iris.testLoss).toFixed(4)}), `
        + `training ${rate.toFixed(0)} samples/s in the page against native ${n.one_thread.toFixed(0)} on one thread `
        + `(${(rate / n.one_thread).toFixed(3)}x) and ${n.all_threads.toFixed(0)} on ${n.threads}`);
      assert.equal(iris.device, device);
      assert.equal(Number(iris.epochs), 200);
      assert.ok(Number(iris.testAccuracy) >= 0.9, `iris held-out accuracy ${iris.testAccuracy}`);
      assert.ok(Number(spirals.testAccuracy) >= 0.9, `spirals held-out accuracy ${spirals.testAccuracy}`);
    } finally {
      await browser.close();
    }
  });

  test(`the page's Network and native Rust agree on ${name}`, { skip }, async () => {
    const { browser, page, logs } = await open(args, 'train.html');
    try {
      const got = await page.evaluate(async ({ native, device }) => {
        const { Network } = await import('/pkg/index.js');
        const build = () => Network.builder().inputSize(4).dense(16, 'relu').dense(3, 'softmax')
          .loss('categorical_cross_entropy').optimizer({ kind: 'adam', learningRate: 0.01 }).seed(7).device(device).build();
        const { x, y } = native.train;
        // Three full-batch steps from seed 7, as the native fixture took them.
        const three = await build();
        const losses = Array.from(await three.fit(x, y, { epochs: 3, batchSize: x.length, shuffle: false, seed: 0 }));
        // A natively trained network, loaded here.
        const loaded = await Network.fromJSON(native.trained.file, { device });
        const loadedOut = (await loaded.predict(native.test.x)).map((r) => Array.from(r));
        // A network trained here, for native to load.
        const mine = await build();
        await mine.fit(x, y, { epochs: 30, batchSize: 16, seed: 3 });
        const mineOut = (await mine.predict(native.test.x)).map((r) => Array.from(r));
        return {
          devices: [three.device(), loaded.device(), mine.device()], losses, threeFile: three.toJSON(),
          loadedOut, mineFile: JSON.stringify(mine, null, 2), mineOut,
        };
      }, { native, device });
      assert.deepEqual(got.devices, [device, device, device], logs.join('\n'));
      const lossRel = relToScale('three-step losses', got.losses, native.three_steps.losses);
      assert.ok(lossRel <= 1e-6, `losses ${got.losses} against native ${native.three_steps.losses}`);
      const three = assertSameFile('after three full-batch steps', got.threeFile, native.three_steps.file);
      const loaded = relToScale('page predictions of the native network', got.loadedOut.flat(), native.trained.predictions.flat());
      assert.ok(loaded <= 1e-6, `${loaded}`);
      // Native predictions of the page's network.
      const netFile = join(out, `page-trained-${device}.json`);
      const rowsFile = join(out, 'iris-test-rows.json');
      writeFileSync(netFile, got.mineFile);
      writeFileSync(rowsFile, JSON.stringify(native.test.x));
      const stdout = execFileSync('cargo', ['run', '-q', '--profile', 'test', '-p', 'rusting_brain', '--example', 'browser_network', '--', 'predict', netFile, rowsFile], { cwd: repo, encoding: 'utf8' });
      const nativeOut = JSON.parse(stdout.trim().split('\n').pop());
      const moved = relToScale('native predictions of the page network', nativeOut.flat(), got.mineOut.flat());
      assert.ok(moved <= 1e-6, `${moved}`);
      console.log(`${name}: three steps ${three.toExponential(1)} of the scale from native, native network in the page ${loaded.toExponential(1)}, page network natively ${moved.toExponential(1)}`);
    } finally {
      await browser.close();
    }
  });
}

// The Text tab: a tokenizer and a tiny language model trained on the bundled excerpt, on
// WebGPU and on the CPU path, the held-out loss falling (by half a nat on the CPU path in
// 150 steps of 8 x 64 tokens; SwiftShader, a CPU emulation of a GPU, trains some 25 times
// slower, so there 16 steps of 4 x 32 at a higher rate, and a third of a nat); the
// downloaded model.rbw and tokenizer.json give native int8 decoding (language_model
// generate --q8) the page's greedy ids.
const textRuns = [
  ['WebGPU (SwiftShader)', webgpu, 'webgpu', { steps: 16, batch: 4, seq: 32, lr: 0.006, fall: 0.33 }],
  ['no WebGPU: the CPU path', [], 'cpu', { steps: 150, batch: 8, seq: 64, lr: 0.003, fall: 0.5 }],
];
for (const [name, args, device, run] of textRuns) {
  const { steps } = run;
  test(`the Text tab trains a language model on ${name}, and native Rust decodes its file the same`, { skip }, async () => {
    const { browser, page, logs } = await open(args, `train.html?device=${device}#text`);
    const tag = device;
    try {
      await page.waitForFunction(() => Number(document.getElementById('text-output').dataset.excerpt ?? 0) > 0, null, { timeout: 30_000 });
      await page.fill('#lm-steps', String(steps));
      await page.fill('#lm-every', String(Math.round(steps / 3)));
      await page.fill('#lm-batch', String(run.batch));
      await page.fill('#lm-seq', String(run.seq));
      await page.fill('#lm-lr', String(run.lr));
      await page.click('#lm-train');
      await page.waitForFunction((n) => Number(document.getElementById('text-output').dataset.step ?? 0) >= n, Math.round(steps / 3), { timeout: 180_000 });
      await page.screenshot({ path: join(out, `train-text-${tag}-mid.png`), fullPage: true });
      try {
        await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('text-output').dataset.state), null, { timeout: 300_000 });
      } catch {
        throw new Error(`training never ended: ${await page.textContent('#lm-status')}; console:\n${logs.join('\n')}`);
      }
      const trained = await page.evaluate(() => ({ ...document.getElementById('text-output').dataset }));
      assert.equal(trained.state, 'done', await page.textContent('#lm-status'));
      await page.fill('#lm-prompt', 'fn main() {');
      await page.fill('#lm-temperature', '0');
      await page.click('#lm-generate');
      await page.waitForFunction(() => document.getElementById('text-output').dataset.ids !== undefined
        && document.getElementById('text-output').dataset.state === 'done', null, { timeout: 60_000 });
      const ids = (await page.getAttribute('#text-output', 'data-ids')).split(',').filter((s) => s !== '').map(Number);
      await page.screenshot({ path: join(out, `train-text-${tag}-done.png`), fullPage: true });
      const dir = join(out, `page-lm-${tag}`);
      mkdirSync(dir, { recursive: true });
      for (const [button, file] of [['#lm-download-model', 'model.rbw'], ['#lm-download-tokenizer', 'tokenizer.json']]) {
        const [download] = await Promise.all([page.waitForEvent('download'), page.click(button)]);
        await download.saveAs(join(dir, file));
      }
      const first = Number(trained.heldFirst);
      const last = Number(trained.heldLast);
      const n = native.native_lm_tokens_per_second;
      const rate = Number(trained.rate);
      console.log(`${name}: held-out loss ${first.toFixed(3)} -> ${last.toFixed(3)} over ${trained.steps} steps on ${trained.device}; `
        + `training ${rate.toFixed(0)} tokens/s in the page against native ${n.one_thread.toFixed(0)} on one thread (${(rate / n.one_thread).toFixed(2)}x) `
        + `and ${n.all_threads.toFixed(0)} on ${n.threads}; greedy ids ${ids.length}`);
      assert.equal(trained.device, device, logs.join('\n'));
      assert.equal(Number(trained.steps), steps);
      assert.ok(last < first - run.fall, `the held-out loss fell by less than ${run.fall} nats: ${first} -> ${last}`);
      assert.ok(ids.length > 0, 'the page generated');
      const stdout = execFileSync('cargo', ['run', '-q', '--profile', 'test', '-p', 'rusting_brain', '--features', 'gpu', '--example', 'language_model', '--',
        'generate', 'fn main() {', '--from', dir, '--q8', '--temperature', '0', '--repetition-penalty', '1', '--tokens', '48', '--ids'], { cwd: repo, encoding: 'utf8' });
      const nativeIds = JSON.parse(stdout.trim().split('\n').pop()).ids;
      assert.deepEqual(ids, nativeIds, 'native int8 greedy ids of the downloaded file equal the page\'s');
    } finally {
      await browser.close();
    }
  });
}

// Stop ends a run on both tabs, and the page answers while the worker trains: ten frames
// are drawn on each tab while the run is still going (the longest wait is printed, not
// bounded: a time is this machine's, and the point is that training never holds the page's
// thread).
test('Stop stops training on both tabs, and the page stays responsive meanwhile', { skip }, async () => {
  const { browser, page, logs } = await open([], 'train.html?device=cpu');
  try {
    const frameWait = () => page.evaluate(() => new Promise((resolve) => {
      const t0 = performance.now();
      requestAnimationFrame(() => resolve(performance.now() - t0));
    }));
    await page.selectOption('#dataset', 'spirals');
    await page.fill('#epochs', '100000');
    await page.click('#train');
    await page.waitForFunction(() => Number(document.getElementById('train-output').dataset.epochs ?? 0) >= 20, null, { timeout: 60_000 });
    const waits = [];
    for (let i = 0; i < 10; i++) waits.push(await frameWait());
    assert.equal(await page.getAttribute('#train-output', 'data-state'), 'training', 'the frames came while it trained');
    await page.click('#stop');
    assert.equal(await waitState(page, ['done', 'error'], logs), 'done');
    const epochs = Number(await page.getAttribute('#train-output', 'data-epochs'));
    assert.ok(epochs < 100000, `${epochs} epochs ran`);
    assert.match(await page.textContent('#status'), /^stopped after/);

    await page.click('#tab-text-button');
    await page.waitForFunction(() => Number(document.getElementById('text-output').dataset.excerpt ?? 0) > 0, null, { timeout: 30_000 });
    await page.fill('#lm-steps', '100000');
    await page.click('#lm-train');
    await page.waitForFunction(() => Number(document.getElementById('text-output').dataset.step ?? 0) >= 5, null, { timeout: 60_000 });
    for (let i = 0; i < 10; i++) waits.push(await frameWait());
    assert.equal(await page.getAttribute('#text-output', 'data-state'), 'training', 'the frames came while it trained');
    await page.click('#lm-stop');
    await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('text-output').dataset.state), null, { timeout: 60_000 });
    assert.equal(await page.getAttribute('#text-output', 'data-state'), 'done', await page.textContent('#lm-status'));
    const steps = Number(await page.getAttribute('#text-output', 'data-steps'));
    assert.ok(steps < 100000, `${steps} steps ran`);
    assert.match(await page.textContent('#lm-status'), /^stopped after/);
    const worst = Math.max(...waits);
    console.log(`while training: the longest of 20 waits for a frame ${worst.toFixed(0)} ms; stopped after ${epochs} epochs and ${steps} steps`);
  } finally {
    await browser.close();
  }
});

// A CSV of the user's: dropped on the Tabular tab it trains (iris' rows, written here with
// other column names and the class first-seen order shuffled); a malformed one is an error
// on the page naming the row and column.
test('a dropped CSV trains, and a malformed one is an error naming the cell', { skip }, async () => {
  const { browser, page, logs } = await open([], 'train.html?device=cpu');
  try {
    const iris = readFileSync(join(repo, 'www', 'data', 'iris.csv'), 'utf8').trim().split('\n');
    const rows = iris.slice(1).reverse();
    const good = ['a,b,c,d,kind', ...rows].join('\n');
    const bad = ['a,b,c,d,kind', rows[0], rows[1].replace(/^[^,]*/, 'wide'), ...rows.slice(2)].join('\n');
    const drop = (text) => page.evaluate((csv) => {
      const data = new DataTransfer();
      data.items.add(new File([csv], 'mine.csv', { type: 'text/csv' }));
      const tab = document.getElementById('tab-tabular');
      tab.dispatchEvent(new DragEvent('dragover', { dataTransfer: data, bubbles: true, cancelable: true }));
      tab.dispatchEvent(new DragEvent('drop', { dataTransfer: data, bubbles: true, cancelable: true }));
    }, text);
    await drop(bad);
    assert.equal(await page.inputValue('#dataset'), 'csv');
    await page.click('#train');
    assert.equal(await waitState(page, ['done', 'error'], logs), 'error');
    assert.match(await page.textContent('#status'), /CSV row 3, column "a": "wide" is not a number/);
    await drop(good);
    await page.click('#train');
    assert.equal(await waitState(page, ['done', 'error'], logs), 'done', await page.textContent('#status'));
    const got = await page.evaluate(() => ({ ...document.getElementById('train-output').dataset }));
    console.log(`a dropped CSV (iris, reordered): held-out accuracy ${(100 * got.testAccuracy).toFixed(1)}% after ${got.epochs} epochs`);
    assert.ok(Number(got.testAccuracy) >= 0.9, `held-out accuracy ${got.testAccuracy}`);
  } finally {
    await browser.close();
  }
});
