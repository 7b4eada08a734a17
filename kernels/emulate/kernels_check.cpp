// The element-wise, loss, row-wise and int8 kernels the CUDA backend added (elementwise.cu,
// softmax.cu, moe.cu, q8.cu, the two-stage column sum of rmsnorm.cu and the grouped
// embedding gradient of embedding.cu) run on the CPU through cuda_shim.h, against the
// formulas of rusting_brain_core::ops written out here in double, on awkward sizes. The
// int8 product must give the same bits as core's (exact i32 sums, the same float
// roundings). Tolerance otherwise 1e-5 of the largest reference value (f32 arithmetic,
// expf, summation order). Built and run by kernels/tests/emulated.rs.
#include "cuda_shim.h"
#include "common.cuh"
#include "elementwise.cu"
#include "embedding.cu"
#include "moe.cu"
#include "q8.cu"
#include "rmsnorm.cu"
#include "rope.cu"
#include "softmax.cu"

#include <cstdio>
#include <random>

static bool all_ok = true;
static std::mt19937 rng(11);

static std::vector<float> randn(size_t n, float s = 1.0f) {
    std::normal_distribution<float> nd(0.0f, s);
    std::vector<float> v(n);
    for (auto& e : v) e = nd(rng);
    return v;
}

static void check(const char* what, const std::vector<float>& got, const std::vector<double>& want, double rel) {
    double scale = 1e-30, worst = 0;
    size_t at = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < got.size(); i++) {
        const double d = std::fabs((double)got[i] - want[i]) / scale;
        if (!(d <= worst)) worst = d, at = i;
    }
    const bool ok = got.size() == want.size() && worst <= rel;
    all_ok &= ok;
    std::printf("  %s %s: worst %.2e at %zu (tolerance %.0e)\n", ok ? "ok  " : "FAIL", what, worst, at, rel);
}

static rb_dim3 blocks(size_t n, unsigned threads = 256) {
    return {(unsigned)std::max<size_t>(1, std::min<size_t>((n + threads - 1) / threads, 65535)), 1, 1};
}

static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

