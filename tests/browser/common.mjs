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

export const PROMPT = 'fn main() {';
export const TOKENS = 32;
