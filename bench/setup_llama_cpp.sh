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

# ggml's instruction sets for this CPU (AMX only where a tile instruction runs here).
source "$here/ggml_isa.sh"
echo "== llama.cpp's instruction sets: ${isa[*]}"

cmake_bin="$(command -v cmake || true)"
if [ -z "$cmake_bin" ]; then
    [ -x "$dir/cmake-py/bin/cmake" ] ||
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
