// Shared by the browser and npm tests: paths, the native reference ids, the model files.
import { readFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join, resolve } from 'node:path';

export const repo = resolve(fileURLToPath(new URL('.', import.meta.url)), '..', '..');
export const out = join(repo, 'tests', 'browser', 'out');
export const models = join(repo, 'www', 'models');

/** The prompt and the native CPU int8 greedy ids (run.sh writes them with the
 * language_model example), stopped at `<|end|>` as the page stops. */
export async function reference(name = 'reference') {
  const file = join(out, `${name}.json`);
  if (!existsSync(file)) {
    throw new Error(`${file} is missing: run tests/browser/run.sh, which trains and exports the model and writes it`);
  }
  return JSON.parse(await readFile(file, 'utf8'));
}

/** The twenty prompts (prompts.json) and, per precision ('q8', 'q4') and SIMD path
 * ('avx512', 'avx2', 'baseline'), the native greedy ids run.sh wrote for them. */
export async function promptRuns(precision, isa = 'avx512') {
  const prompts = JSON.parse(await readFile(join(repo, 'tests', 'browser', 'prompts.json'), 'utf8'));
  const file = join(out, `prompts-${precision}-${isa}.jsonl`);
  if (!existsSync(file)) {
    throw new Error(`${file} is missing: run tests/browser/run.sh`);
  }
  const ids = (await readFile(file, 'utf8')).trim().split('\n').map((l) => JSON.parse(l).ids);
  if (ids.length !== prompts.length) throw new Error(`${file}: ${ids.length} runs for ${prompts.length} prompts`);
  return { prompts, ids };
}

export const PROMPT = 'fn main() {';
export const TOKENS = 32;

export const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
// Without a browser the page tests are skipped with the reason (a failure under
// RB_REQUIRE_BROWSER=1, as in CI, which installs Debian's chromium).
export const skip = existsSync(chromiumPath) ? false : `no browser at ${chromiumPath} (apt-get install chromium, or set CHROMIUM)`;
if (skip && process.env.RB_REQUIRE_BROWSER === '1') {
  throw new Error(`RB_REQUIRE_BROWSER=1 but ${skip}`);
}
// As root in a sandbox-less container, and quiet on a machine with no network.
export const base = ['--no-sandbox', '--disable-background-networking', '--disable-component-update',
  '--disable-sync', '--no-first-run', '--disable-quic'];
// WebGPU on SwiftShader, Chromium's CPU implementation of a GPU.
export const webgpu = ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-webgpu-adapter=swiftshader'];
