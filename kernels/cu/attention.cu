// Causal grouped-query attention in f32, flash style: no (T, T) matrix exists anywhere.
// Twin of rusting_brain_core::ops::attention (same layouts):
//   q, out: (batch, q_len, q_heads, head_dim); k, v: (batch, kv_capacity, kv_heads, head_dim),
//   the first kv_len positions valid; lse: (batch, q_len, q_heads).
// Query row t sits at position kv_len - q_len + t and sees keys 0..=that position; query
// head h reads key/value head h / (q_heads / kv_heads); scores are scaled by 1/sqrt(head_dim).
//
// One warp per row, lane l holding features l, l + 32, ... (at most 8 of them), so any
// head_dim up to 256 works. This is the FP32 path; the BF16 tensor-core kernel is the
// backend's fast path and is checked against this one and core.
#include "common.cuh"

#define MAX_PER_LANE 8

// Feature lane + 32 e of a row, or 0 past head_dim (the last lanes of a head size that is
// not a multiple of 32 hold nothing there).
__device__ __forceinline__ float feat(const float* row, int lane, int e, int head_dim) {
    const int f = lane + 32 * e;
    return f < head_dim ? row[f] : 0.0f;
}

struct Shape {
    int batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim;
};

__device__ __forceinline__ long long q_index(const Shape& s, int b, int t, int h) {
    return (((long long)b * s.q_len + t) * s.q_heads + h) * s.head_dim;
}
__device__ __forceinline__ long long kv_index(const Shape& s, int b, int j, int kvh) {
    return (((long long)b * s.kv_capacity + j) * s.kv_heads + kvh) * s.head_dim;
}

