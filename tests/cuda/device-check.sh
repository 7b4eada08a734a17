#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in two halves (that machine has no Rust toolchain):
#
#   tests/cuda/device-check.sh build   # here: build and strip every binary into target/device/
#   tests/cuda/device-check.sh run     # there (carry target/device): everything, one log
#   tests/cuda/device-check.sh run tests   # there: steps 1 and 2 only (no benchmarks)
#
# `run`, in order:
#   1. every kernel against its core twin (kernels/tests/on_device.rs);
#   2. the backend against the reference backend, primitive by primitive, FP32 and BF16
#      (flash attention included), then whole models: dense and MoE TransformerLm logits and
#      weights after 3 steps CUDA vs CPU (FP32 <= 1e-4, BF16 <= 2e-2), decoding, every
#      Hugging Face fixture directory (logits, greedy ids, every gradient), a dense Network,
#      the budget (native/tests/cuda.rs);
#   3. cuda_benchmark: cuBLASLt TFLOP/s at the 101.7M model's shapes and the square peak;
#   4. bench_train_step for the 101.7M model at 4 x 1024 and 8 x 512 beside
#      torch_lm.py --device cuda --compile --bf16 on the same GPU, with the ratio.
# Libraries: libcuda from the driver; NVRTC and cuBLASLt from the system or from the
# nvidia-cuda-nvrtc-cu12 / nvidia-cublas-cu12 wheels PyTorch's CUDA build installs.
# Output goes to stdout and to ${OUT:-target/device}/device-check.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
dev=target/device
case "${1:-}" in
build)
    set -e
    mkdir -p "$dev"
    # RB_CUDA_MAJOR=13: bindings for a machine with CUDA 13 libraries (feature cuda-13);
    # cuBLASLt's structures differ between majors, and the backend refuses a mismatch.
    if [ "${RB_CUDA_MAJOR:-12}" = 13 ]; then
        native=cuda-13
        kernels=(--no-default-features --features cuda-13)
    else
        native=cuda
        kernels=()
    fi
    exe() { sed -n "s/.*\"executable\":\"\([^\"]*$1-[^\"]*\)\".*/\1/p" | tail -1; }
    cp "$(cargo test --release -p rusting_brain_kernels "${kernels[@]}" --test on_device --no-run --message-format=json 2>/dev/null | exe on_device)" "$dev/on_device"
    cp "$(cargo test --release -p rusting_brain --features "$native" --test cuda --no-run --message-format=json 2>/dev/null | exe cuda)" "$dev/cuda_tests"
    built="$(cargo build --release -p rusting_brain --features "$native" --example bench_train_step --example cuda_benchmark --example sweep_arch --message-format=json 2>/dev/null)"
    # The executables' paths from cargo itself, so CARGO_TARGET_DIR is honoured.
    for e in bench_train_step cuda_benchmark sweep_arch; do
        cp "$(echo "$built" | sed -n "s/.*\"executable\":\"\([^\"]*\/examples\/$e\)\".*/\1/p" | tail -1)" "$dev/$e"
    done
    strip "$dev"/* 2>/dev/null || true
    cp bench/torch_lm.py "$dev/torch_lm.py"
    cp "$0" "$dev/device-check.sh"
    du -ch "$dev"/* | tail -1
    echo "built $dev: carry it to the GPU machine and run: tests/cuda/device-check.sh run"
    ;;
run)
    only="${2:-}"
    log="${OUT:-$dev}/device-check.log"
    mkdir -p "$(dirname "$log")"
    exec > >(tee "$log") 2>&1
    # NVRTC and cuBLASLt: the system's if the loader knows them, else the wheels PyTorch
    # installed, else any copy under a CUDA toolkit or site-packages.
    for pair in "libnvrtc.so nvidia.cuda_nvrtc" "libcublasLt.so nvidia.cublas"; do
        set -- $pair
        ldconfig -p 2>/dev/null | grep -q "$1" && continue
        lib="$(python3 -c "import $2, os; print(os.path.join(list($2.__path__)[0], 'lib'))" 2>/dev/null || true)"
        if [ -z "$lib" ]; then
            found="$(find /usr/local/cuda*/lib64 /usr/lib/python3*/ /usr/local/lib/python3*/ /opt 2>/dev/null -name "$1*" | head -1)"
            [ -n "$found" ] && lib="$(dirname "$found")"
        fi
        [ -n "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "$1: ${lib:-not found (the runs below will say so)}"
    done
    export RB_KERNEL_CACHE="${RB_KERNEL_CACHE:-/tmp/rb-kernels}"
    # On the GPU machine a backend that does not start fails the tests instead of
    # reporting them ignored.
    export RB_REQUIRE_CUDA=1
    export RB_TORCH_LM="$PWD/$dev/torch_lm.py"
    nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.sm --format=csv,noheader || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
    status=0
    step() {
        echo; echo "=== $*"
        local t0=$SECONDS
        "$@" || { echo "=== FAILED ($?): $*"; status=1; }
        echo "=== $((SECONDS - t0)) s"
    }
    step "$dev/on_device" --test-threads 1
    step "$dev/cuda_tests" --test-threads 1 --nocapture
    # `run tests` stops here: correctness only, no benchmarks.
    if [ "$only" != tests ]; then
    step "$dev/cuda_benchmark" 4 1024
    step "$dev/bench_train_step" 4 1024 cuda
    step "$dev/bench_train_step" 8 512 cuda
    [ "${RB_SWEEP:-0}" = 1 ] && step "$dev/sweep_arch" 8 512
    fi
    echo; echo "device-check: $([ $status = 0 ] && echo all passed || echo FAILURES above)"
    exit $status
    ;;
*)
    echo "usage: tests/cuda/device-check.sh build|run" >&2
    exit 2
    ;;
esac
