// Causal grouped-query attention on tensor cores: BF16 operands, FP32 accumulation and
// softmax, mma.sync.m16n8k16 (sm_80 and later). Same layouts and semantics as
// attention.cu and rusting_brain_core::ops::attention:
//   q, out: (batch, q_len, q_heads, D); k, v: (batch, kv_capacity, kv_heads, D), the first
//   kv_len positions valid; lse: (batch, q_len, q_heads). Query row t sits at position
//   kv_len - q_len + t; query head h reads key/value head h / (q_heads / kv_heads).
// Nothing of size T x T exists: the forward keeps a running max and sum per row (FA2), and
// the backward recomputes the probabilities from the saved log-sum-exp.
//
// The f32 inputs are rounded to bfloat16 as tiles are staged through shared memory, so no
// BF16 copy of q, k, v is kept. The backward is two kernels and uses no atomics: one owns
// a block of keys (dK, dV, summing over the query heads of its group), one a block of
// queries (dQ), so every gradient is summed in a fixed order and a rerun gives the same bits.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 * g + c:
//   A (16 x 16, row-major): a0 = (g, 2c..2c+1), a1 = (g + 8, 2c..), a2 = (g, 2c + 8..),
//                           a3 = (g + 8, 2c + 8..)
//   B (16 x 8, k x n):      b0 = (k = 2c..2c+1, n = g), b1 = (k = 2c + 8.., n = g)
//   C (16 x 8):             c0, c1 = (g, 2c..2c+1), c2, c3 = (g + 8, 2c..2c+1)
// Two bf16 in one 32-bit register: the lower half is the lower column / k index.
#include "common.cuh"

struct Shape {
    int batch, q_len, kv_len, kv_capacity, q_heads, kv_heads;
};

__device__ __forceinline__ unsigned short bf16_bits(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    return (unsigned int)bf16_bits(lo) | ((unsigned int)bf16_bits(hi) << 16);
}

// Two adjacent bf16 of a shared-memory row as one register (the address is 4-byte aligned:
// every row stride and offset used here is even).
__device__ __forceinline__ unsigned int ld2(const unsigned short* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}

__device__ __forceinline__ void mma(float* c, const unsigned int* a, unsigned int b0,
                                    unsigned int b1) {
#ifdef RB_HOST_EMULATION
    // kernels/emulate: the same fragments multiplied on the CPU (tests the index logic).
    rb_emulated_mma(c, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The A fragment of k-chunk `kc` (16 columns) made from C accumulators of 8-column tiles
// 2 kc and 2 kc + 1: an accumulator row pair is exactly an A fragment's row pair, so
// scores or probabilities feed the next product straight from registers.
__device__ __forceinline__ void acc_to_a(unsigned int* a, const float (*acc)[4], int kc) {
    a[0] = pack2(acc[2 * kc][0], acc[2 * kc][1]);
    a[1] = pack2(acc[2 * kc][2], acc[2 * kc][3]);
    a[2] = pack2(acc[2 * kc + 1][0], acc[2 * kc + 1][1]);
    a[3] = pack2(acc[2 * kc + 1][2], acc[2 * kc + 1][3]);
}

__device__ __forceinline__ long long q_off(const Shape& s, int D, int b, int t, int h) {
    return (((long long)b * s.q_len + t) * s.q_heads + h) * D;
}
__device__ __forceinline__ long long kv_off(const Shape& s, int D, int b, int j, int kvh) {
    return (((long long)b * s.kv_capacity + j) * s.kv_heads + kvh) * D;
}
__device__ __forceinline__ long long row_off(const Shape& s, int b, int t, int h) {
    return ((long long)b * s.q_len + t) * s.q_heads + h;
}

// A fragments of 16 rows x D of a row-major f32 matrix in global memory (rows past `valid`
// read as zero), rounded to bf16: frag[kk] covers features 16 kk .. 16 kk + 15.
template <int D>
__device__ __forceinline__ void load_a_rows(unsigned int (*frag)[4], const float* base,
                                            long long row_stride, int r0, int valid) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int ra = r0 + g, rb = r0 + g + 8;
    const float* pa = base + (long long)ra * row_stride;
    const float* pb = base + (long long)rb * row_stride;
    const bool va = ra < valid, vb = rb < valid;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const int f = 16 * kk + 2 * c;
        frag[kk][0] = va ? pack2(pa[f], pa[f + 1]) : 0u;
        frag[kk][1] = vb ? pack2(pb[f], pb[f + 1]) : 0u;
        frag[kk][2] = va ? pack2(pa[f + 8], pa[f + 9]) : 0u;
        frag[kk][3] = vb ? pack2(pb[f + 8], pb[f + 9]) : 0u;
    }
}

