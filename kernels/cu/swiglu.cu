// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g). Twin of
// rusting_brain_core::ops::swiglu. Element-wise, grid-stride.
#include "common.cuh"

// Both branches as core's sigmoid: no exp of a large positive number, and no flush to 0
// below -88 (e / (1 + e) stays a denormal-free tiny value there).
__device__ __forceinline__ float sigmoid(float g) {
    if (g >= 0.0f) return 1.0f / (1.0f + expf(-g));
    const float e = expf(g);
    return e / (1.0f + e);
}

extern "C" __global__ void swiglu_forward(float* out, const float* gate, const float* up, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g * sigmoid(g) * up[i];
    }
}
RB_EXPORT(swiglu_forward)

// dgate = dout * up * silu'(gate), dup = dout * silu(gate);
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
extern "C" __global__ void swiglu_backward(float* dgate, float* dup, const float* dout,
                                           const float* gate, const float* up, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i], s = sigmoid(g);
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}
RB_EXPORT(swiglu_backward)
