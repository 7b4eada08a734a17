// The npm package as an app gets it: `npm pack web/pkg`, install the tarball into a
// scratch app, import 'rusting-brain' there and run it under Node (no WebGPU, so the CPU
// path): the greedy ids equal the native CPU int8 ids, a seed repeats, turns continue;
// a dense Network trains, predicts and round-trips its file; bad input is an Error, not
// a trap.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, writeFile, readdir, mkdir, stat } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repo, out, models, reference, promptRuns, PROMPT, TOKENS } from './common.mjs';

let packed = null;

/** `npm pack web/pkg` installed into a scratch app (once for the file's tests). */
function packedApp() {
  packed ??= (async () => {
    await mkdir(out, { recursive: true });
    const app = await mkdtemp(join(tmpdir(), 'rb-npm-app-'));
    const listing = execFileSync('npm', ['pack', join(repo, 'web', 'pkg'), '--pack-destination', app, '--json'], { encoding: 'utf8' });
    const tarball = join(app, JSON.parse(listing)[0].filename);
    await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'scratch-app', private: true, type: 'module' }));
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', tarball], { cwd: app, stdio: 'inherit' });
    assert.ok((await readdir(join(app, 'node_modules', 'rusting-brain', 'dist'))).includes('rusting_brain_bg.wasm'));
    return app;
  })();
  return packed;
}

test('the packed npm package runs the CPU path under Node', async () => {
  const want = await reference();
  const app = await packedApp();
  await writeFile(join(app, 'main.mjs'), `
import { loadModel } from 'rusting-brain';
import { readFile } from 'node:fs/promises';
const weights = await readFile(${JSON.stringify(join(models, 'model.rbw'))});
const tokenizer = await readFile(${JSON.stringify(join(models, 'tokenizer.json'))}, 'utf8');
const t0 = performance.now();
const model = await loadModel(weights, tokenizer);
const loadMs = performance.now() - t0;
const streamed = [];
const greedy = await model.generate(${JSON.stringify(PROMPT)}, { maxTokens: ${TOKENS} }, (text, id) => { streamed.push(id); });
const sampled = [];
for (let i = 0; i < 2; i++) {
  const r = await model.generate(${JSON.stringify(PROMPT)}, { maxTokens: 24, temperature: 0.9, topK: 40, topP: 0.95, repetitionPenalty: 1.1, seed: 1234 });
  sampled.push(Array.from(r.ids));
}
const controller = new AbortController();
const aborted = await model.generate(${JSON.stringify(PROMPT)}, { maxTokens: 20, stopAtEnd: false, signal: controller.signal }, () => { controller.abort(); });
const first = await model.chat('fn add(a: i32, b: i32) -> i32 {', { maxTokens: 8, stopAtEnd: false });
const second = await model.chat('\\n', { maxTokens: 8, stopAtEnd: false });
const errors = {};
const expectError = async (name, f) => {
  try { await f(); errors[name] = 'no error'; } catch (e) { errors[name] = (e instanceof Error ? 'Error: ' : 'not an Error: ') + e.message; }
};
await expectError('corrupt', () => loadModel(weights.subarray(0, weights.length >> 1), tokenizer));
await expectError('tokenizer', () => loadModel(weights, '{"not": "a tokenizer"}'));
await expectError('device', () => loadModel(weights, tokenizer, { device: 'tpu' }));
await expectError('webgpu', () => loadModel(weights, tokenizer, { device: 'webgpu' }));
await expectError('decode', () => model.decode([1, 1e9]));
await expectError('options', () => model.generate('x', { temperature: 'hot' }));
await expectError('sampler', () => model.generate('x', { temperature: 0.5, topP: 1.5 }));
await expectError('callback', () => model.generate('x', { maxTokens: 4 }, () => { throw new Error('boom'); }));
model.dispose();
await expectError('disposed', () => model.generate('x'));
console.log(JSON.stringify({
  device: model.device(), reason: model.deviceReason(), loadMs,
  ids: Array.from(greedy.ids), streamed, text: greedy.text, rate: greedy.tokensPerSecond, firstTokenMs: greedy.firstTokenMs,
  sampled, turns: [first.tokens, second.tokens, first.promptTokens], errors,
  aborted: [aborted.tokens, aborted.finish],
}));
`);
  const stdout = execFileSync('node', ['main.mjs'], { cwd: app, encoding: 'utf8' });
  const got = JSON.parse(stdout.trim().split('\n').pop());
  console.log(`Node CPU path: ${got.rate.toFixed(1)} tokens/s, first token ${got.firstTokenMs.toFixed(0)} ms, load ${got.loadMs.toFixed(0)} ms; ${got.reason}`);
  assert.equal(got.device, 'cpu');
  assert.match(got.reason, /WebGPU/);
  assert.deepEqual(got.ids, want.ids, 'greedy ids equal the native CPU int8 ids');
  assert.deepEqual(got.streamed, got.ids, 'onToken saw every id');
  assert.deepEqual(got.sampled[0], got.sampled[1], 'a seed repeats');
  assert.deepEqual(got.aborted, [1, 'stopped'], 'an AbortSignal stops after the current token');
  assert.equal(got.turns[0], 8);
  assert.equal(got.turns[1], 8);
  for (const [name, message] of Object.entries(got.errors)) {
    assert.match(message, /^Error: /, `${name}: ${message}`);
  }
  assert.match(got.errors.corrupt, /bad model file/);
  assert.match(got.errors.tokenizer, /tokenizer/);
  assert.match(got.errors.device, /tpu/);
  assert.match(got.errors.webgpu, /WebGPU/);
  assert.match(got.errors.decode, /vocabulary/);
  assert.match(got.errors.options, /temperature/);
  assert.match(got.errors.sampler, /options\.topP/);
  assert.match(got.errors.callback, /boom/);
  assert.match(got.errors.disposed, /disposed/);
});

