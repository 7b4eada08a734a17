// Softmax, cross-entropy and the logits' gradient in one pass per row (one block a row).
// Twin of rusting_brain_core::ops::cross_entropy: loss_r = logsumexp(row) - row[target];
// with write_grad, the row becomes grad_scale * (softmax - onehot), and ignored rows
// (mask[r] == 0) become zero. losses[r] gets the row's loss (0 when ignored) so the host
// (or `sum_losses`) adds them in a fixed order.
#include "common.cuh"

extern "C" __global__ void cross_entropy(float* logits, float* losses, const unsigned int* targets,
                                         const unsigned char* mask, int rows, int vocab,
                                         int write_grad, float grad_scale) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    float* row = logits + (size_t)r * vocab;
    if (mask != nullptr && mask[r] == 0) {
        if (write_grad)
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) row[i] = 0.0f;
        if (threadIdx.x == 0) losses[r] = 0.0f;
        return;
    }
    const unsigned int target = targets[r];
    float m = RB_NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(row[i] - m);
    sum = block_sum(sum, scratch);
    const float lse = m + logf(sum);
    if (threadIdx.x == 0) losses[r] = lse - row[target];
    __syncthreads();  // every thread has read row[target] before it is overwritten
    if (write_grad) {
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float p = expf(row[i] - lse);
            row[i] = grad_scale * (p - (i == (int)target ? 1.0f : 0.0f));
        }
    }
}
RB_EXPORT(cross_entropy)
