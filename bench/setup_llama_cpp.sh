#!/usr/bin/env bash
# llama.cpp beside `bench_decode`: fetches llama.cpp's source as the llama-cpp-python sdist
# on PyPI carries it (vendor/llama.cpp), builds `llama-bench` for this CPU (GGML_NATIVE),
# and writes Q8_0 GGUFs of random Llamas at both bench_decode shapes. Nothing of
# llama.cpp enters the repository; everything goes under $RB_LLAMA_DIR.
#
#   bash bench/setup_llama_cpp.sh            # then, as it prints:
#   RB_LLAMA_DIR=... cargo run --release -p rusting_brain --example bench_decode -- 16 128 readme
#
# Needs: a C++ compiler, Python with torch, transformers and sentencepiece ($RB_PYTHON),
# and cmake (from PyPI if the machine has none).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${RB_LLAMA_DIR:-/var/tmp/rb-llama}"
version="${RB_LLAMA_CPP_PYTHON:-0.3.36}"
python="${RB_PYTHON:-python3}"
mkdir -p "$dir"
cd "$dir"

src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -e "$src/CMakeLists.txt" ]; then
    url="$("$python" - "$version" <<'PY'
import json, sys, urllib.parse, urllib.request
v = sys.argv[1]
index = "https://pypi.org/pypi/llama-cpp-python/json"
meta = json.load(urllib.request.urlopen(index))
files = meta["releases"].get(v) or sys.exit(f"llama-cpp-python {v} is not on the index")
# A mirror of the index may give addresses relative to the JSON's.
print(urllib.parse.urljoin(index, next(f["url"] for f in files if f["packagetype"] == "sdist")))
PY
)"
    echo "== fetching $url"
    curl -sSfL -o sdist.tar.gz "$url"
    tar xzf sdist.tar.gz
    rm sdist.tar.gz
fi

cmake_bin="$(command -v cmake || true)"
if [ -z "$cmake_bin" ]; then
    "$python" -m pip install -q --disable-pip-version-check --target "$dir/cmake-py" cmake
    cmake_bin="$dir/cmake-py/bin/cmake"
    export PYTHONPATH="$dir/cmake-py${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ ! -x "$dir/build/bin/llama-bench" ]; then
    echo "== building llama-bench"
    "$cmake_bin" -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF
    "$cmake_bin" --build "$dir/build" --target llama-bench -j"$(nproc)"
fi

echo "== Q8_0 GGUFs of random Llamas at bench_decode's shapes"
[ -e "$dir/readme-q8_0.gguf" ] || "$python" "$here/llama_gguf.py" --llama-cpp "$src" \
    --out "$dir/readme-q8_0.gguf" --vocab 32000 --d-model 512 --layers 8 --heads 8 \
    --kv-heads 2 --head-dim 64 --d-ff 1408
[ -e "$dir/small-q8_0.gguf" ] || "$python" "$here/llama_gguf.py" --llama-cpp "$src" \
    --out "$dir/small-q8_0.gguf" --vocab 4096 --d-model 256 --layers 6 --heads 8 \
    --kv-heads 2 --head-dim 32 --d-ff 704
echo "ready: RB_LLAMA_DIR=$dir cargo run --release -p rusting_brain --example bench_decode -- 16 128 readme"
