// Int8 products. Twin of rusting_brain_core::ops::q8: weights (n, k) packed four int8 to a
// 32-bit slot in memory order with one f32 scale per block of `block` values (32, or the
// whole row for per-row weights). Per-row weights: each activation row rounded to int8
// with one absmax / 127 scale, __dp4a sums. Blocked weights: each activation row rounded
// in the same blocks to 13-bit integers (absmax / 4095, held in shorts), __dp2a sums; each
// block's sum is exact in i32 and the blocks are added in order as
// total + (acc * xscale) * wscale with no fused steps. Bit-identical to the CPU's.
#include "common.cuh"

// One block of threads per (row, block) of x (m, k): each value rounded to an integer in
// [-limit, limit] with the block's absmax / limit scale, rows of k_padded values (zero past
// k; the row's last block writes them), scales (m, blocks).
template <typename T>
__device__ void quantize_blocks(T* xq, float* xscale, const float* x, int m, int k, int k_padded,
                                int block, float limit) {
    __shared__ float scratch[32];
    const int blocks = (k + block - 1) / block;
    const int g = blockIdx.x;
    if (g >= m * blocks) return;
    const int r = g / blocks, b = g % blocks;
    const int c0 = b * block, c1 = min(k, c0 + block);
    const int end = b == blocks - 1 ? k_padded : c1;
    const float* row = x + (size_t)r * k;
    float a = 0.0f;
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) a = fmaxf(a, fabsf(row[i]));
    a = block_max(a, scratch);
    const float s = a / limit;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    if (threadIdx.x == 0) xscale[g] = s;
    T* q = xq + (size_t)r * k_padded;
    for (int i = c0 + threadIdx.x; i < end; i += blockDim.x) {
        q[i] = i < k ? (T)fminf(fmaxf(roundf(__fmul_rn(row[i], inv)), -limit), limit) : (T)0;
    }
}

// Per-row weights (block = k): int8 activations, absmax / 127.
extern "C" __global__ void quantize_activations(signed char* xq, float* xscale, const float* x,
                                                int m, int k, int k_padded, int block) {
    quantize_blocks(xq, xscale, x, m, k, k_padded, block, 127.0f);
}
RB_EXPORT(quantize_activations)

// Blocked weights: 13-bit activations as shorts, absmax / 4095.
extern "C" __global__ void quantize_activations_wide(short* xq, float* xscale, const float* x,
                                                     int m, int k, int k_padded, int block) {
    quantize_blocks(xq, xscale, x, m, k, k_padded, block, 4095.0f);
}
RB_EXPORT(quantize_activations_wide)

// out (m, n) = the blocks' sums (+ beta * out): one warp per output element. One block a
// row (xq int8): the warp's lanes split the row's words and the i32 sums meet in a
// butterfly. Blocks of 32 values (xq 13-bit shorts): each lane takes whole blocks, 32 at a
// time, and lane 0 adds their scaled sums in block order.
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
        // 13-bit activations, two shorts to an int: word s of weights meets ints 2s, 2s + 1.
        const int* xw = (const int*)((const short*)xq + (size_t)i * words * 4);
        const int bw = block / 4;
        for (int b0 = 0; b0 < blocks; b0 += 32) {
            const int b = b0 + lane;
            float p = 0.0f;
            if (b < blocks) {
                const int s1 = b == blocks - 1 ? words : (b + 1) * bw;
                int acc = 0;
                for (int s = b * bw; s < s1; s++) {
                    acc = __dp2a_lo(xw[2 * s], w[s], acc);
                    acc = __dp2a_hi(xw[2 * s + 1], w[s], acc);
                }
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
