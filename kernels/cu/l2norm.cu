// The global L2 norm of the gradients (twin of rusting_brain_core::ops::l2norm):
// `sum_of_squares` adds one tensor's partial sums of squares into partials[slot..], one
// slot per block of a fixed grid, so the order is fixed; the host adds the slots in f64.
#include "common.cuh"

extern "C" __global__ void sum_of_squares(float* partials, const float* x, long long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        s += x[i] * x[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] += s;
}
RB_EXPORT(sum_of_squares)
