// Rotary position embedding, rotate-half layout, in place. Twin of
// rusting_brain_core::ops::rope: pair (i, i + D/2) of the vector at position p turns by
// p * f_i, f_i = theta^(-2i/D) stretched as RopeScaling::inv_freq stretches it, the angle
// formed in f32 as PyTorch forms it; rope_backward turns by the opposite angle (the
// transposed rotation). x: (batch, seq, heads, head_dim); one thread per pair.
//
// Scaling (kind 0 none, 1 linear, 2 llama3) comes as the f32 constants core forms on the
// host (RopeScaling::kernel_constants): factor, the two wavelength bounds, the original
// context, low_freq_factor and the band width, so no f64 is needed here. Products go
// through __fmul_rn so no FMA contraction changes the blend's rounding.
#include "common.cuh"

__device__ __forceinline__ float rope_inv_freq(int i, int head_dim, float theta, int kind,
                                               float factor, float low_wavelen,
                                               float high_wavelen, float old_ctx, float low,
                                               float band) {
    float f = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    if (kind == 1) return f / factor;
    if (kind == 2) {
        const float wavelen = 6.28318548f / f;  // (float)(2 pi) / f
        if (wavelen > low_wavelen) return f / factor;
        if (wavelen < high_wavelen) return f;
        const float smooth = (old_ctx / wavelen - low) / band;
        return __fadd_rn(__fmul_rn(1.0f - smooth, f) / factor, __fmul_rn(smooth, f));
    }
    return f;
}

__device__ __forceinline__ void rope(float* x, int batch, int seq, int heads, int head_dim,
                                     int pos_offset, float theta, int kind, float factor,
                                     float low_wavelen, float high_wavelen, float old_ctx,
                                     float low, float band, float sign) {
    const int half = head_dim / 2;
    const long long pairs = (long long)batch * seq * heads * half;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < pairs;
         idx += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const long long vec = idx / half;            // (b * seq + t) * heads + h
        const int t = (int)((vec / heads) % seq);
        const float inv_freq = rope_inv_freq(i, head_dim, theta, kind, factor, low_wavelen,
                                             high_wavelen, old_ctx, low, band);
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
                                        int pos_offset, float theta, int kind, float factor,
                                        float low_wavelen, float high_wavelen, float old_ctx,
                                        float low, float band) {
    rope(x, batch, seq, heads, head_dim, pos_offset, theta, kind, factor, low_wavelen,
         high_wavelen, old_ctx, low, band, 1.0f);
}
RB_EXPORT(rope_forward)

extern "C" __global__ void rope_backward(float* x, int batch, int seq, int heads, int head_dim,
                                         int pos_offset, float theta, int kind, float factor,
                                         float low_wavelen, float high_wavelen, float old_ctx,
                                         float low, float band) {
    rope(x, batch, seq, heads, head_dim, pos_offset, theta, kind, factor, low_wavelen,
         high_wavelen, old_ctx, low, band, -1.0f);
}
RB_EXPORT(rope_backward)
