#!/usr/bin/env bash
# Builds the `rusting-brain` npm package into web/pkg/ (what `npm pack web/pkg` packs and
# what the demo page under www/ imports): the crate for wasm32 with SIMD128, the JS glue
# by the wasm-bindgen CLI of exactly the version the crate pins, the typed wrapper, the
# README and package.json. Prints the .wasm size, raw and gzipped.
set -euo pipefail
cd "$(dirname "$0")/.."

version="$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' web/Cargo.toml)"
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | cut -d' ' -f2)" != "$version" ]; then
    echo "installing wasm-bindgen-cli $version (once)"
    cargo install wasm-bindgen-cli --version "=$version"
fi
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true

target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
cargo build -p rusting_brain_web --profile web --target wasm32-unknown-unknown
out=web/pkg
rm -rf "$out"
mkdir -p "$out/dist"
wasm-bindgen --target web --out-dir "$out/dist" --out-name rusting_brain \
    "$target_dir/wasm32-unknown-unknown/web/rusting_brain_web.wasm"
cp web/js/index.js web/js/index.d.ts web/js/README.md "$out/"
cp LICENSE-MIT LICENSE-APACHE "$out/"
crate_version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
cat > "$out/package.json" <<JSON
{
  "name": "rusting-brain",
  "version": "$crate_version",
  "description": "Int8 transformer language models in the browser (WebGPU, or WebAssembly on the CPU) and in Node",
  "license": "MIT OR Apache-2.0",
  "type": "module",
  "main": "./index.js",
  "types": "./index.d.ts",
  "exports": {
    ".": {
      "types": "./index.d.ts",
      "default": "./index.js"
    },
    "./rusting_brain_bg.wasm": "./dist/rusting_brain_bg.wasm",
    "./package.json": "./package.json"
  },
  "files": ["index.js", "index.d.ts", "dist/", "README.md", "LICENSE-MIT", "LICENSE-APACHE"],
  "sideEffects": false,
  "keywords": ["llm", "webgpu", "wasm", "int8", "transformer", "text-generation"]
}
JSON
wasm="$out/dist/rusting_brain_bg.wasm"
raw=$(stat -c %s "$wasm")
gz=$(gzip -9 -c "$wasm" | wc -c)
echo "built $out: rusting_brain_bg.wasm $raw bytes ($((raw / 1024)) KiB), gzip -9 $gz bytes ($((gz / 1024)) KiB)"
