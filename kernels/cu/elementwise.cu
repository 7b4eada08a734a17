// Element-wise and small reduction kernels of the dense layers and the
// mixed-precision GEMMs. Twins in rusting_brain_core::ops (elementwise, activation, loss,
// matmul::round_bf16), term by term. Grid-stride loops: any grid covers any n.
#include "common.cuh"

#define FOR_EACH(i, n)                                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

extern "C" __global__ void fill(float* x, float value, long long n) {
    FOR_EACH(i, n) x[i] = value;
}
RB_EXPORT(fill)

extern "C" __global__ void axpy(float* y, float alpha, const float* x, long long n) {
    FOR_EACH(i, n) y[i] += alpha * x[i];
}
RB_EXPORT(axpy)

extern "C" __global__ void scale(float* x, float alpha, long long n) {
    FOR_EACH(i, n) x[i] *= alpha;
}
RB_EXPORT(scale)

// out (rows, cols) += bias (cols) on every row.
extern "C" __global__ void add_bias(float* out, const float* bias, long long n, int cols) {
    FOR_EACH(i, n) out[i] += bias[i % cols];
}
RB_EXPORT(add_bias)

// One partial sum per block into partials[blockIdx.x] (overwritten): the host adds the
// grid's partials in f64, in block order, so the total does not depend on scheduling.
extern "C" __global__ void partial_sums(float* partials, const float* x, long long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    FOR_EACH(i, n) s += x[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
RB_EXPORT(partial_sums)

// Activation codes, as the backend passes them: 0 identity, 1 ReLU, 2 leaky ReLU (alpha),
// 3 sigmoid, 4 tanh. Softmax is row-wise and lives in softmax.cu.
extern "C" __global__ void activation_forward(float* out, const float* inp, long long n, int act,
                                              float alpha) {
    FOR_EACH(i, n) {
        const float x = inp[i];
        float y;
        switch (act) {
            case 1: y = x > 0.0f ? x : 0.0f; break;
            case 2: y = x > 0.0f ? x : alpha * x; break;
            case 3: {
                // As core's sigmoid: e / (1 + e) below 0, so it never flushes to 0 early.
                const float e = expf(-fabsf(x));
                y = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
                break;
            }
            case 4: y = tanhf(x); break;
            default: y = x;
        }
        out[i] = y;
    }
}
RB_EXPORT(activation_forward)

// dinp = f'(inp) * dout; sigmoid and tanh read the forward output.
extern "C" __global__ void activation_backward(float* dinp, const float* dout, const float* inp,
                                               const float* out, long long n, int act,
                                               float alpha) {
    FOR_EACH(i, n) {
        const float g = dout[i];
        float d;
        switch (act) {
            case 1: d = inp[i] > 0.0f ? g : 0.0f; break;
            case 2: d = inp[i] > 0.0f ? g : alpha * g; break;
            case 3: d = g * out[i] * (1.0f - out[i]); break;
            case 4: d = g * (1.0f - out[i] * out[i]); break;
            default: d = g;
        }
        dinp[i] = d;
    }
}
RB_EXPORT(activation_backward)

// Loss codes: 0 mean squared error, 1 binary cross-entropy, 2 categorical cross-entropy.
// Logarithms clamped at -100 and gradient denominators at 1e-12, as torch.nn.BCELoss.
__device__ __forceinline__ float clamped_log(float x) { return fmaxf(logf(x), -100.0f); }

// terms[i] = the loss term of element i; `partial_sums` then adds them.
extern "C" __global__ void loss_terms(float* terms, const float* pred, const float* target,
                                      long long n, int loss) {
    FOR_EACH(i, n) {
        const float p = pred[i], y = target[i];
        float t;
        switch (loss) {
            case 0: t = (p - y) * (p - y); break;
            case 1: t = -(y * clamped_log(p) + (1.0f - y) * clamped_log(1.0f - p)); break;
            default: t = -(y * clamped_log(p));
        }
        terms[i] = t;
    }
}
RB_EXPORT(loss_terms)

// dpred = d(mean loss)/dpred with inv = 1 / divisor. Code 3 is the fused gradient of
// softmax + categorical or sigmoid + binary cross-entropy with respect to the logits,
// (pred - target) / divisor.
extern "C" __global__ void loss_backward(float* dpred, const float* pred, const float* target,
                                         long long n, int loss, float inv) {
    FOR_EACH(i, n) {
        const float p = pred[i], y = target[i];
        float d;
        switch (loss) {
            case 0: d = 2.0f * (p - y); break;
            case 1: d = (p - y) / fmaxf(p * (1.0f - p), 1e-12f); break;
            case 3: d = p - y; break;
            default: d = -y / fmaxf(p, 1e-12f);
        }
        dpred[i] = inv * d;
    }
}
RB_EXPORT(loss_backward)

// f32 -> bfloat16, round to nearest even, NaN kept NaN: the operands of a mixed-precision
// GEMM, rounded exactly as core's round_bf16 rounds them.
__device__ __forceinline__ unsigned short bf16_bits(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

extern "C" __global__ void to_bf16(unsigned short* out, const float* x, long long n) {
    FOR_EACH(i, n) out[i] = bf16_bits(x[i]);
}
RB_EXPORT(to_bf16)
