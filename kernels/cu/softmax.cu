// Row-wise softmax and its backward, one block per row. Twin of
// rusting_brain_core::ops::softmax (a NaN in a row keeps the row NaN, as there).
#include "common.cuh"

extern "C" __global__ void softmax_forward(float* out, const float* inp, int rows, int cols) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = inp + (size_t)r * cols;
    float* y = out + (size_t)r * cols;
    float m = RB_NEG_INF;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = x[i] != x[i] ? x[i] : fmaxf(m, x[i]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float e = expf(x[i] - m);
        y[i] = e;
        s += e;
    }
    const float inv = 1.0f / block_sum(s, scratch);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) y[i] *= inv;
}
RB_EXPORT(softmax_forward)

// dinp = out * (dout - sum(dout * out)).
extern "C" __global__ void softmax_backward(float* dinp, const float* dout, const float* out,
                                            int rows, int cols) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* y = out + (size_t)r * cols;
    const float* dy = dout + (size_t)r * cols;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) dot += dy[i] * y[i];
    dot = block_sum(dot, scratch);
    float* dx = dinp + (size_t)r * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) dx[i] = y[i] * (dy[i] - dot);
}
RB_EXPORT(softmax_backward)
