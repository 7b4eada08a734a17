# What bench/setup_llama_cpp.sh and bench/setup_sd_cpp.sh share: ggml's instruction-set
# flags for this CPU, in the array `isa` (sourced; `$dir` is where the AMX probe is built).
#
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
