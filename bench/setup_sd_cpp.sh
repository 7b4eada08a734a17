#!/usr/bin/env bash
# stable-diffusion.cpp beside ours in `bench/sd_pipeline.py`: fetches its source as the
# stable-diffusion-cpp-python sdist on PyPI carries it (vendor/stable-diffusion.cpp, with
# its own ggml), builds `sd-cli` for this CPU's instruction sets (as bench/setup_llama_cpp.sh
# builds llama.cpp, AMX only where a tile instruction runs here), and writes the random
# SD 1.5 folder of bench/sd15_folder.py that both sides read. Nothing of it enters the
# repository; everything goes under $RB_SDCPP_DIR.
#
#   bash bench/setup_sd_cpp.sh            # then, as it prints:
#   cargo build --release -p rusting_brain --features images --example text_to_image
#   RB_SDCPP_DIR=... python bench/sd_pipeline.py --threads 2 --steps 20
#
# Needs: a C++ compiler, cmake (from PyPI if the machine has none), Python ($RB_PYTHON)
# with torch, diffusers and transformers for the folder.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${RB_SDCPP_DIR:-/var/tmp/rb-sdcpp}"
version="${RB_SD_CPP_PYTHON:-0.4.7}"
python="${RB_PYTHON:-python3}"
mkdir -p "$dir"
cd "$dir"

src="$dir/stable_diffusion_cpp_python-$version/vendor/stable-diffusion.cpp"
if [ ! -e "$src/CMakeLists.txt" ]; then
    # The sdist through pip itself, so pip's own index settings (a mirror, a proxy) apply.
    echo "== fetching the stable-diffusion-cpp-python $version sdist"
    "$python" -m pip download -q --disable-pip-version-check --no-deps \
        --no-binary stable-diffusion-cpp-python -d "$dir/sdist" "stable-diffusion-cpp-python==$version"
    tar xzf "$dir"/sdist/stable_diffusion_cpp_python-"$version".tar.gz -C "$dir"
    rm -rf "$dir/sdist"
fi

# ggml's instruction sets for this CPU (AMX only where a tile instruction runs here).
source "$here/ggml_isa.sh"
echo "== stable-diffusion.cpp's instruction sets: ${isa[*]}"

cmake_bin="$(command -v cmake || true)"
if [ -z "$cmake_bin" ]; then
    [ -x "$dir/cmake-py/bin/cmake" ] ||
        "$python" -m pip install -q --disable-pip-version-check --target "$dir/cmake-py" cmake
    cmake_bin="$dir/cmake-py/bin/cmake"
    export PYTHONPATH="$dir/cmake-py${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ ! -x "$dir/build/bin/sd-cli" ]; then
    echo "== building sd-cli"
    "$cmake_bin" -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
        -DSD_BUILD_EXAMPLES=ON -DSD_WEBP=OFF -DSD_WEBM=OFF
    "$cmake_bin" --build "$dir/build" --target sd-cli -j"$(nproc)"
fi

echo "== a Stable Diffusion 1.5 folder of random weights at the published sizes"
"$python" "$here/sd15_folder.py" --out "$dir/sd15"
echo "ready: cargo build --release -p rusting_brain --features images --example text_to_image && RB_SDCPP_DIR=$dir $python bench/sd_pipeline.py --threads 2 --steps 20"