int main() {
    // Activations and their gradients (codes as the backend passes them).
    for (long long n : {1LL, 7LL, 1000LL}) {
        auto x = randn(n, 40.0f), dy = randn(n);
        for (int act = 0; act < 5; act++) {
            std::vector<float> y(n, NAN), dx(n, NAN);
            rb_launch(blocks(n), 256, [&] { activation_forward(y.data(), x.data(), n, act, 0.01f); });
            rb_launch(blocks(n), 256, [&] { activation_backward(dx.data(), dy.data(), x.data(), y.data(), n, act, 0.01f); });
            std::vector<double> wy(n), wdx(n);
            for (long long i = 0; i < n; i++) {
                const double v = x[i];
                double f, d;
                switch (act) {
                    case 1: f = v > 0 ? v : 0; d = v > 0 ? dy[i] : 0; break;
                    case 2: f = v > 0 ? v : 0.01f * v; d = v > 0 ? dy[i] : 0.01f * dy[i]; break;
                    case 3: f = sigmoid(v); d = dy[i] * (double)y[i] * (1 - (double)y[i]); break;
                    case 4: f = std::tanh(v); d = dy[i] * (1 - (double)y[i] * y[i]); break;
                    default: f = v; d = dy[i];
                }
                wy[i] = f, wdx[i] = d;
            }
            char name[64];
            std::snprintf(name, sizeof name, "activation %d forward, n %lld", act, n);
            check(name, y, wy, 1e-5);
            std::snprintf(name, sizeof name, "activation %d backward, n %lld", act, n);
            check(name, dx, wdx, 1e-5);
        }
        // A sigmoid far below 0 stays positive, as core's e / (1 + e) does.
        std::vector<float> xs = {-95.0f}, ys = {0.0f};
        rb_launch({1, 1, 1}, 32, [&] { activation_forward(ys.data(), xs.data(), 1, 3, 0.0f); });
        check("sigmoid(-95) > 0", {ys[0] > 0.0f ? 1.0f : 0.0f}, {1.0}, 0.0);
    }
    // Loss terms and gradients (codes as the backend passes them; 3 = fused output).
    for (long long n : {1LL, 7LL, 1000LL}) {
        std::vector<float> pred(n), target(n);
        std::uniform_real_distribution<float> ud(0.001f, 0.999f);
        for (long long i = 0; i < n; i++) pred[i] = ud(rng), target[i] = (float)(i % 3 == 0);
        const float inv = 1.0f / (float)n;
        for (int loss = 0; loss < 4; loss++) {
            std::vector<float> terms(n, NAN), grad(n, NAN);
            if (loss < 3) rb_launch(blocks(n), 256, [&] { loss_terms(terms.data(), pred.data(), target.data(), n, loss); });
            rb_launch(blocks(n), 256, [&] { loss_backward(grad.data(), pred.data(), target.data(), n, loss, inv); });
            std::vector<double> wt(n), wg(n);
            for (long long i = 0; i < n; i++) {
                const double p = pred[i], y = target[i];
                auto lg = [](double x) { return std::max(std::log(x), -100.0); };
                wt[i] = loss == 0 ? (p - y) * (p - y) : loss == 1 ? -(y * lg(p) + (1 - y) * lg(1 - p)) : -(y * lg(p));
                wg[i] = (loss == 0   ? 2 * (p - y)
                         : loss == 1 ? (p - y) / std::max(p * (1 - p), 1e-12)
                         : loss == 2 ? -y / std::max(p, 1e-12)
                                     : p - y) /
                        (double)n;
            }
            char name[64];
            if (loss < 3) {
                std::snprintf(name, sizeof name, "loss %d terms, n %lld", loss, n);
                check(name, terms, wt, 1e-5);
            }
            std::snprintf(name, sizeof name, "loss %d gradient, n %lld", loss, n);
            check(name, grad, wg, 1e-5);
        }
    }
    // Softmax rows.
    for (auto [rows, cols] : {std::pair{1, 1}, {7, 33}, {33, 1000}}) {
        auto x = randn((size_t)rows * cols, 3.0f), dy = randn((size_t)rows * cols);
        std::vector<float> y(x.size(), NAN), dx(x.size(), NAN);
        rb_launch({(unsigned)rows, 1, 1}, 256, [&] { softmax_forward(y.data(), x.data(), rows, cols); });
        rb_launch({(unsigned)rows, 1, 1}, 256, [&] { softmax_backward(dx.data(), dy.data(), y.data(), rows, cols); });
        std::vector<double> wy(x.size()), wdx(x.size());
        for (int r = 0; r < rows; r++) {
            double m = -1e300, s = 0, dot = 0;
            for (int c = 0; c < cols; c++) m = std::max(m, (double)x[r * cols + c]);
            for (int c = 0; c < cols; c++) s += std::exp(x[r * cols + c] - m);
            for (int c = 0; c < cols; c++) wy[r * cols + c] = std::exp(x[r * cols + c] - m) / s;
            for (int c = 0; c < cols; c++) dot += (double)dy[r * cols + c] * y[r * cols + c];
            for (int c = 0; c < cols; c++) wdx[r * cols + c] = y[r * cols + c] * (dy[r * cols + c] - dot);
        }
        check("softmax forward", y, wy, 1e-5);
        check("softmax backward", dx, wdx, 1e-5);
    }
    // Column sums in two stages (bias and RMSNorm weight gradients).
    for (auto [rows, cols, chunk] : {std::tuple{1, 1, 256}, {1000, 33, 256}, {300, 770, 256}}) {
        auto m = randn((size_t)rows * cols), acc0 = randn(cols);
        const int chunks = (rows + chunk - 1) / chunk;
        std::vector<float> partial((size_t)chunks * cols, NAN), acc = acc0;
        rb_launch({(unsigned)((cols + 255) / 256), (unsigned)chunks, 1}, 256,
                  [&] { column_sum_chunks(partial.data(), m.data(), rows, cols, chunk); });
        rb_launch({(unsigned)((cols + 255) / 256), 1, 1}, 256, [&] { column_sum(acc.data(), partial.data(), chunks, cols); });
        std::vector<double> want(cols);
        for (int c = 0; c < cols; c++) {
            double s = acc0[c];
            for (int r = 0; r < rows; r++) s += m[(size_t)r * cols + c];
            want[c] = s;
        }
        check("column sum", acc, want, 1e-5);
    }
    // Embedding gradient with rows grouped by id (the host's grouping written out here).
    for (auto [rows, vocab, dim] : {std::tuple{1, 3, 1}, {33, 7, 65}, {500, 1000, 48}}) {
        std::vector<unsigned> ids(rows);
        for (auto& i : ids) i = rng() % vocab;
        auto dout = randn((size_t)rows * dim), table0 = randn((size_t)vocab * dim);
        std::vector<unsigned> order(rows), uniq, offsets;
        for (int r = 0; r < rows; r++) order[r] = r;
        std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) { return ids[a] < ids[b]; });
        for (int p = 0; p < rows; p++)
            if (uniq.empty() || uniq.back() != ids[order[p]]) uniq.push_back(ids[order[p]]), offsets.push_back(p);
        offsets.push_back(rows);
        auto table = table0;
        const int nu = (int)uniq.size();
        rb_launch(blocks((size_t)nu * dim), 256, [&] {
            embedding_backward(table.data(), dout.data(), uniq.data(), offsets.data(), order.data(), nu, dim);
        });
        std::vector<double> want(table0.begin(), table0.end());
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < dim; c++) want[(size_t)ids[r] * dim + c] += dout[(size_t)r * dim + c];
        check("embedding backward (grouped)", table, want, 1e-5);
    }
    // MoE combine and its backward.
    {
        const int n = 37, top_k = 2, dim = 48, slots = n * top_k;
        std::vector<unsigned> rows(slots);
        for (int i = 0; i < slots; i++) rows[i] = i;
        std::shuffle(rows.begin(), rows.end(), rng);
        auto weight = randn(slots), y = randn((size_t)slots * dim), out0 = randn((size_t)n * dim), dout = randn((size_t)n * dim);
        auto out = out0;
        rb_launch(blocks((size_t)n * dim), 256, [&] { moe_combine(out.data(), y.data(), rows.data(), weight.data(), n, top_k, dim); });
        std::vector<float> dy((size_t)slots * dim, NAN), dw(slots, NAN);
        rb_launch({(unsigned)slots, 1, 1}, 128, [&] {
            moe_combine_backward(dy.data(), dw.data(), dout.data(), y.data(), rows.data(), weight.data(), slots, top_k, dim);
        });
        std::vector<double> wout(out0.begin(), out0.end()), wdy((size_t)slots * dim), wdw(slots);
        for (int t = 0; t < n; t++)
            for (int j = 0; j < top_k; j++) {
                const int s = t * top_k + j;
                double dot = 0;
                for (int c = 0; c < dim; c++) {
                    wout[(size_t)t * dim + c] += (double)weight[s] * y[(size_t)rows[s] * dim + c];
                    wdy[(size_t)rows[s] * dim + c] = (double)weight[s] * dout[(size_t)t * dim + c];
                    dot += (double)dout[(size_t)t * dim + c] * y[(size_t)rows[s] * dim + c];
                }
                wdw[s] = dot;
            }
        check("moe_combine", out, wout, 1e-5);
        check("moe_combine dy", dy, wdy, 1e-6);
        check("moe_combine dweight", dw, wdw, 1e-5);
    }
    // Int8: quantize activation rows, the exact i32 product, the dequantized lookup.
    for (auto [m, n, k] : {std::tuple{1, 5, 3}, {7, 33, 1000}, {33, 17, 768}}) {
        const int words = (k + 3) / 4;
        auto w = randn((size_t)n * k), x = randn((size_t)m * k), out0 = randn((size_t)m * n);
        // Weights packed as core's quantize_rows packs them.
        std::vector<float> packed((size_t)n * words, 0.0f), scales(n);
        for (int r = 0; r < n; r++) {
            float a = 0;
            for (int c = 0; c < k; c++) a = std::max(a, std::fabs(w[(size_t)r * k + c]));
            scales[r] = a / 127.0f;
            const float inv = scales[r] > 0 ? 1.0f / scales[r] : 0.0f;
            auto* bytes = reinterpret_cast<signed char*>(packed.data() + (size_t)r * words);
            for (int c = 0; c < k; c++) bytes[c] = (signed char)std::clamp(std::round(w[(size_t)r * k + c] * inv), -127.0f, 127.0f);
        }
        std::vector<signed char> xq((size_t)m * words * 4, 99);
        std::vector<float> xs(m, NAN);
        for (float beta : {0.0f, 0.5f}) {
            auto out = out0;
            rb_launch({(unsigned)m, 1, 1}, 256, [&] { quantize_activations(xq.data(), xs.data(), x.data(), m, k, words * 4); });
            rb_launch(blocks((size_t)m * n * 32, 256), 256,
                      [&] { q8_matmul(out.data(), xq.data(), xs.data(), packed.data(), scales.data(), m, n, words, beta); });
            std::vector<double> want((size_t)m * n);
            for (int i = 0; i < m; i++) {
                float a = 0;
                for (int c = 0; c < k; c++) a = std::max(a, std::fabs(x[(size_t)i * k + c]));
                const float sx = a / 127.0f, inv = sx > 0 ? 1.0f / sx : 0.0f;
                for (int j = 0; j < n; j++) {
                    int acc = 0;
                    const auto* wb = reinterpret_cast<const signed char*>(packed.data() + (size_t)j * words);
                    for (int c = 0; c < k; c++)
                        acc += (int)(signed char)std::clamp(std::round(x[(size_t)i * k + c] * inv), -127.0f, 127.0f) * wb[c];
                    const float v = (float)acc * sx * scales[j];
                    const float o = out0[(size_t)i * n + j];
                    want[(size_t)i * n + j] = beta == 0.0f ? v : v + beta * o;
                }
            }
            check(beta == 0.0f ? "q8_matmul (bits)" : "q8_matmul beta 0.5 (bits)", out, want, 0.0);
        }
        std::vector<unsigned> ids = {0, (unsigned)n - 1, (unsigned)n / 2};
        std::vector<float> emb(ids.size() * k, NAN);
        rb_launch(blocks(emb.size()), 256,
                  [&] { q8_embedding(emb.data(), packed.data(), scales.data(), ids.data(), (int)ids.size(), k, words); });
        std::vector<double> want(emb.size());
        for (size_t r = 0; r < ids.size(); r++)
            for (int c = 0; c < k; c++)
                want[r * k + c] = (float)reinterpret_cast<const signed char*>(packed.data() + (size_t)ids[r] * words)[c] * scales[ids[r]];
        check("q8_embedding (bits)", emb, want, 0.0);
    }
    // f32 -> bf16, round to nearest even, against values worked out by hand: ties to the
    // even mantissa (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6), -3.3 to the nearest step of
    // 2^-6 (-3.296875), a subnormal to the nearest multiple of 2^-133, and 65504 up to 65536.
    {
        std::vector<float> x = {1.0f, 1.00390625f, 1.01171875f, -3.3f, 0.0f, 1e-40f, 65504.0f};
        std::vector<double> want = {1.0, 1.0, 1.015625, -3.296875, 0.0, std::ldexp(1.0, -133), 65536.0};
        std::vector<unsigned short> h(x.size(), 0);
        rb_launch({1, 1, 1}, 32, [&] { to_bf16(h.data(), x.data(), (long long)x.size()); });
        std::vector<float> got(x.size());
        for (size_t i = 0; i < x.size(); i++) got[i] = rb_bf16(h[i]);
        check("to_bf16 (bits)", got, want, 0.0);
    }
    // RoPE, unscaled, linear and Llama 3.1 scaled, against the rotation in double with the
    // frequencies worked out in double from the raw parameters (transformers' formulas).
    // An original context of 64 puts pairs in all three llama3 bands at head size 64.
    // Positions stay below ~200 so the f32 frequency's rounding (~1e-7 relative) moves no
    // angle by more than ~2e-5.
    {
        const int batch = 2, seq = 37, heads = 3, hd = 64, offset = 150;
        const double theta = 10000.0, pi2 = 2.0 * 3.14159265358979323846;
        struct Case { const char* name; int kind; double factor, low, high, old; };
        for (Case cs : {Case{"none", 0, 1, 0, 0, 0}, Case{"linear", 1, 4, 0, 0, 0},
                        Case{"llama3", 2, 8, 1, 4, 64}}) {
            const float lw = (float)(cs.old / (cs.low > 0 ? cs.low : 1));
            const float hw = (float)(cs.old / (cs.high > 0 ? cs.high : 1));
            const float band = (float)(cs.high - cs.low);
            std::vector<double> inv(hd / 2);
            for (int i = 0; i < hd / 2; i++) {
                double f = 1.0 / std::pow(theta, 2.0 * i / hd);
                if (cs.kind == 1) f /= cs.factor;
                if (cs.kind == 2) {
                    const double w = pi2 / f;
                    if (w > cs.old / cs.low) f /= cs.factor;
                    else if (!(w < cs.old / cs.high)) {
                        const double sm = (cs.old / w - cs.low) / (cs.high - cs.low);
                        f = (1 - sm) * f / cs.factor + sm * f;
                    }
                }
                inv[i] = f;
            }
            const size_t n = (size_t)batch * seq * heads * hd;
            const auto x = randn(n);
            for (float sign : {1.0f, -1.0f}) {
                std::vector<float> y = x;
                const size_t pairs = n / 2;
                if (sign > 0)
                    rb_launch(blocks(pairs), 256, [&] { rope_forward(y.data(), batch, seq, heads, hd, offset, (float)theta, cs.kind, (float)cs.factor, lw, hw, (float)cs.old, (float)cs.low, band); });
                else
                    rb_launch(blocks(pairs), 256, [&] { rope_backward(y.data(), batch, seq, heads, hd, offset, (float)theta, cs.kind, (float)cs.factor, lw, hw, (float)cs.old, (float)cs.low, band); });
                std::vector<double> want(n);
                for (size_t v = 0; v < n / hd; v++) {
                    const int t = (int)((v / heads) % seq);
                    for (int i = 0; i < hd / 2; i++) {
                        const double a = (offset + t) * inv[i];
                        const double c = std::cos(a), s = std::sin(a) * sign;
                        const double x1 = x[v * hd + i], x2 = x[v * hd + i + hd / 2];
                        want[v * hd + i] = x1 * c - x2 * s;
                        want[v * hd + i + hd / 2] = x2 * c + x1 * s;
                    }
                }
                char name[64];
                std::snprintf(name, sizeof name, "rope %s %s", cs.name, sign > 0 ? "forward" : "backward");
                check(name, y, want, 1e-4);
            }
        }
    }
    std::printf("%s\n", all_ok ? "kernels (emulated): all passed" : "kernels (emulated): FAILED");
    return all_ok ? 0 : 1;
}