// Stages `rows` rows of D features (global row r at base + r * row_stride, rows past
// `valid` zero) into shared memory as bf16, row-major (`rm`, stride D + 8) and/or
// transposed (`tr`, feature-major, stride rows + 8). The +8 padding spreads a warp's
// fragment reads over the banks.
template <int D>
__device__ __forceinline__ void stage(unsigned short* rm, unsigned short* tr, int rows,
                                      const float* base, long long row_stride, int r0,
                                      int valid) {
    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
        const int r = i / D, f = i % D;
        const float x = r0 + r < valid ? base[(long long)(r0 + r) * row_stride + f] : 0.0f;
        const unsigned short h = bf16_bits(x);
        if (rm != nullptr) rm[r * (D + 8) + f] = h;
        if (tr != nullptr) tr[f * (rows + 8) + r] = h;
    }
}

// ---------------------------------------------------------------------------------------
// Forward. Block (query block of 64 rows, q head, batch); 4 warps of 16 rows; key tiles of
// 64. Grid: (ceil(q_len / 64), q_heads, batch), 128 threads.
template <int D>
__device__ void flash_forward(float* out, float* lse, const float* q, const float* k,
                              const float* v, Shape s) {
    constexpr int BM = 64, BN = 64;
    __shared__ __align__(16) unsigned short Ks[BN * (D + 8)];
    __shared__ __align__(16) unsigned short Vt[D * (BN + 8)];
    const int b = (int)blockIdx.z, h = (int)blockIdx.y, kvh = h / (s.q_heads / s.kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int q0 = (int)blockIdx.x * BM + warp * 16;  // this warp's first query row
    const int shift = s.kv_len - s.q_len;        // position of query row t is t + shift
    const long long q_stride = (long long)s.q_heads * D, kv_stride = (long long)s.kv_heads * D;
    const float scale = rsqrtf((float)D);

    unsigned int qa[D / 16][4];
    load_a_rows<D>(qa, q + q_off(s, D, b, 0, h), q_stride, q0, s.q_len);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {RB_NEG_INF, RB_NEG_INF}, l[2] = {0.0f, 0.0f};
    const int row[2] = {q0 + g, q0 + g + 8};

    // Keys the block's last row sees.
    const int last_row = min((int)blockIdx.x * BM + BM, s.q_len) - 1;
    const int key_end = last_row + shift + 1;
    for (int j0 = 0; j0 < key_end; j0 += BN) {
        __syncthreads();
        stage<D>(Ks, nullptr, BN, k + kv_off(s, D, b, 0, kvh), kv_stride, j0, s.kv_len);
        stage<D>(nullptr, Vt, BN, v + kv_off(s, D, b, 0, kvh), kv_stride, j0, s.kv_len);
        __syncthreads();

        // S = Q K^T for 16 rows x 64 keys.
        float sc[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const unsigned short* kr = Ks + (nt * 8 + g) * (D + 8) + 16 * kk + 2 * c;
                mma(sc[nt], qa[kk], ld2(kr), ld2(kr + 8));
            }
        }
        // Scale, mask, and the online softmax of the two rows this thread holds.
        float tile_max[2] = {RB_NEG_INF, RB_NEG_INF};
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j0 + nt * 8 + 2 * c + (e & 1);
                const int r = e >> 1;
                const bool seen = row[r] < s.q_len && key <= row[r] + shift;
                sc[nt][e] = seen ? sc[nt][e] * scale : RB_NEG_INF;
                tile_max[r] = fmaxf(tile_max[r], sc[nt][e]);
            }
        }
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
            const float m_new = fmaxf(m[r], tile_max[r]);
            // A row that has seen no key yet keeps m = -inf; exponentiate against 0 then
            // (every p is 0), never against -inf (which would give NaN).
            base[r] = m_new == RB_NEG_INF ? 0.0f : m_new;
            alpha[r] = expf(m[r] - base[r]);
            m[r] = m_new;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = expf(sc[nt][e] - base[e >> 1]);
                sc[nt][e] = p;
                l[e >> 1] += p;
            }
        }
        // O += P V: P's accumulators become A fragments (keys as k), V^T from Vt.
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            unsigned int pa[4];
            acc_to_a(pa, sc, kc);
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                const unsigned short* vr = Vt + (dt * 8 + g) * (BN + 8) + 16 * kc + 2 * c;
                mma(o[dt], pa, ld2(vr), ld2(vr + 8));
            }
        }
    }
    // Each row's sum is spread over the 4 lanes of its group.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= s.q_len) continue;
        const float inv = 1.0f / l[r];
        float* orow = out + q_off(s, D, b, row[r], h);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            orow[dt * 8 + 2 * c] = o[dt][2 * r] * inv;
            orow[dt * 8 + 2 * c + 1] = o[dt][2 * r + 1] * inv;
        }
        if (c == 0) lse[row_off(s, b, row[r], h)] = m[r] + logf(l[r]);
    }
}

