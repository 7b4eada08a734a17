// Fused Adam/AdamW over f32 master weights, element-wise. Twin of
// rusting_brain_core::ops::optim::adam_element, term by term (so results match the CPU
// to rounding): the per-step constants (step_size = lr / (1 - beta1^t), bc2_sqrt =
// sqrt(1 - beta2^t)) come from the host, computed once in f64. `grad_scale` may be read
// from device memory (clipping's factor, computed on the device) when scale_ptr is set.
extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, long long n,
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
