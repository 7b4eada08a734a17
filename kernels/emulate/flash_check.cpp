// flash_attention.cu run on the CPU through cuda_shim.h, against causal GQA attention in
// double (forward: out and lse; backward: dq, dk, dv), on awkward shapes: lengths that are
// not multiples of the 64-row tiles, grouped heads, decoding rows (kv_len > q_len) with
// spare cache capacity, head sizes 64 and 128. Built and run by kernels/tests/emulated.rs.
//
// Tolerance 2e-2 of the largest reference value: q, k, v, dout and the probabilities are
// rounded to bfloat16 (8-bit mantissa, 2^-9 relative) before the products; an indexing or
// masking error is O(1).
#include "cuda_shim.h"
#include "flash_attention.cu"

#include <cstdio>
#include <random>

struct Case {
    int batch, q_len, kv_len, cap, hq, hkv, d;
};

// The error relative to the largest reference value, floored at 1: with one visible key
// dq and dk cancel to exactly zero in exact arithmetic (p = 1, dS = dO.v - dO.out = 0) and
// come out at the bf16 rounding of terms of the inputs' size (unit normal), so they are
// compared at that size.
static double worst_rel(const std::vector<float>& got, const std::vector<double>& want, size_t* at) {
    double scale = 1.0, worst = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < got.size(); i++) {
        const double d = std::fabs((double)got[i] - want[i]) / scale;
        if (!(d <= worst)) worst = d, *at = i;  // NaN counts as worst
    }
    return worst;
}

template <int D>
static bool run(const Case& c, std::mt19937& rng) {
    const int B = c.batch, T = c.q_len, L = c.kv_len, C = c.cap, HQ = c.hq, HK = c.hkv;
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * C * HK * D, nl = (size_t)B * T * HQ;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(nq), k(nkv), v(nkv), dout(nq);
    for (auto* x : {&q, &k, &v, &dout})
        for (auto& e : *x) e = nd(rng);
    const int shift = L - T, group = HQ / HK;
    const double scale = 1.0 / std::sqrt((double)D);
    auto qi = [&](int b, int t, int h) { return (((size_t)b * T + t) * HQ + h) * D; };
    auto ki = [&](int b, int j, int h) { return (((size_t)b * C + j) * HK + h) * D; };
    // Reference in double.
    std::vector<double> out(nq), lse(nl), dq(nq), dk(nkv, 0.0), dv(nkv, 0.0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < HQ; h++) {
                const int kh = h / group, vis = t + shift + 1;
                std::vector<double> s(vis);
                double m = -1e300;
                for (int j = 0; j < vis; j++) {
                    double dot = 0;
                    for (int e = 0; e < D; e++) dot += (double)q[qi(b, t, h) + e] * k[ki(b, j, kh) + e];
                    s[j] = dot * scale;
                    m = std::max(m, s[j]);
                }
                double sum = 0;
                for (int j = 0; j < vis; j++) sum += std::exp(s[j] - m);
                const double l = m + std::log(sum);
                lse[((size_t)b * T + t) * HQ + h] = l;
                for (int e = 0; e < D; e++) {
                    double acc = 0;
                    for (int j = 0; j < vis; j++) acc += std::exp(s[j] - l) * v[ki(b, j, kh) + e];
                    out[qi(b, t, h) + e] = acc;
                }
                double delta = 0;
                for (int e = 0; e < D; e++) delta += (double)dout[qi(b, t, h) + e] * out[qi(b, t, h) + e];
                for (int e = 0; e < D; e++) dq[qi(b, t, h) + e] = 0;
                for (int j = 0; j < vis; j++) {
                    const double p = std::exp(s[j] - l);
                    double dp = 0;
                    for (int e = 0; e < D; e++) dp += (double)dout[qi(b, t, h) + e] * v[ki(b, j, kh) + e];
                    const double ds = p * (dp - delta);
                    for (int e = 0; e < D; e++) {
                        dv[ki(b, j, kh) + e] += p * dout[qi(b, t, h) + e];
                        dq[qi(b, t, h) + e] += ds * k[ki(b, j, kh) + e] * scale;
                        dk[ki(b, j, kh) + e] += ds * q[qi(b, t, h) + e] * scale;
                    }
                }
            }
    // The kernels, as the backend launches them (the f32 forward's output feeds delta, as
    // in training; here the reference output, rounded to f32).
    Shape s{B, T, L, C, HQ, HK};
    std::vector<float> go(nq, NAN), gl(nl, NAN), gdq(nq, NAN), gdk(nkv, NAN), gdv(nkv, NAN), delta(nl, NAN);
    std::vector<float> out32(out.begin(), out.end()), lse32(lse.begin(), lse.end());
    auto fwd = D == 64 ? flash_forward_64 : flash_forward_128;
    auto bkv = D == 64 ? flash_backward_kv_64 : flash_backward_kv_128;
    auto bq = D == 64 ? flash_backward_q_64 : flash_backward_q_128;
    rb_launch({(unsigned)((T + 63) / 64), (unsigned)HQ, (unsigned)B}, 128,
              [&] { fwd(go.data(), gl.data(), q.data(), k.data(), v.data(), s); });
    rb_launch({(unsigned)((nl + 7) / 8), 1, 1}, 256,
              [&] { flash_delta(delta.data(), dout.data(), out32.data(), (long long)nl, D); });
    rb_launch({(unsigned)((C + 63) / 64), (unsigned)HK, (unsigned)B}, 128, [&] {
        bkv(gdk.data(), gdv.data(), dout.data(), q.data(), k.data(), v.data(), lse32.data(), delta.data(), s);
    });
    rb_launch({(unsigned)((T + 63) / 64), (unsigned)HQ, (unsigned)B}, 128, [&] {
        bq(gdq.data(), dout.data(), q.data(), k.data(), v.data(), lse32.data(), delta.data(), s);
    });
    bool ok = true;
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    const std::vector<float>* got[] = {&go, &gl, &gdq, &gdk, &gdv};
    const std::vector<double>* want[] = {&out, &lse, &dq, &dk, &dv};
    for (int i = 0; i < 5; i++) {
        size_t at = 0;
        const double w = worst_rel(*got[i], *want[i], &at);
        const bool pass = w <= 2e-2;
        ok &= pass;
        std::printf("  %s batch %d q_len %d kv_len %d cap %d heads %d/%d D %d: %-3s worst %.2e at %zu (%g vs %g)\n",
                    pass ? "ok  " : "FAIL", B, T, L, C, HQ, HK, D, names[i], w, at, (*got[i])[at], (*want[i])[at]);
    }
    return ok;
}

int main() {
    std::mt19937 rng(7);
    bool ok = true;
    const Case cases64[] = {
        {1, 1, 1, 1, 1, 1, 64},     {2, 7, 7, 7, 4, 2, 64},   {1, 130, 130, 130, 3, 1, 64},
        {1, 3, 100, 128, 4, 2, 64}, {2, 64, 64, 64, 2, 2, 64}, {1, 65, 97, 97, 2, 1, 64},
    };
    for (const Case& c : cases64) ok &= run<64>(c, rng);
    const Case cases128[] = {{1, 70, 70, 70, 2, 1, 128}, {1, 1, 300, 301, 2, 1, 128}};
    for (const Case& c : cases128) ok &= run<128>(c, rng);
    std::printf("%s\n", ok ? "flash attention (emulated): all passed" : "flash attention (emulated): FAILED");
    return ok ? 0 : 1;
}
