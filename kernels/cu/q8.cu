// Int8 products. Twin of rusting_brain_core::ops::q8: weights (n, k) packed four int8 to a
// 32-bit slot in memory order with one f32 scale per row; each activation row is rounded
// to int8 with its own absmax / 127 scale and the dot products are exact i32 sums
// (__dp4a), so the result is bit-identical to the CPU's.
#include "common.cuh"

// One block per row of x (m, k): xq (m, padded k, bytes, zero past k) and xscale (m).
extern "C" __global__ void quantize_activations(signed char* xq, float* xscale, const float* x,
                                                int m, int k, int k_padded) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= m) return;
    const float* row = x + (size_t)r * k;
    float a = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) a = fmaxf(a, fabsf(row[i]));
    a = block_max(a, scratch);
    const float s = a / 127.0f;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    if (threadIdx.x == 0) xscale[r] = s;
    signed char* q = xq + (size_t)r * k_padded;
    for (int i = threadIdx.x; i < k_padded; i += blockDim.x) {
        q[i] = i < k ? (signed char)fminf(fmaxf(roundf(row[i] * inv), -127.0f), 127.0f) : 0;
    }
}
RB_EXPORT(quantize_activations)

// out (m, n) = acc * xscale * wscale (+ beta * out): one warp per output element.
extern "C" __global__ void q8_matmul(float* out, const signed char* xq, const float* xscale,
                                     const float* packed, const float* wscale, int m, int n,
                                     int words, float beta) {
    const long long o = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= (long long)m * n) return;
    const int lane = threadIdx.x & 31;
    const int i = (int)(o / n), j = (int)(o % n);
    const int* w = (const int*)packed + (size_t)j * words;
    const int* x = (const int*)(xq + (size_t)i * words * 4);
    int acc = 0;
    for (int s = lane; s < words; s += 32) acc = __dp4a(w[s], x[s], acc);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        const float v = (float)acc * xscale[i] * wscale[j];
        // Two roundings, as on the host (NVRTC would fuse v + beta * out into one FMA).
        out[o] = beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, out[o]));
    }
}
RB_EXPORT(q8_matmul)

// out[r] = dequantized table[ids[r]]: one thread per output element.
extern "C" __global__ void q8_embedding(float* out, const float* packed, const float* scales,
                                        const unsigned int* ids, int rows, int dim, int words) {
    const long long total = (long long)rows * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / dim;
        const int c = (int)(i % dim);
        const unsigned int id = ids[r];
        const signed char* row = (const signed char*)(packed + (size_t)id * words);
        out[i] = (float)row[c] * scales[id];
    }
}
RB_EXPORT(q8_embedding)