// The 4-bit demo file under Node: the native 4-bit model's greedy ids and its download
// beside int8's (printed).
test('the packed npm package runs the 4-bit model under Node', async () => {
  const want = await reference('reference-q4');
  const app = await packedApp();
  const [q8, q4] = await Promise.all(['model.rbw', 'model.q4.rbw'].map((f) => stat(join(models, f))));
  console.log(`demo model downloads: int8 ${(q8.size / 1e6).toFixed(2)} MB, 4-bit ${(q4.size / 1e6).toFixed(2)} MB (${(q4.size / q8.size).toFixed(2)}x)`);
  await writeFile(join(app, 'q4.mjs'), `
import { loadModel } from 'rusting-brain';
import { readFile } from 'node:fs/promises';
const weights = await readFile(${JSON.stringify(join(models, 'model.q4.rbw'))});
const tokenizer = await readFile(${JSON.stringify(join(models, 'tokenizer.json'))}, 'utf8');
const model = await loadModel(weights, tokenizer);
const greedy = await model.generate(${JSON.stringify(PROMPT)}, { maxTokens: ${TOKENS} });
console.log(JSON.stringify({ device: model.device(), ids: Array.from(greedy.ids), rate: greedy.tokensPerSecond }));
`);
  const got = JSON.parse(execFileSync('node', ['q4.mjs'], { cwd: app, encoding: 'utf8' }).trim().split('\n').pop());
  console.log(`Node CPU path, 4-bit: ${got.rate.toFixed(1)} tokens/s`);
  assert.equal(got.device, 'cpu');
  assert.deepEqual(got.ids, want.ids, 'greedy ids equal the native CPU 4-bit ids');
  assert.ok(q4.size < q8.size, `the 4-bit file (${q4.size} bytes) is smaller than int8's (${q8.size})`);
});

