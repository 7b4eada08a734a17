// Causal grouped-query attention in double, forward and backward, for the emulated
// kernel checks (flash_check.cpp, attention_check.cpp): random unit-normal q, k, v, dout
// for a shape, and the reference out, lse, dq, dk, dv.
#pragma once
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

struct Case {
    int batch, q_len, kv_len, cap, hq, hkv, d;
};

struct Reference {
    std::vector<float> q, k, v, dout;
    std::vector<double> out, lse, dq, dk, dv;
};

static Reference attention_reference(const Case& c, std::mt19937& rng) {
    const int B = c.batch, T = c.q_len, L = c.kv_len, C = c.cap, HQ = c.hq, HK = c.hkv, D = c.d;
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * C * HK * D, nl = (size_t)B * T * HQ;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    Reference r;
    r.q.resize(nq), r.k.resize(nkv), r.v.resize(nkv), r.dout.resize(nq);
    for (auto* x : {&r.q, &r.k, &r.v, &r.dout})
        for (auto& e : *x) e = nd(rng);
    const auto &q = r.q, &k = r.k, &v = r.v, &dout = r.dout;
    auto &out = r.out, &lse = r.lse, &dq = r.dq, &dk = r.dk, &dv = r.dv;
    out.assign(nq, 0.0), lse.assign(nl, 0.0), dq.assign(nq, 0.0), dk.assign(nkv, 0.0), dv.assign(nkv, 0.0);
    const int shift = L - T, group = HQ / HK;
    const double scale = 1.0 / std::sqrt((double)D);
    auto qi = [&](int b, int t, int h) { return (((size_t)b * T + t) * HQ + h) * D; };
    auto ki = [&](int b, int j, int h) { return (((size_t)b * C + j) * HK + h) * D; };
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
    return r;
}

// The error relative to the largest reference value, floored at 1: with one visible key
// dq and dk cancel to exactly zero in exact arithmetic (p = 1, dS = dO.v - dO.out = 0) and
// come out at the rounding of terms of the inputs' size (unit normal), so they are
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

// Prints one line per output and returns whether all five are within `tol`.
static bool report(const Case& c, const Reference& r, const std::vector<float>* got[5], double tol) {
    bool ok = true;
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    const std::vector<double>* want[] = {&r.out, &r.lse, &r.dq, &r.dk, &r.dv};
    for (int i = 0; i < 5; i++) {
        size_t at = 0;
        const double w = worst_rel(*got[i], *want[i], &at);
        const bool pass = w <= tol;
        ok &= pass;
        std::printf("  %s batch %d q_len %d kv_len %d cap %d heads %d/%d D %d: %-3s worst %.2e at %zu (%g vs %g)\n",
                    pass ? "ok  " : "FAIL", c.batch, c.q_len, c.kv_len, c.cap, c.hq, c.hkv, c.d, names[i], w, at,
                    (*got[i])[at], (*want[i])[at]);
    }
    return ok;
}
