// The npm package as an app gets it: `npm pack web/pkg`, install the tarball into a
// scratch app, import 'rusting-brain' there and run it under Node (no WebGPU, so the CPU
// path): the greedy ids equal the native CPU int8 ids, a seed repeats, turns continue,
// and bad input is an Error, not a trap.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, writeFile, readdir, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repo, out, models, reference, PROMPT, TOKENS } from './common.mjs';

test('the packed npm package runs the CPU path under Node', async () => {
  const want = await reference();
  await mkdir(out, { recursive: true });
  const app = await mkdtemp(join(tmpdir(), 'rb-npm-app-'));
  const packed = execFileSync('npm', ['pack', join(repo, 'web', 'pkg'), '--pack-destination', app, '--json'], { encoding: 'utf8' });
  const tarball = join(app, JSON.parse(packed)[0].filename);
  await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'scratch-app', private: true, type: 'module' }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', tarball], { cwd: app, stdio: 'inherit' });
  assert.ok((await readdir(join(app, 'node_modules', 'rusting-brain', 'dist'))).includes('rusting_brain_bg.wasm'));
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