// A GGUF file under Node, as an app loads it: llama.cpp's Qwen2 Q8_0 fixture (its tokenizer
// and ChatML template in the file), two chat turns, the second fed only what follows the
// first turn in the cache where the random model's reply reads back as the ids it drew;
// then SmolLM2-135M-Instruct's GGUF where run.sh fetched it, which must answer the France
// question with Paris and keep that turn for the next. A file that is not a model is an
// Error.
test('the packed npm package chats with a GGUF file under Node', async () => {
  const app = await packedApp();
  const smol = join(models, 'smollm2', 'model.q4_1.gguf');
  await writeFile(join(app, 'gguf.mjs'), `
import { loadModel } from 'rusting-brain';
import { readFile } from 'node:fs/promises';
const bytes = await readFile(${JSON.stringify(join(repo, 'tests', 'fixtures', 'gguf_llama_cpp', 'qwen2.q8_0.gguf'))});
const model = await loadModel(new Blob([bytes]), { context: 120 });  // a Blob, as a page's File is
const template = model.chatTemplate();
const first = await model.chatTurn('Hello there', { maxTokens: 6, system: 'Be brief.' });
const second = await model.chatTurn('And again', { maxTokens: 6 });
const out = { device: model.device(), context: model.info().maxSeqLen, template, first, second, messages: model.messages() };
let bad = '';
try { await loadModel(new TextEncoder().encode('GGUF not really a model')); } catch (e) { bad = e.message; }
out.bad = bad;
if (${JSON.stringify(existsSync(smol))}) {
  const smol = await loadModel(await readFile(${JSON.stringify(smol)}));
  out.smol = await smol.chatTurn('What is the capital of France?', { maxTokens: 12 });
  out.smol2 = await smol.chatTurn('And the capital of Italy?', { maxTokens: 12 });
}
for (const r of [out.first, out.second, out.smol, out.smol2]) if (r) r.ids = Array.from(r.ids);
console.log(JSON.stringify(out));
`);
  const got = JSON.parse(execFileSync('node', ['gguf.mjs'], { cwd: app, encoding: 'utf8' }).trim().split('\n').pop());
  assert.equal(got.device, 'cpu');
  assert.equal(got.context, 120, 'options.context cuts the file\'s context of 128');
  assert.match(got.template, /<\|im_start\|>/);
  assert.equal(got.first.reusedTokens, 0);
  // A random model's reply may not read back as the ids it drew; then the turn reads the
  // whole conversation again (the reuse itself is checked exactly in web/tests/gguf.rs).
  if (got.second.reusedTokens > 0) {
    assert.equal(got.second.reusedTokens, got.first.promptTokens + got.first.ids.length, 'the first turn stays in the cache');
    assert.ok(got.second.promptTokens < got.first.promptTokens, JSON.stringify(got.second));
  } else {
    assert.ok(got.second.promptTokens > got.first.promptTokens + got.first.ids.length, JSON.stringify(got.second));
  }
  assert.deepEqual(got.messages.map((m) => m.role), ['system', 'user', 'assistant', 'user', 'assistant']);
  assert.equal(got.messages[2].content, got.first.text);
  assert.match(got.bad, /bad model file: /);
  if (got.smol) {
    console.log(`SmolLM2 GGUF under Node: ${JSON.stringify(got.smol.text)} (${got.smol.tokensPerSecond.toFixed(1)} tokens/s)`);
    assert.match(got.smol.text, /Paris/);
    assert.equal(got.smol2.reusedTokens, got.smol.promptTokens + got.smol.ids.length, 'the first turn stays in the cache');
    assert.ok(got.smol2.promptTokens < 20, JSON.stringify(got.smol2));
  } else {
    console.log('SKIPPED SmolLM2 under Node: run.sh fetched no GGUF');
  }
});

