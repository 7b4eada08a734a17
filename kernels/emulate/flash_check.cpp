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

#include "attention_ref.h"

template <int D>
static bool run(const Case& c, std::mt19937& rng) {
    const Reference r = attention_reference(c, rng);
    const int B = c.batch, T = c.q_len, L = c.kv_len, C = c.cap, HQ = c.hq, HK = c.hkv;
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * C * HK * D, nl = (size_t)B * T * HQ;
    const auto &q = r.q, &k = r.k, &v = r.v, &dout = r.dout;
    // The kernels, as the backend launches them (the f32 forward's output feeds delta, as
    // in training; here the reference output, rounded to f32).
    Shape s{B, T, L, C, HQ, HK};
    std::vector<float> go(nq, NAN), gl(nl, NAN), gdq(nq, NAN), gdk(nkv, NAN), gdv(nkv, NAN), delta(nl, NAN);
    std::vector<float> out32(r.out.begin(), r.out.end()), lse32(r.lse.begin(), r.lse.end());
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
    const std::vector<float>* got[] = {&go, &gl, &gdq, &gdk, &gdv};
    return report(c, r, got, 2e-2);
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
