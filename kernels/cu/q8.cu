// Int8 products. Twin of rusting_brain_core::ops::q8: weights (n, k) packed four int8 to a
// 32-bit slot in memory order with one f32 scale per block of `block` values (32, or the
// whole row for per-row weights); each activation row is rounded to int8 in the same
// blocks with absmax / 127 scales, each block's dot product is an exact i32 sum (__dp4a),
// and the blocks are added in order as total + (acc * xscale) * wscale with no fused
// steps, so the result is bit-identical to the CPU's.
#include "common.cuh"

// One block of threads per (row, block) of x (m, k): xq (m, padded k, bytes, zero past k)
// and xscale (m, blocks).
extern "C" __global__ void quantize_activations(signed char* xq, float* xscale, const float* x,
                                                int m, int k, int k_padded, int block) {
    __shared__ float scratch[32];
    const int blocks = (k + block - 1) / block;
    const int g = blockIdx.x;
    if (g >= m * blocks) return;
    const int r = g / blocks, b = g % blocks;
    const int c0 = b * block, c1 = min(k, c0 + block);
    // The row's last block also zeroes the padding past k.
    const int end = b == blocks - 1 ? k_padded : c1;
    const float* row = x + (size_t)r * k;
    float a = 0.0f;
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) a = fmaxf(a, fabsf(row[i]));
    a = block_max(a, scratch);
    const float s = a / 127.0f;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    if (threadIdx.x == 0) xscale[g] = s;
    signed char* q = xq + (size_t)r * k_padded;
    for (int i = c0 + threadIdx.x; i < end; i += blockDim.x) {
        q[i] = i < k ? (signed char)fminf(fmaxf(roundf(__fmul_rn(row[i], inv)), -127.0f), 127.0f) : 0;
    }
}
RB_EXPORT(quantize_activations)

// out (m, n) = the blocks' sums (+ beta * out): one warp per output element. One block a
// row: the warp's lanes split the row's words and the i32 sums meet in a butterfly. Blocks
// of 32 values (8 words): each lane takes whole blocks, 32 at a time, and lane 0 adds
// their scaled sums in block order.
extern "C" __global__ void q8_matmul(float* out, const signed char* xq, const float* xscale,
                                     const float* packed, const float* wscale, int m, int n,
                                     int words, float beta, int blocks, int block) {
    const long long o = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= (long long)m * n) return;
    const int lane = threadIdx.x & 31;
    const int i = (int)(o / n), j = (int)(o % n);
    const int* w = (const int*)packed + (size_t)j * words;
    const int* x = (const int*)(xq + (size_t)i * words * 4);
    const float* xs = xscale + (size_t)i * blocks;
    const float* ws = wscale + (size_t)j * blocks;
    float v = 0.0f;
    if (blocks == 1) {
        int acc = 0;
        for (int s = lane; s < words; s += 32) acc = __dp4a(w[s], x[s], acc);
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        v = __fmul_rn(__fmul_rn((float)acc, xs[0]), ws[0]);
    } else {
        const int bw = block / 4;
        for (int b0 = 0; b0 < blocks; b0 += 32) {
            const int b = b0 + lane;
            float p = 0.0f;
            if (b < blocks) {
                const int s1 = b == blocks - 1 ? words : (b + 1) * bw;
                int acc = 0;
                for (int s = b * bw; s < s1; s++) acc = __dp4a(w[s], x[s], acc);
                p = __fmul_rn(__fmul_rn((float)acc, xs[b]), ws[b]);
            }
            const int here = min(32, blocks - b0);
            for (int t = 0; t < here; t++) {
                const float pt = __shfl_sync(0xffffffffu, p, t);
                v = __fadd_rn(v, pt);
            }
        }
    }
    if (lane == 0) {
        // Two roundings, as on the host (NVRTC would fuse v + beta * out into one FMA).
        out[o] = beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, out[o]));
    }
}
RB_EXPORT(q8_matmul)

// out[r] = dequantized table[ids[r]]: one thread per output element.
extern "C" __global__ void q8_embedding(float* out, const float* packed, const float* scales,
                                        const unsigned int* ids, int rows, int dim, int words,
                                        int blocks, int block) {
    const long long total = (long long)rows * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / dim;
        const int c = (int)(i % dim);
        const unsigned int id = ids[r];
        const signed char* row = (const signed char*)(packed + (size_t)id * words);
        out[i] = (float)row[c] * scales[(size_t)id * blocks + c / block];
    }
}
RB_EXPORT(q8_embedding)
