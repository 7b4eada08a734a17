// Rotary position embedding, rotate-half layout, in place. Twin of
// rusting_brain_core::ops::rope: pair (i, i + D/2) of the vector at position p turns by
// p * theta^(-2i/D), the angle formed in f32 as PyTorch forms it; rope_backward turns by
// the opposite angle (the transposed rotation). x: (batch, seq, heads, head_dim); one thread per pair.
__device__ __forceinline__ void rope(float* x, int batch, int seq, int heads, int head_dim,
                                     int pos_offset, float theta, float sign) {
    const int half = head_dim / 2;
    const long long pairs = (long long)batch * seq * heads * half;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < pairs;
         idx += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const long long vec = idx / half;            // (b * seq + t) * heads + h
        const int t = (int)((vec / heads) % seq);
        const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        const float angle = (float)(pos_offset + t) * inv_freq;
        float s, c;
        sincosf(angle, &s, &c);
        s *= sign;
        float* v = x + vec * head_dim;
        const float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
    }
}

extern "C" __global__ void rope_forward(float* x, int batch, int seq, int heads, int head_dim,
                                        int pos_offset, float theta) {
    rope(x, batch, seq, heads, head_dim, pos_offset, theta, 1.0f);
}

extern "C" __global__ void rope_backward(float* x, int batch, int seq, int heads, int head_dim,
                                         int pos_offset, float theta) {
    rope(x, batch, seq, heads, head_dim, pos_offset, theta, -1.0f);
}