// Twenty prompts, greedy to the demo model's context, int8 and 4-bit: Node gives the native
// ids, and the native SIMD paths agree with each other, as measured: AVX2 with AVX-512 on
// all; the baseline loops, whose f32 parts sum in another order, and Node, which sums them
// as the baseline does, on at least 19 of 20 (one 4-bit run, "enum IpAddr {", parts at its
// 45th token, a near-tie, on the host that measured it) and the baseline's ids on all.
test('twenty prompts: Node and every native SIMD path give the same greedy ids, int8 and 4-bit', async () => {
  const app = await packedApp();
  for (const precision of ['q8', 'q4']) {
    const want = await promptRuns(precision);
    const file = precision === 'q4' ? 'model.q4.rbw' : 'model.rbw';
    await writeFile(join(app, 'prompts.mjs'), `
import { loadModel } from 'rusting-brain';
import { readFile } from 'node:fs/promises';
const weights = await readFile(${JSON.stringify(join(models, file))});
const tokenizer = await readFile(${JSON.stringify(join(models, 'tokenizer.json'))}, 'utf8');
const model = await loadModel(weights, tokenizer);
const runs = [];
for (const p of ${JSON.stringify(want.prompts)}) runs.push(Array.from((await model.generate(p, { maxTokens: 128 })).ids));
console.log(JSON.stringify(runs));
`);
    const got = JSON.parse(execFileSync('node', ['prompts.mjs'], { cwd: app, encoding: 'utf8' }).trim().split('\n').pop());
    const same = got.filter((ids, i) => JSON.stringify(ids) === JSON.stringify(want.ids[i])).length;
    const agree = {};
    for (const isa of ['avx2', 'baseline']) {
      const other = (await promptRuns(precision, isa)).ids;
      agree[isa] = other.filter((ids, i) => JSON.stringify(ids) === JSON.stringify(want.ids[i])).length;
    }
    console.log(`${precision}, 20 prompts (${want.ids.reduce((n, r) => n + r.length, 0)} tokens): Node ${same}/20 equal to native AVX-512; AVX2 ${agree.avx2}/20, baseline ${agree.baseline}/20`);
    // A run that parts from AVX-512's must be the baseline loops' run exactly: the
    // quantized products are the same bits on every path, and the wasm CPU path sums its
    // f32 parts (attention, norms) as the baseline loops do, so only a near-tie that
    // summation order decides may part them.
    const baseline = (await promptRuns(precision, 'baseline')).ids;
    for (let i = 0; i < got.length; i++) {
      const key = JSON.stringify(got[i]);
      assert.ok(key === JSON.stringify(want.ids[i]) || key === JSON.stringify(baseline[i]),
        `${precision}, prompt ${JSON.stringify(want.prompts[i])}: neither the AVX-512 nor the baseline run's ids`);
    }
    assert.ok(same >= 19, `${precision}: Node against AVX-512, ${same}/20`);
    assert.equal(agree.avx2, 20, `${precision}: AVX2 against AVX-512`);
    assert.ok(agree.baseline >= 19, `${precision}: the baseline loops against AVX-512, ${agree.baseline}/20`);
  }
});

// The same twenty prompts on native wgpu, int8 and 4-bit (run.sh writes them where an
// adapter, lavapipe included, exists): the WGSL kernels' integer sums are the same
// integers, their f32 parts sum in the shaders' order.
for (const precision of ['q8', 'q4']) {
  test(`twenty prompts: native wgpu gives native AVX-512 ${precision} ids`, { skip: !existsSync(join(out, `prompts-${precision}-wgpu.jsonl`)) && 'run.sh found no wgpu adapter' }, async () => {
    const want = await promptRuns(precision);
    const got = (await promptRuns(precision, 'wgpu')).ids;
    const same = got.filter((ids, i) => JSON.stringify(ids) === JSON.stringify(want.ids[i])).length;
    console.log(`${precision}, 20 prompts: native wgpu ${same}/20 equal to native AVX-512`);
    assert.ok(same >= 19, `${precision}: wgpu against AVX-512, ${same}/20`);
  });
}

