// The global L2 norm of every gradient, and clipping, without a host round trip per
// parameter. `sum_squares` adds one tensor's partial sums of squares into partials[slot..]
// (one slot per block, fixed grid, so the order is fixed and the result deterministic);
// `clip_factor` reduces all partials into norm[0] (the pre-clip norm) and writes the factor
// min(1, max_norm / (norm + 1e-6)) to factor[0], which the optimizer kernel reads.
#include "common.cuh"

extern "C" __global__ void sum_squares(float* partials, const float* x, long long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        s += x[i] * x[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] += s;
}

// One block. Partials are summed in double, in slot order.
extern "C" __global__ void clip_factor(float* norm, float* factor, const float* partials,
                                       int count, float max_norm) {
    __shared__ double acc[1024];
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += (double)partials[i];
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if ((int)threadIdx.x < stride) acc[threadIdx.x] += acc[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const double total = sqrt(acc[0]);
        norm[0] = (float)total;
        factor[0] = max_norm > 0.0f && total > (double)max_norm
                        ? (float)((double)max_norm / (total + 1e-6))
                        : 1.0f;
    }
}
