// The optimizers' updates, element-wise, twins of rusting_brain_core::ops::optim.
#include "common.cuh"

// adam_update: fused Adam/AdamW over f32 master weights. Twin of
// rusting_brain_core::ops::optim::adam_element, term by term (so results match the CPU
// to rounding): the per-step constants (step_size = lr / (1 - beta1^t), bc2_sqrt =
// sqrt(1 - beta2^t)) come from the host, computed once in f64. `grad_scale` may be read
// from device memory (clipping's factor, computed on the device) when scale_ptr is set.
extern "C" __global__ void adam_update(float* param, const float* grad, float* m, float* v, long long n,
                                       float lr, float beta1, float beta2, float one_minus_beta1,
                                       float one_minus_beta2, float eps, float weight_decay,
                                       int decoupled, float grad_scale, const float* scale_ptr,
                                       float step_size, float bc2_sqrt) {
    const float scale = scale_ptr != nullptr ? grad_scale * scale_ptr[0] : grad_scale;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i] * scale;
        float p = param[i];
        if (decoupled) {
            p *= 1.0f - lr * weight_decay;
        } else {
            g += weight_decay * p;
        }
        const float mi = beta1 * m[i] + one_minus_beta1 * g;
        const float vi = beta2 * v[i] + one_minus_beta2 * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = p - step_size * mi / denom;
    }
}
RB_EXPORT(adam_update)

// SGD with optional momentum (velocity != nullptr) and Nesterov, as core's sgd_update.
extern "C" __global__ void sgd_update(float* param, const float* grad, float* velocity, long long n,
                                      float lr, float momentum, float weight_decay,
                                      float grad_scale, int nesterov) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = grad[i] * grad_scale + weight_decay * param[i];
        if (velocity == nullptr) {
            param[i] -= lr * g;
        } else {
            const float b = momentum * velocity[i] + g;
            velocity[i] = b;
            param[i] -= lr * (nesterov ? g + momentum * b : b);
        }
    }
}
RB_EXPORT(sgd_update)