test('the Network API under Node: training, its file, and errors for bad input', async () => {
  const app = await packedApp();
  await writeFile(join(app, 'network.mjs'), `
import { Network } from 'rusting-brain';
const x = [[0, 0], [0, 1], [1, 0], [1, 1]];
const y = [[0], [1], [1], [0]];
const build = () => Network.builder().inputSize(2).dense(8, 'tanh').dense(1, 'sigmoid')
  .loss('binary_cross_entropy').optimizer({ kind: 'adam', learningRate: 0.05 }).seed(42).build();
const net = await build();
const seen = [];
const history = await net.fit(x, y, { epochs: 400, batchSize: 4, seed: 1 }, (epoch, loss) => { seen.push(epoch); return loss > 0.01; });
const predictions = (await net.predict(x)).map((r) => r[0]);
const flat = (await net.predict(new Float32Array([0, 0, 1, 1]))).map((r) => r[0]);
const accuracy = await net.accuracy(x, y);
const loss = await net.evaluate(x, y);
const text = JSON.stringify(net);
const again = await Network.fromJSON(text);
const againOut = (await again.predict(x)).map((r) => r[0]);
const fromObject = await Network.fromJSON(net.toJSON());
const twice = await build();
const h2 = await twice.fit(x, y, { epochs: 5, batchSize: 2, seed: 9 });
const twiceAgain = await build();
const h3 = await twiceAgain.fit(x, y, { epochs: 5, batchSize: 2, seed: 9 });
const errors = {};
const expectError = async (name, f) => {
  try { await f(); errors[name] = 'no error'; } catch (e) { errors[name] = (e instanceof Error ? 'Error: ' : 'not an Error: ') + e.message; }
};
await expectError('width', () => net.fit([[1, 2, 3]], [[1]]));
await expectError('rows', () => net.fit(x, [[1]]));
await expectError('nan', () => net.fit([[0, 0], [0, NaN]], [[0], [1]]));
await expectError('notNumber', () => net.predict([[0, 'a']]));
await expectError('flat', () => net.predict([1, 2, 3]));
await expectError('activation', () => Network.builder().inputSize(2).dense(4, 'swish').loss('mean_squared_error').build());
await expectError('loss', () => Network.builder().inputSize(2).dense(4, 'relu').loss('hinge').build());
await expectError('pairing', () => Network.builder().inputSize(2).dense(1, 'identity').loss('binary_cross_entropy').build());
await expectError('noLayers', () => Network.builder().inputSize(2).loss('mean_squared_error').build());
await expectError('zeroUnits', () => Network.builder().inputSize(2).dense(0, 'relu').loss('mean_squared_error').build());
await expectError('learningRate', () => Network.builder().inputSize(2).dense(1).loss('mean_squared_error').optimizer({ learningRate: -1 }).build());
await expectError('optimizer', () => Network.builder().inputSize(2).dense(1).loss('mean_squared_error').optimizer({ kind: 'rmsprop' }).build());
await expectError('batch', () => net.fit(x, y, { batchSize: 0 }));
await expectError('epochs', () => net.fit(x, y, { epochs: 1.5 }));
await expectError('callback', () => net.fit(x, y, { epochs: 2 }, () => { throw new Error('boom'); }));
await expectError('file', () => Network.fromJSON(text.slice(0, text.length / 2)));
await expectError('fileObject', () => Network.fromJSON({ format: 'something else' }));
await expectError('device', () => Network.fromJSON(text, { device: 'tpu' }));
await expectError('webgpu', () => Network.fromJSON(text, { device: 'webgpu' }));
const busy = net.fit(x, y, { epochs: 3 });
await expectError('busy', () => net.predict(x));
await busy;
const afterErrors = (await net.predict(x)).map((r) => r[0]);
net.dispose();
await expectError('disposed', () => net.predict(x));
console.log(JSON.stringify({
  epochs: history.length, seen: seen.length, last: history[history.length - 1], predictions, flat, accuracy, loss,
  againOut, fromObject: fromObject.info(), device: again.device(), h2: Array.from(h2), h3: Array.from(h3),
  afterErrors, errors, format: JSON.parse(text).format,
}));
`);
  const stdout = execFileSync('node', ['network.mjs'], { cwd: app, encoding: 'utf8' });
  const got = JSON.parse(stdout.trim().split('\n').pop());
  assert.equal(got.device, 'cpu');
  assert.ok(got.epochs < 400 && got.epochs === got.seen, `onEpoch returning false stopped the run (${got.epochs} epochs)`);
  assert.ok(got.last <= 0.01, `XOR learned: last loss ${got.last}`);
  assert.equal(got.accuracy, 1);
  assert.deepEqual(got.predictions.map((p) => Math.round(p)), [0, 1, 1, 0]);
  assert.deepEqual(got.flat.map((p) => Math.round(p)), [0, 0]);
  assert.deepEqual(got.againOut, got.predictions, 'the file round-trips to the same outputs');
  assert.deepEqual(got.h2, got.h3, 'the same seeds repeat a run');
  assert.equal(got.format, 'rusting_brain.network');
  assert.equal(got.fromObject.parameters, 2 * 8 + 8 + 8 + 1);
  for (const [name, message] of Object.entries(got.errors)) {
    assert.match(message, /^Error: /, `${name}: ${message}`);
  }
  const e = got.errors;
  assert.match(e.width, /x\[0\] has 3 values/);
  assert.match(e.rows, /x has 4 rows but y has 1/);
  assert.match(e.nan, /x row 1, column 1 is NaN/);
  assert.match(e.notNumber, /x\[0\]\[1\] is not a number/);
  assert.match(e.flat, /not a whole number of rows of 2/);
  assert.match(e.activation, /swish/);
  assert.match(e.loss, /hinge/);
  assert.match(e.pairing, /binary cross-entropy needs outputs between 0 and 1.*end with a sigmoid/);
  assert.match(e.noLayers, /no layers/);
  assert.match(e.zeroUnits, /0 units/);
  assert.match(e.learningRate, /learning rate/i);
  assert.match(e.optimizer, /rmsprop/);
  assert.match(e.batch, /batchSize/);
  assert.match(e.epochs, /epochs/);
  assert.match(e.callback, /boom/);
  assert.match(e.file, /network JSON, line/);
  assert.match(e.fileObject, /format/);
  assert.match(e.device, /tpu/);
  assert.match(e.webgpu, /WebGPU/);
  assert.match(e.busy, /another call/);
  assert.match(e.disposed, /disposed/);
  assert.equal(got.afterErrors.length, 4, 'the network still answers after the errors');
});

