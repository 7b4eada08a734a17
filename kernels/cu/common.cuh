// Included by every kernel file: RB_EXPORT, and the warp and block reductions. Blocks are a
// multiple of 32 threads and at most 1024 (32 warps), so one shared slot per warp suffices.
#pragma once

// Written after every `extern "C" __global__` kernel: `RB_EXPORT(name)`. Under NVRTC it is
// nothing (the backend finds kernels in the PTX by name); the CPU emulator's registry.h
// defines it to register the kernel with its driver, so a new kernel needs no table there.
#ifndef RB_HOST_EMULATION
#define RB_EXPORT(name)
#elif !defined(RB_EXPORT)
#error "the emulator includes emulate/registry.h before any kernel file"
#endif

// NVRTC has no <math.h>: -infinity by its bits.
#define RB_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Every thread gets the block's sum. `scratch` holds 32 floats; the call ends with a barrier
// so scratch can be reused right after.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : RB_NEG_INF;
    v = warp_max(v);
    __syncthreads();
    return v;
}
