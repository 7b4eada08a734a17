#!/usr/bin/env bash
# Every test: the Rust workspace (`cargo test --workspace`), the portable backend's tests
# again as WebAssembly under Node's WASI (its SIMD128 kernels), the CPU tests on each SIMD
# path, the CUDA backend's tests (`--features cuda`) and ONNX import (`--features onnx`),
# a short run of every fuzz target, then the browser demo in headless Chromium and the
# npm package under Node (tests/browser/run.sh). Where Node, Chromium or cargo-fuzz is
# missing, that part prints why and is skipped, unless RB_REQUIRE_BROWSER=1 or
# RB_REQUIRE_FUZZ=1.
set -euo pipefail
cd "$(dirname "$0")/.."
# The crash test and the determinism matrix print their tables (kills and outcomes;
# digests per SIMD path and thread count) into the log, so they run uncaptured.
tables=(every_save_survives_sigkill_with_the_old_or_the_new_file determinism_matrix_over_threads_and_instruction_sets)
echo "== [${SECONDS}s] the workspace"
cargo test --workspace -- "${tables[@]/#/--skip=}"
cargo test -p rusting_brain --test crash --test threads -- --nocapture "${tables[@]}"
# The portable backend (the browser's CPU path) built for wasm32-wasip1 with SIMD128 and
# run under Node's WASI (portable/wasi-run.mjs is cargo's runner for that target): its int8
# and f32 kernels as the browser runs them, against the same references as natively.
echo "== [${SECONDS}s] the portable backend as WebAssembly under Node's WASI"
if command -v node >/dev/null; then
    cargo test -p rusting_brain_portable --target wasm32-wasip1
elif [ "${RB_REQUIRE_BROWSER:-0}" = 1 ]; then
    echo "RB_REQUIRE_BROWSER=1 but node is not installed" >&2
    exit 1
else
    echo "SKIPPED the portable backend under WASI: node is not installed"
fi
# The CPU backend and model tests again on every other SIMD path this CPU has: AVX-512
# without VNNI, AVX2+FMA and the portable baseline (RB_CPU_ISA only lowers the path, so
# on a CPU without AVX-512 the first two runs are the same path). The determinism matrix
# (native/tests/threads.rs) crosses the paths with 1, 2 and 3 threads.
for path in avx512:0 avx2:1 baseline:1; do
    echo "== [${SECONDS}s] CPU kernels and models with RB_CPU_ISA=${path%:*} RB_CPU_VNNI=${path#*:}"
    RB_CPU_ISA="${path%:*}" RB_CPU_VNNI="${path#*:}" cargo test -p rusting_brain --lib \
        --test backend_vs_reference --test transformer --test quantize --test decode \
        --test moe --test network --test threads
done
# The CUDA backend (feature cuda) builds and its tests run everywhere; without a CUDA
# driver and device the device tests report themselves as ignored.
echo "== [${SECONDS}s] the CUDA backend's tests, ONNX import"
cargo test -p rusting_brain --features cuda --test cuda
# ONNX through tract (feature onnx): PyTorch and Keras exports, save_onnx read back.
cargo test -p rusting_brain --features onnx --test onnx
# Every loader's fuzz target for a short while (fuzz/run.sh; docs/fuzzing.md has the
# long runs). The ONNX target joins with RB_FUZZ_ONNX=1 (CI sets it): tract's
# instrumented build adds about seven minutes to a run from nothing. Needs cargo-fuzz;
# without it this part prints why and is skipped, unless RB_REQUIRE_FUZZ=1.
echo "== [${SECONDS}s] the fuzz targets"
if command -v cargo-fuzz >/dev/null; then
    fuzz/run.sh seconds "${RB_FUZZ_SECONDS:-10}"
elif [ "${RB_REQUIRE_FUZZ:-0}" = 1 ]; then
    echo "RB_REQUIRE_FUZZ=1 but cargo-fuzz is not installed" >&2
    exit 1
else
    echo "SKIPPED the fuzz targets: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)"
fi
echo "== [${SECONDS}s] the browser and npm tests"
tests/browser/run.sh
