#!/usr/bin/env bash
# llama.cpp beside `bench_decode` and `quant_quality`: fetches llama.cpp's source as the
# llama-cpp-python sdist on PyPI carries it (vendor/llama.cpp), builds `llama-bench`,
# `llama-quantize`, `llama-perplexity` and `llama-server` (`bench/serve_bench.py`) for this
# CPU's instruction sets, and writes Q8_0 GGUFs of random Llamas at both bench_decode
# shapes (through llama.cpp's converter where torch is installed, else through the gguf
# package's writer). Nothing of
# llama.cpp enters the repository; everything goes under $RB_LLAMA_DIR.
#
#   bash bench/setup_llama_cpp.sh            # then, as it prints:
#   RB_LLAMA_DIR=... cargo run --release -p rusting_brain --example bench_decode -- 16 128 readme
#
# Needs: a C++ compiler, Python ($RB_PYTHON) with torch, transformers and sentencepiece,
# or with the gguf package and numpy, and cmake (from PyPI if the machine has none).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${RB_LLAMA_DIR:-/var/tmp/rb-llama}"
version="${RB_LLAMA_CPP_PYTHON:-0.3.36}"
python="${RB_PYTHON:-python3}"
mkdir -p "$dir"
cd "$dir"

src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -e "$src/CMakeLists.txt" ]; then
    # The sdist through pip itself, so pip's own index settings (a mirror, a proxy) apply.
    echo "== fetching the llama-cpp-python $version sdist"
    "$python" -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        -d "$dir/sdist" "llama-cpp-python==$version"
    tar xzf "$dir"/sdist/llama_cpp_python-"$version".tar.gz -C "$dir"
    rm -rf "$dir/sdist"
fi

# The instruction sets to build for, named instead of GGML_NATIVE: a VM may list AMX in
# /proc/cpuinfo and still fault on its first tile instruction (the hypervisor does not
# hand the tile state over), which kills every quantized product with SIGILL. AMX is
# built in only when a probe has run a tile instruction here.
flags() { grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true; }
has() { flags | grep -qw "$1" && echo ON || echo OFF; }
amx=OFF
if [ "$(has amx_tile)" = ON ]; then
    probe="$dir/amx-probe"
    cat > "$probe.c" <<'C'
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* Asks Linux for the tile state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) and runs one tile
   instruction; a VM that does not pass AMX through fails one or the other. The
   configuration is volatile: the compiler does not see ldtilecfg read it, and dropped the
   stores of tile 0's size (a tile of no rows faults, so the probe said no on AMX that works). */
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
    static volatile unsigned char cfg[64] __attribute__((aligned(64)));
    memset((void *)cfg, 0, sizeof cfg);
    cfg[0] = 1; cfg[16] = 64; cfg[48] = 16;
    _tile_loadconfig((const void *)cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
C
    if cc -O1 -mamx-tile -o "$probe" "$probe.c" 2>/dev/null && "$probe" 2>/dev/null; then
        amx=ON
    fi
    echo "== AMX listed by the CPU; a tile instruction $( [ "$amx" = ON ] && echo runs || echo faults ) here"
fi
isa=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_F16C="$(has f16c)"
     -DGGML_FMA="$(has fma)" -DGGML_AVX2="$(has avx2)" -DGGML_BMI2="$(has bmi2)"
     -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$(has avx512f)"
     -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_VNNI="$(has avx512_vnni)"
     -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AMX_TILE="$amx" -DGGML_AMX_INT8="$amx"
     -DGGML_AMX_BF16="$amx")
if [ "$(uname -m)" != x86_64 ]; then
    isa=(-DGGML_NATIVE=ON)
fi
echo "== llama.cpp's instruction sets: ${isa[*]}"

cmake_bin="$(command -v cmake || true)"
if [ -z "$cmake_bin" ]; then
    "$python" -m pip install -q --disable-pip-version-check --target "$dir/cmake-py" cmake
    cmake_bin="$dir/cmake-py/bin/cmake"
    export PYTHONPATH="$dir/cmake-py${PYTHONPATH:+:$PYTHONPATH}"
fi
# llama-bench and llama-batched-bench for bench_decode; llama-quantize and llama-perplexity for quant_quality;
# llama-server for bench/serve_bench.py; llama-tokenize for tests/fixtures/gen_gguf_spm.py.
tools=(llama-bench llama-batched-bench llama-quantize llama-perplexity llama-server llama-tokenize)
if ! (for t in "${tools[@]}"; do [ -x "$dir/build/bin/$t" ] || exit 1; done); then
    echo "== building ${tools[*]}"
    "$cmake_bin" -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
    "$cmake_bin" --build "$dir/build" --target "${tools[@]}" -j"$(nproc)"
fi

if ! "$python" -c "import torch, transformers, sentencepiece" 2>/dev/null; then
    # No torch: the same shapes written by the gguf package's writer, F32, then quantized.
    echo "== Q8_0 GGUFs of random Llamas at bench_decode's shapes (bench/random_gguf.py: no torch here)"
    if ! "$python" -c "import gguf, numpy" 2>/dev/null; then
        echo "ready for quant_quality: RB_LLAMA_DIR=$dir (neither torch nor the gguf package here: no random GGUFs for bench_decode)"
        exit 0
    fi
    quantize=(--quantize "$dir/build/bin/llama-quantize" --type Q8_0)
    [ -e "$dir/readme-q8_0.gguf" ] || "$python" "$here/random_gguf.py" "${quantize[@]}" \
        --out "$dir/readme-q8_0.gguf" --vocab 32000 --d-model 512 --layers 8 --heads 8 \
        --kv-heads 2 --head-dim 64 --d-ff 1408
    [ -e "$dir/small-q8_0.gguf" ] || "$python" "$here/random_gguf.py" "${quantize[@]}" \
        --out "$dir/small-q8_0.gguf" --vocab 4096 --d-model 256 --layers 6 --heads 8 \
        --kv-heads 2 --head-dim 32 --d-ff 704
    echo "ready: RB_LLAMA_DIR=$dir cargo run --release -p rusting_brain --example bench_decode -- 16 128 readme"
    exit 0
fi
echo "== Q8_0 GGUFs of random Llamas at bench_decode's shapes"
[ -e "$dir/readme-q8_0.gguf" ] || "$python" "$here/llama_gguf.py" --llama-cpp "$src" \
    --out "$dir/readme-q8_0.gguf" --vocab 32000 --d-model 512 --layers 8 --heads 8 \
    --kv-heads 2 --head-dim 64 --d-ff 1408
[ -e "$dir/small-q8_0.gguf" ] || "$python" "$here/llama_gguf.py" --llama-cpp "$src" \
    --out "$dir/small-q8_0.gguf" --vocab 4096 --d-model 256 --layers 6 --heads 8 \
    --kv-heads 2 --head-dim 32 --d-ff 704
echo "ready: RB_LLAMA_DIR=$dir cargo run --release -p rusting_brain --example bench_decode -- 16 128 readme"
