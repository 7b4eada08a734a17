#!/usr/bin/env bash
# Every test: the Rust workspace (`cargo test --workspace`), the CPU tests on each SIMD
# path, the CUDA backend's tests (`--features cuda`) and ONNX import (`--features onnx`),
# then the browser demo in headless Chromium and the npm package under Node
# (tests/browser/run.sh). Where Node or Chromium is missing, that part prints why and is
# skipped, unless RB_REQUIRE_BROWSER=1.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# The CPU backend and model tests again on every other SIMD path this CPU has: AVX-512
# without VNNI, AVX2+FMA and the portable baseline (RB_CPU_ISA only lowers the path, so
# on a CPU without AVX-512 the first two runs are the same path). The determinism matrix
# (native/tests/threads.rs) crosses the paths with 1, 2 and 3 threads.
for path in avx512:0 avx2:1 baseline:1; do
    echo "== CPU kernels and models with RB_CPU_ISA=${path%:*} RB_CPU_VNNI=${path#*:}"
    RB_CPU_ISA="${path%:*}" RB_CPU_VNNI="${path#*:}" cargo test -p rusting_brain --lib \
        --test backend_vs_reference --test transformer --test quantize --test decode \
        --test moe --test network --test threads
done
# The CUDA backend (feature cuda) builds and its tests run everywhere; without a CUDA
# driver and device the device tests report themselves as ignored.
cargo test -p rusting_brain --features cuda --test cuda
# ONNX through tract (feature onnx): PyTorch and Keras exports, save_onnx read back.
cargo test -p rusting_brain --features onnx --test onnx
tests/browser/run.sh
