#!/usr/bin/env -S node --no-warnings
// Runs a wasm32-wasip1 program (a test binary cargo built) under Node's WASI: cargo's
// runner for that target (.cargo/config.toml), so `cargo test --target wasm32-wasip1`
// runs the portable backend's tests with SIMD128, as a browser runs its kernels.
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { argv, env, exit } from 'node:process';
import { WASI } from 'node:wasi';

const [program, ...args] = argv.slice(2);
if (!program) {
  console.error('usage: wasi-run.mjs <program.wasm> [args...]');
  exit(2);
}
const wasi = new WASI({
  version: 'preview1',
  args: [program, ...args],
  env,
  // The working directory too, so a program reads files by paths relative to it.
  preopens: { '/tmp': tmpdir(), '.': '.' },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(program));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