test('the language-model training API under Node: a tokenizer, steps, the file, and errors', async () => {
  const app = await packedApp();
  await writeFile(join(app, 'lm.mjs'), `
import { initialize, Tokenizer, TransformerLm } from 'rusting-brain';
await initialize();
const text = 'fn main() {\\n    let x = 1;\\n    println!("{}", x);\\n}\\n'.repeat(60);
const tok = Tokenizer.train(text, { vocabSize: 300 });
const ids = Array.from(tok.encode(text));
const config = { vocabSize: tok.vocabSize(), dModel: 32, nLayers: 1, heads: 2, kvHeads: 1, headDim: 16, dFF: 64, maxSeqLen: 16, seed: 3, optimizer: { learningRate: 1e-2 } };
const lm = await TransformerLm.create(config);
const windows = (n, from) => Array.from({ length: n }, (_, i) => ids.slice(from + 17 * i, from + 17 * i + 17));
const held = windows(4, 0);
const first = (await lm.evaluate(held)).loss;
const losses = [];
for (let s = 0; s < 40; s++) losses.push((await lm.trainStep(windows(4, 5 * s), { clip: 1 })).loss);
const last = (await lm.evaluate(held)).loss;
const bytes = await lm.toBytes();
const model = await lm.toModel(tok, { device: 'cpu' });
const out = await model.generate('fn main', { maxTokens: 6, stopAtEnd: false });
const errors = {};
const expectError = async (name, f) => {
  try { await f(); errors[name] = 'no error'; } catch (e) { errors[name] = (e instanceof Error ? 'Error: ' : 'not an Error: ') + e.message; }
};
await expectError('vocab', () => Tokenizer.train(text, { vocabSize: 10 }));
await expectError('empty', () => Tokenizer.train('   '));
await expectError('tokenizerFile', () => Tokenizer.fromJSON('{"not": "a tokenizer"}'));
await expectError('config', () => TransformerLm.create({ ...config, dModel: undefined }));
await expectError('device', () => TransformerLm.create({ ...config, device: 'tpu' }));
await expectError('heads', () => TransformerLm.create({ ...config, heads: 3, kvHeads: 2 }));
await expectError('ragged', () => lm.trainStep([ids.slice(0, 10), ids.slice(0, 9)]));
await expectError('outside', () => lm.trainStep([[1, 2, 99999]]));
await expectError('long', () => lm.trainStep([ids.slice(0, 40)]));
await expectError('notIds', () => lm.trainStep([[1, 'a', 3]]));
await expectError('notBatch', () => lm.trainStep('hello'));
await expectError('clip', () => lm.trainStep(windows(1, 0), { clip: -1 }));
const steps = lm.info().steps;
const device = lm.device();
lm.dispose();
await expectError('disposed', () => lm.trainStep(held));
console.log(JSON.stringify({ device, vocab: tok.vocabSize(), first, last, losses, bytes: bytes.length, generated: out.tokens, steps, errors,
  roundTrip: Tokenizer.fromJSON(JSON.stringify(tok)).decode(tok.encode('fn main() {')) }));
`);
  const stdout = execFileSync('node', ['lm.mjs'], { cwd: app, encoding: 'utf8' });
  const got = JSON.parse(stdout.trim().split('\n').pop());
  assert.ok(got.vocab > 258 && got.vocab <= 300, `vocabulary ${got.vocab}`);
  assert.ok(got.last < 0.5 * got.first, `held-out loss ${got.first} -> ${got.last}`);
  assert.equal(got.steps, 40, 'refused steps were not counted');
  assert.equal(got.device, 'cpu');
  assert.equal(got.generated, 6);
  assert.ok(got.bytes > 4 * 32 * got.vocab, `${got.bytes} bytes`);
  assert.equal(got.roundTrip, 'fn main() {');
  for (const [name, message] of Object.entries(got.errors)) {
    assert.match(message, /^Error: /, `${name}: ${message}`);
  }
  const e = got.errors;
  assert.match(e.vocab, /258/);
  assert.match(e.empty, /empty/);
  assert.match(e.tokenizerFile, /tokenizer/);
  assert.match(e.config, /dModel/);
  assert.match(e.device, /tpu/);
  assert.match(e.heads, /head/);
  assert.match(e.ragged, /equal lengths/);
  assert.match(e.outside, /outside the vocabulary/);
  assert.match(e.long, /16|context|max_seq_len|longer/);
  assert.match(e.notIds, /batch\[0\]\[1\]/);
  assert.match(e.notBatch, /array of id sequences/);
  assert.match(e.clip, /clip/);
  assert.match(e.disposed, /disposed/);
});

