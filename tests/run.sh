#!/usr/bin/env bash
# Every test: the Rust workspace (`cargo test --workspace`), the CUDA backend's tests
# (`--features cuda`) and ONNX import (`--features onnx`), then the browser demo in
# headless Chromium and the npm package under Node (tests/browser/run.sh). Where Node or
# Chromium is missing, that part prints why and is skipped, unless RB_REQUIRE_BROWSER=1.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# The CUDA backend (feature cuda) builds and its tests run everywhere; without a CUDA
# driver and device the device tests report themselves as ignored.
cargo test -p rusting_brain --features cuda --test cuda
# ONNX through tract (feature onnx): PyTorch and Keras exports, save_onnx read back.
cargo test -p rusting_brain --features onnx --test onnx
tests/browser/run.sh
