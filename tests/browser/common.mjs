// Shared by the browser and npm tests: paths, the native reference ids, the model files.
import { readFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

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

/** A headless Chromium (`base` flags and `args`) on `url`, its console and page errors
 * collected in `logs`. */
export async function launch(url, args, viewport) {
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: [...base, ...args] });
  const page = await browser.newPage({ viewport });
  const logs = [];
  page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`));
  await page.goto(url);
  return { browser, page, logs };
}

/** Waits until the `data-state` of element `id` is one of `states` and gives it; past
 * `timeout` ms, an error with the status line and the console. */
export async function waitForState(page, id, states, logs, timeout) {
  try {
    await page.waitForFunction(([id, s]) => s.includes(document.getElementById(id).dataset.state), [id, states], { timeout });
  } catch {
    const status = await page.textContent('#status').catch(() => '?');
    throw new Error(`the page never reached ${states}: status "${status}"; console:\n${logs.join('\n')}`);
  }
  return page.evaluate((id) => document.getElementById(id).dataset.state, id);
}
