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

# The instruction sets, named instead of GGML_NATIVE (see bench/setup_llama_cpp.sh: a VM
# may list AMX and fault on the first tile instruction).
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
echo "== stable-diffusion.cpp's instruction sets: ${isa[*]}"

cmake_bin="$(command -v cmake || true)"
if [ -z "$cmake_bin" ]; then
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