// This warp's row in a grid of warps (blockDim.x a multiple of 32).
__device__ __forceinline__ long long warp_row() {
    return (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

// The query row (b, t, h) a warp owns, and its key/value head; false past the last row.
struct QueryRow {
    int b, t, h, kvh;
};
__device__ __forceinline__ bool query_row(const Shape& s, QueryRow* r) {
    const long long row = warp_row();
    if (row >= (long long)s.batch * s.q_len * s.q_heads) return false;
    r->h = (int)(row % s.q_heads);
    r->t = (int)((row / s.q_heads) % s.q_len);
    r->b = (int)(row / ((long long)s.q_heads * s.q_len));
    r->kvh = r->h / (s.q_heads / s.kv_heads);
    return true;
}

// Forward: online softmax over the visible keys.
extern "C" __global__ void attention_forward(float* out, float* lse, const float* q, const float* k,
                                             const float* v, Shape s) {
    QueryRow r;
    if (!query_row(s, &r)) return;
    const int b = r.b, t = r.t, h = r.h, kvh = r.kvh;
    const int lane = threadIdx.x & 31;
    const int per = (s.head_dim + 31) >> 5;
    const float scale = rsqrtf((float)s.head_dim);
    const float* qr = q + q_index(s, b, t, h);
    float qv[MAX_PER_LANE], acc[MAX_PER_LANE];
    for (int e = 0; e < per; e++) {
        qv[e] = feat(qr, lane, e, s.head_dim) * scale;
        acc[e] = 0.0f;
    }
    float m = RB_NEG_INF, l = 0.0f;
    const int visible = s.kv_len - s.q_len + t + 1;
    for (int j = 0; j < visible; j++) {
        const float* kr = k + kv_index(s, b, j, kvh);
        float dot = 0.0f;
        for (int e = 0; e < per; e++) dot += qv[e] * feat(kr, lane, e, s.head_dim);
        const float score = warp_sum(dot);
        const float m_new = fmaxf(m, score);
        const float old = expf(m - m_new), p = expf(score - m_new);
        const float* vr = v + kv_index(s, b, j, kvh);
        for (int e = 0; e < per; e++) acc[e] = acc[e] * old + p * feat(vr, lane, e, s.head_dim);
        l = l * old + p;
        m = m_new;
    }
    float* o = out + q_index(s, b, t, h);
    for (int e = 0; e < per; e++)
        if (lane + 32 * e < s.head_dim) o[lane + 32 * e] = acc[e] / l;
    if (lane == 0) lse[((long long)b * s.q_len + t) * s.q_heads + h] = m + logf(l);
}
RB_EXPORT(attention_forward)

// Backward, query side: dq = scale * sum_j dS_j k_j with p_j = exp(s_j - lse),
// dS_j = p_j (dout . v_j - dout . out). One warp per query row; writes dq (overwrites).
extern "C" __global__ void attention_backward_dq(float* dq, const float* dout, const float* q,
                                                 const float* k, const float* v, const float* out,
                                                 const float* lse, Shape s) {
    QueryRow r;
    if (!query_row(s, &r)) return;
    const int b = r.b, t = r.t, h = r.h, kvh = r.kvh;
    const int lane = threadIdx.x & 31;
    const int per = (s.head_dim + 31) >> 5;
    const float scale = rsqrtf((float)s.head_dim);
    const long long qi = q_index(s, b, t, h);
    float qv[MAX_PER_LANE], dov[MAX_PER_LANE], acc[MAX_PER_LANE];
    float d_dot_o = 0.0f;
    for (int e = 0; e < per; e++) {
        qv[e] = feat(q + qi, lane, e, s.head_dim) * scale;
        dov[e] = feat(dout + qi, lane, e, s.head_dim);
        d_dot_o += dov[e] * feat(out + qi, lane, e, s.head_dim);
        acc[e] = 0.0f;
    }
    d_dot_o = warp_sum(d_dot_o);
    const float row_lse = lse[((long long)b * s.q_len + t) * s.q_heads + h];
    const int visible = s.kv_len - s.q_len + t + 1;
    for (int j = 0; j < visible; j++) {
        const float* kr = k + kv_index(s, b, j, kvh);
        const float* vr = v + kv_index(s, b, j, kvh);
        float sd = 0.0f, dp = 0.0f;
        for (int e = 0; e < per; e++) {
            sd += qv[e] * feat(kr, lane, e, s.head_dim);
            dp += dov[e] * feat(vr, lane, e, s.head_dim);
        }
        const float p = expf(warp_sum(sd) - row_lse);
        const float ds = p * (warp_sum(dp) - d_dot_o);
        for (int e = 0; e < per; e++) acc[e] += ds * feat(kr, lane, e, s.head_dim);
    }
    for (int e = 0; e < per; e++)
        if (lane + 32 * e < s.head_dim) dq[qi + lane + 32 * e] = acc[e] * scale;
}
RB_EXPORT(attention_backward_dq)

// Backward, key side: for key row (b, j, kvh), over every query head of its group and every
// query row that sees it: dv_j = sum p dout, dk_j = scale * sum dS q. One warp per key row,
// so every gradient is summed in a fixed order (no atomics). Writes dk, dv (overwrites);
// rows past kv_len are zeroed.
extern "C" __global__ void attention_backward_dkv(float* dk, float* dv, const float* dout, const float* q,
                                                  const float* k, const float* v, const float* out,
                                                  const float* lse, Shape s) {
    const long long row = warp_row();
    const int lane = threadIdx.x & 31;
    const long long rows = (long long)s.batch * s.kv_capacity * s.kv_heads;
    if (row >= rows) return;
    const int kvh = (int)(row % s.kv_heads);
    const int j = (int)((row / s.kv_heads) % s.kv_capacity);
    const int b = (int)(row / ((long long)s.kv_heads * s.kv_capacity));
    const int per = (s.head_dim + 31) >> 5;
    const long long ki = kv_index(s, b, j, kvh);
    float kv_k[MAX_PER_LANE], kv_v[MAX_PER_LANE], dkacc[MAX_PER_LANE], dvacc[MAX_PER_LANE];
    for (int e = 0; e < per; e++) {
        kv_k[e] = feat(k + ki, lane, e, s.head_dim);
        kv_v[e] = feat(v + ki, lane, e, s.head_dim);
        dkacc[e] = 0.0f;
        dvacc[e] = 0.0f;
    }
    if (j < s.kv_len) {
        const float scale = rsqrtf((float)s.head_dim);
        const int group = s.q_heads / s.kv_heads;
        // Query row t sees key j when j <= kv_len - q_len + t.
        int t0 = j - (s.kv_len - s.q_len);
        if (t0 < 0) t0 = 0;
        for (int g = 0; g < group; g++) {
            const int h = kvh * group + g;
            for (int t = t0; t < s.q_len; t++) {
                const long long qi = q_index(s, b, t, h);
                float sd = 0.0f, dp = 0.0f, d_dot_o = 0.0f;
                for (int e = 0; e < per; e++) {
                    const float dov = feat(dout + qi, lane, e, s.head_dim);
                    sd += feat(q + qi, lane, e, s.head_dim) * scale * kv_k[e];
                    dp += dov * kv_v[e];
                    d_dot_o += dov * feat(out + qi, lane, e, s.head_dim);
                }
                const float p = expf(warp_sum(sd) - lse[((long long)b * s.q_len + t) * s.q_heads + h]);
                const float ds = p * (warp_sum(dp) - warp_sum(d_dot_o));
                for (int e = 0; e < per; e++) {
                    dvacc[e] += p * feat(dout + qi, lane, e, s.head_dim);
                    dkacc[e] += ds * feat(q + qi, lane, e, s.head_dim) * scale;
                }
            }
        }
    }
    for (int e = 0; e < per; e++) {
        if (lane + 32 * e >= s.head_dim) continue;
        dk[ki + lane + 32 * e] = dkacc[e];
        dv[ki + lane + 32 * e] = dvacc[e];
    }
}
RB_EXPORT(attention_backward_dkv)
