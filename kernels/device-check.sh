#!/usr/bin/env bash
# The CUDA kernels on a GPU machine, in two halves (that machine has no Rust toolchain):
#
#   kernels/device-check.sh build   # here: build the on-device test binary into target/device/
#   kernels/device-check.sh run     # there (carry target/device): every kernel against core
#
# `run` finds NVRTC on the loader path, else in the nvidia-cuda-nvrtc-cu12 wheel that
# PyTorch's CUDA wheels install, and prints each kernel's result.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    bin="$(cargo test -p rusting_brain_kernels --test on_device --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*on_device[^"]*\)".*/\1/p' | tail -1)"
    [ -n "$bin" ] || { echo "could not find the on_device test binary" >&2; exit 1; }
    mkdir -p target/device
    cp "$bin" target/device/on_device
    echo "built target/device/on_device: carry target/device to the GPU machine and run: kernels/device-check.sh run"
    ;;
run)
    if ! ldconfig -p 2>/dev/null | grep -q libnvrtc.so; then
        lib="$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null || true)"
        [ -n "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
    RB_KERNEL_CACHE="${RB_KERNEL_CACHE:-/tmp/rb-kernels}" target/device/on_device --test-threads 1
    ;;
*)
    echo "usage: kernels/device-check.sh build|run" >&2
    exit 2
    ;;
esac