// delta[row] = dout[row] . out[row], the softmax backward's row term. One warp per row.
extern "C" __global__ void flash_delta(float* delta, const float* dout, const float* out,
                                       long long rows, int D) {
    const long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int i = lane; i < D; i += 32) acc += dout[r * D + i] * out[r * D + i];
    acc = warp_sum(acc);
    if (lane == 0) delta[r] = acc;
}
RB_EXPORT(flash_delta)

// ---------------------------------------------------------------------------------------
// Backward, key side. Block (key block of 64, kv head, batch); 4 warps of 16 keys. For every
// query head of the group and every tile of 32 queries that sees the block:
//   S^T = K Q^T * scale, P^T = exp(S^T - lse), dV += P^T dO, dP^T = V dO^T,
//   dS^T = P^T (dP^T - delta), dK += dS^T Q * scale.
// Writes dk, dv (overwrites; keys past kv_len get zeros).
template <int D>
__device__ void flash_backward_kv(float* dk, float* dv, const float* dout, const float* q,
                                  const float* k, const float* v, const float* lse,
                                  const float* delta, Shape s) {
    constexpr int BK = 64, BQ = 32;
    __shared__ __align__(16) unsigned short Qs[BQ * (D + 8)], Qt[D * (BQ + 8)];
    __shared__ __align__(16) unsigned short Ds[BQ * (D + 8)], Dt[D * (BQ + 8)];
    __shared__ float Ls[BQ], Dl[BQ];
    const int b = (int)blockIdx.z, kvh = (int)blockIdx.y, group = s.q_heads / s.kv_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int k0 = (int)blockIdx.x * BK + warp * 16;
    const int shift = s.kv_len - s.q_len;
    const long long q_stride = (long long)s.q_heads * D, kv_stride = (long long)s.kv_heads * D;
    const float scale = rsqrtf((float)D);

    unsigned int ka[D / 16][4], va[D / 16][4];
    load_a_rows<D>(ka, k + kv_off(s, D, b, 0, kvh), kv_stride, k0, s.kv_len);
    load_a_rows<D>(va, v + kv_off(s, D, b, 0, kvh), kv_stride, k0, s.kv_len);
    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.0f;
    const int key[2] = {k0 + g, k0 + g + 8};

    // The first query row that sees the block's first key.
    const int t_first = max(0, (int)(blockIdx.x * BK) - shift);
    for (int gh = 0; gh < group; gh++) {
        const int h = kvh * group + gh;
        for (int t0 = t_first - t_first % BQ; t0 < s.q_len; t0 += BQ) {
            __syncthreads();
            stage<D>(Qs, Qt, BQ, q + q_off(s, D, b, 0, h), q_stride, t0, s.q_len);
            stage<D>(Ds, Dt, BQ, dout + q_off(s, D, b, 0, h), q_stride, t0, s.q_len);
            for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
                const bool ok = t0 + i < s.q_len;
                Ls[i] = ok ? lse[row_off(s, b, t0 + i, h)] : 0.0f;
                Dl[i] = ok ? delta[row_off(s, b, t0 + i, h)] : 0.0f;
            }
            __syncthreads();
            // S^T and dP^T: 16 keys x 32 queries each.
            float st[BQ / 8][4], dpt[BQ / 8][4];
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    const unsigned short* qr = Qs + (nt * 8 + g) * (D + 8) + 16 * kk + 2 * c;
                    mma(st[nt], ka[kk], ld2(qr), ld2(qr + 8));
                    const unsigned short* dr = Ds + (nt * 8 + g) * (D + 8) + 16 * kk + 2 * c;
                    mma(dpt[nt], va[kk], ld2(dr), ld2(dr + 8));
                }
            }
            // P^T and dS^T in place of S^T and dP^T.
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = nt * 8 + 2 * c + (e & 1);
                    const int t = t0 + qi, kj = key[e >> 1];
                    const bool seen = t < s.q_len && kj < s.kv_len && kj <= t + shift;
                    const float p = seen ? expf(st[nt][e] * scale - Ls[qi]) : 0.0f;
                    st[nt][e] = p;
                    dpt[nt][e] = p * (dpt[nt][e] - Dl[qi]);
                }
            }
            // dV += P^T dO and dK += dS^T Q (queries as k; dO^T, Q^T from Dt, Qt).