// The package's TypeScript declarations as an app compiles against them: a file using every
// class (Model, Network, NetworkBuilder, Tokenizer, TransformerLm) and option type, checked
// by tsc --strict against the installed package; a misuse must fail to compile.
test('the package\'s TypeScript types compile for an app, and reject a misuse', async () => {
  const app = await packedApp();
  const tsc = join(repo, 'tests', 'browser', 'node_modules', 'typescript', 'bin', 'tsc');
  await writeFile(join(app, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { strict: true, noEmit: true, target: 'es2020', module: 'es2020', moduleResolution: 'bundler', lib: ['es2020', 'dom'] },
    files: ['use.ts'],
  }));
  const use = `
import { initialize, loadModel, fetchModel, Model, Network, NetworkBuilder, Tokenizer, TransformerLm,
  type GenerateResult, type FitOptions, type NetworkFile, type LmStep, type Device, type ChatTurnResult,
  type ChatMessage } from 'rusting-brain';
async function main(bytes: Uint8Array, tok: string, ggufFile: Blob): Promise<void> {
  await initialize();
  const model: Model = await loadModel(bytes, tok, { device: 'auto' });
  const r: GenerateResult = await model.generate('fn main() {', { maxTokens: 8, temperature: 0.7, topK: 40, topP: 0.9, seed: 1 }, (text, id) => id > 0);
  const d: Device = r.device;
  await model.chat('more', { stopAtEnd: false });
  model.dispose();
  const gguf: Model = await loadModel(ggufFile, { context: 512, precision: 'q4' });
  const turn: ChatTurnResult = await gguf.chatTurn('hi', { system: 'Be brief.', maxTokens: 4 });
  const said: ChatMessage[] = gguf.messages();
  console.log(turn.reusedTokens, said.length, gguf.chatTemplate()?.length);
  const remote = await fetchModel('m.rbw', new URL('http://x/t.json'));
  remote.free();
  const b: NetworkBuilder = Network.builder().inputSize(2).dense(4, 'leaky_relu', 0.1).dense(1, 'sigmoid')
    .loss('binary_cross_entropy').optimizer({ kind: 'sgd', learningRate: 0.1, momentum: 0.9, nesterov: true }).seed(3).device('cpu');
  const net = await b.build();
  const fit: FitOptions = { epochs: 2, batchSize: 2, shuffle: false, seed: 4 };
  const history: Float32Array = await net.fit([[0, 1], [1, 0]], new Float32Array([1, 1]), fit, (epoch, loss) => loss > 0.1);
  const out: Float32Array[] = await net.predict([[0, 1]]);
  const acc: number = await net.accuracy([[0, 1]], [[1]]) + await net.evaluate([[0, 1]], [[1]]);
  const file: NetworkFile = net.toJSON();
  const again = await Network.fromJSON(file, { device: 'webgpu' });
  again.setLearningRate(0.01);
  const t = Tokenizer.train('some text', { vocabSize: 300 });
  const lm = await TransformerLm.create({ vocabSize: t.vocabSize(), dModel: 32, nLayers: 1, heads: 2, headDim: 16, dFF: 64, maxSeqLen: 16 });
  const step: LmStep = await lm.trainStep([Array.from(t.encode('some text'))], { clip: 1 });
  const rbw: Uint8Array = await lm.toBytes();
  const gen = await lm.toModel(t);
  console.log(d, history, out, acc, step.gradNorm, rbw.length, gen.info().vocabSize, t.endId(), Tokenizer.fromJSON(t.toJSON()).decode([1]));
}
main(new Uint8Array(), '{}', new Blob());
`;
  await writeFile(join(app, 'use.ts'), use);
  execFileSync('node', [tsc, '-p', 'tsconfig.json'], { cwd: app, encoding: 'utf8' });
  // A misuse: a string where the epochs go, and a method that does not exist.
  await writeFile(join(app, 'use.ts'), use.replace('epochs: 2', "epochs: 'two'").replace('again.setLearningRate', 'again.setLearnRate'));
  let failed = '';
  try {
    execFileSync('node', [tsc, '-p', 'tsconfig.json'], { cwd: app, encoding: 'utf8' });
  } catch (e) {
    failed = String(e.stdout);
  }
  assert.match(failed, /TS2322: Type 'string' is not assignable to type 'number'/, failed);
  assert.match(failed, /setLearnRate/, failed);
});
