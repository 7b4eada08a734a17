// Mixture-of-experts combine and its backward. Twin of rusting_brain_core::ops::moe:
// out (n, dim), y (n * top_k, dim) in grouped (expert) order, row_of_slot and weight
// (n * top_k) in token order. Row indices are checked on the host before launch.
#include "common.cuh"

// out[t] += sum_j weight[t, j] * y[row_of_slot[t, j]]: one thread per output element, the
// top_k terms added in slot order (deterministic).
extern "C" __global__ void moe_combine(float* out, const float* y, const unsigned int* row_of_slot,
                                       const float* weight, int n, int top_k, int dim) {
    const long long total = (long long)n * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / dim;
        const int c = (int)(i % dim);
        float acc = out[i];
        for (int j = 0; j < top_k; j++) {
            const long long slot = t * top_k + j;
            acc += weight[slot] * y[(long long)row_of_slot[slot] * dim + c];
        }
        out[i] = acc;
    }
}
RB_EXPORT(moe_combine)

// One block per slot: dy[row] = weight * dout[token] (overwritten) and
// dweight[slot] = dout[token] . y[row].
extern "C" __global__ void moe_combine_backward(float* dy, float* dweight, const float* dout,
                                                const float* y, const unsigned int* row_of_slot,
                                                const float* weight, int slots, int top_k,
                                                int dim) {
    __shared__ float scratch[32];
    const int slot = blockIdx.x;
    if (slot >= slots) return;
    const long long t = slot / top_k;
    const long long r = row_of_slot[slot];
    const float w = weight[slot];
    const float* g = dout + t * dim;
    const float* yr = y + r * dim;
    float* d = dy + r * dim;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        d[c] = w * g[c];
        dot += g[c] * yr[c];
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dweight[slot] = dot;
}
RB_EXPORT(moe_combine_backward)