#pragma unroll
            for (int kc = 0; kc < BQ / 16; kc++) {
                unsigned int pa[4], da[4];
                acc_to_a(pa, st, kc);
                acc_to_a(da, dpt, kc);
#pragma unroll
                for (int dt = 0; dt < D / 8; dt++) {
                    const unsigned short* dr = Dt + (dt * 8 + g) * (BQ + 8) + 16 * kc + 2 * c;
                    mma(dva[dt], pa, ld2(dr), ld2(dr + 8));
                    const unsigned short* qr = Qt + (dt * 8 + g) * (BQ + 8) + 16 * kc + 2 * c;
                    mma(dka[dt], da, ld2(qr), ld2(qr + 8));
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= s.kv_capacity) continue;
        const bool valid = key[r] < s.kv_len;
        float* dkr = dk + kv_off(s, D, b, key[r], kvh);
        float* dvr = dv + kv_off(s, D, b, key[r], kvh);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int f = dt * 8 + 2 * c + e;
                dkr[f] = valid ? dka[dt][2 * r + e] * scale : 0.0f;
                dvr[f] = valid ? dva[dt][2 * r + e] : 0.0f;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward, query side. Block (query block of 64, q head, batch); 4 warps of 16 rows; key
// tiles of 32: S = Q K^T * scale, P = exp(S - lse), dP = dO V^T, dS = P (dP - delta),
// dQ += dS K * scale. Writes dq (overwrites).
template <int D>
__device__ void flash_backward_q(float* dq, const float* dout, const float* q, const float* k,
                                 const float* v, const float* lse, const float* delta,
                                 Shape s) {
    constexpr int BM = 64, BN = 32;
    __shared__ __align__(16) unsigned short Ks[BN * (D + 8)], Kt[D * (BN + 8)], Vs[BN * (D + 8)];
    const int b = (int)blockIdx.z, h = (int)blockIdx.y, kvh = h / (s.q_heads / s.kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int q0 = (int)blockIdx.x * BM + warp * 16;
    const int shift = s.kv_len - s.q_len;
    const long long q_stride = (long long)s.q_heads * D, kv_stride = (long long)s.kv_heads * D;
    const float scale = rsqrtf((float)D);

    unsigned int qa[D / 16][4], da[D / 16][4];
    load_a_rows<D>(qa, q + q_off(s, D, b, 0, h), q_stride, q0, s.q_len);
    load_a_rows<D>(da, dout + q_off(s, D, b, 0, h), q_stride, q0, s.q_len);
    const int row[2] = {q0 + g, q0 + g + 8};
    float rl[2], rd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool ok = row[r] < s.q_len;
        rl[r] = ok ? lse[row_off(s, b, row[r], h)] : 0.0f;
        rd[r] = ok ? delta[row_off(s, b, row[r], h)] : 0.0f;
    }
    float dqa[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.0f;

    const int last_row = min((int)blockIdx.x * BM + BM, s.q_len) - 1;
    const int key_end = last_row + shift + 1;
    for (int j0 = 0; j0 < key_end; j0 += BN) {
        __syncthreads();
        stage<D>(Ks, Kt, BN, k + kv_off(s, D, b, 0, kvh), kv_stride, j0, s.kv_len);
        stage<D>(Vs, nullptr, BN, v + kv_off(s, D, b, 0, kvh), kv_stride, j0, s.kv_len);
        __syncthreads();
        float sc[BN / 8][4], dp[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) sc[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const unsigned short* kr = Ks + (nt * 8 + g) * (D + 8) + 16 * kk + 2 * c;
                mma(sc[nt], qa[kk], ld2(kr), ld2(kr + 8));
                const unsigned short* vr = Vs + (nt * 8 + g) * (D + 8) + 16 * kk + 2 * c;
                mma(dp[nt], da[kk], ld2(vr), ld2(vr + 8));
            }
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j0 + nt * 8 + 2 * c + (e & 1), r = e >> 1;
                const bool seen = row[r] < s.q_len && key < s.kv_len && key <= row[r] + shift;
                const float p = seen ? expf(sc[nt][e] * scale - rl[r]) : 0.0f;
                dp[nt][e] = p * (dp[nt][e] - rd[r]);
            }
        }
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            unsigned int sa[4];
            acc_to_a(sa, dp, kc);
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                const unsigned short* kr = Kt + (dt * 8 + g) * (BN + 8) + 16 * kc + 2 * c;
                mma(dqa[dt], sa, ld2(kr), ld2(kr + 8));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= s.q_len) continue;
        float* dqr = dq + q_off(s, D, b, row[r], h);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            dqr[dt * 8 + 2 * c] = dqa[dt][2 * r] * scale;
            dqr[dt * 8 + 2 * c + 1] = dqa[dt][2 * r + 1] * scale;
        }
    }
}

// The entry points, one per head size (64 and 128: the sizes of the models in this field;
// others take the f32 kernels of attention.cu).
#define RB_FLASH(D)                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                        \
        flash_forward_##D(float* out, float* lse, const float* q, const float* k,            \
                          const float* v, Shape s) {                                         \
        flash_forward<D>(out, lse, q, k, v, s);                                              \
    }                                                                                        \
    RB_EXPORT(flash_forward_##D)                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                        \
        flash_backward_kv_##D(float* dk, float* dv, const float* dout, const float* q,       \
                              const float* k, const float* v, const float* lse,              \
                              const float* delta, Shape s) {                                 \
        flash_backward_kv<D>(dk, dv, dout, q, k, v, lse, delta, s);                          \
    }                                                                                        \
    RB_EXPORT(flash_backward_kv_##D)                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                        \
        flash_backward_q_##D(float* dq, const float* dout, const float* q, const float* k,   \
                             const float* v, const float* lse, const float* delta, Shape s) { \
        flash_backward_q<D>(dq, dout, q, k, v, lse, delta, s);                               \
    }                                                                                        \
    RB_EXPORT(flash_backward_q_##D)

RB_FLASH(64)
RB_FLASH(128)
