// RMSNorm forward and backward, one block per row. Twin of rusting_brain_core::ops::rmsnorm:
// out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps);
// dx = rstd * (g - xhat * mean(g * xhat)) with g = weight * dout, xhat = x * rstd.
// The weight gradient is written per row (dweight_rows, rows x dim) and summed by
// `column_sum`, so it is deterministic (no atomics).
#include "common.cuh"

extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* inp,
                                           const float* weight, int rows, int dim, float eps) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = inp + (size_t)r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, scratch);
    const float s = rsqrtf(ss / (float)dim + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    float* o = out + (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = x[i] * s * weight[i];
}
RB_EXPORT(rmsnorm_forward)

extern "C" __global__ void rmsnorm_backward(float* dinp, float* dweight_rows, const float* dout,
                                            const float* inp, const float* weight,
                                            const float* rstd, int rows, int dim) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = inp + (size_t)r * dim;
    const float* dy = dout + (size_t)r * dim;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dot += weight[i] * dy[i] * x[i] * s;
    const float mean = block_sum(dot, scratch) / (float)dim;
    float* dx = dinp + (size_t)r * dim;
    float* dw = dweight_rows + (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float xhat = x[i] * s;
        dx[i] = s * (weight[i] * dy[i] - xhat * mean);
        dw[i] = dy[i] * xhat;
    }
}
RB_EXPORT(rmsnorm_backward)

// Stage one of a column sum over many rows: partial[chunk][c] = sum of rows
// chunk * chunk_rows .. (chunk + 1) * chunk_rows of m[r][c], in row order. Grid
// (ceil(cols / blockDim.x), chunks); then `column_sum` adds the chunks in order. Fixed
// chunks, no atomics: the same bits on every run, and rows / chunk_rows times the
// parallelism of walking every row in one thread.
extern "C" __global__ void column_sum_chunks(float* partial, const float* m, int rows, int cols,
                                             int chunk_rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const int r0 = blockIdx.y * chunk_rows, r1 = min(rows, r0 + chunk_rows);
    float s = 0.0f;
    for (int r = r0; r < r1; r++) s += m[(size_t)r * cols + c];
    partial[(size_t)blockIdx.y * cols + c] = s;
}
RB_EXPORT(column_sum_chunks)

// acc[c] += sum over rows of m[r][c], in row order (deterministic): one thread per column.
extern "C" __global__ void column_sum(float* acc, const float* m, int rows, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++) s += m[(size_t)r * cols + c];
    acc[c] += s;
}
RB_EXPORT(column_sum)
