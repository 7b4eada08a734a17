// attention.cu, the FP32 attention kernels (one warp per query or key row), run on the CPU
// through cuda_shim.h against causal GQA attention in double, on awkward shapes: head
// sizes that are not multiples of 32 (2, 33, 80) as well as 64 and 256, grouped heads,
// decoding rows with spare cache capacity. Built and run by kernels/tests/emulated.rs.
//
// Tolerance 1e-5 of the largest reference value: f32 sums over up to 300 keys and 256
// features in another order than the reference's doubles (measured worst: 4.1e-7); an
// indexing error is O(1).
#include "cuda_shim.h"
#include "attention.cu"

#include "attention_ref.h"

static bool run(const Case& c, std::mt19937& rng) {
    const Reference r = attention_reference(c, rng);
    const int B = c.batch, T = c.q_len, C = c.cap, HQ = c.hq, HK = c.hkv, D = c.d;
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * C * HK * D, nl = (size_t)B * T * HQ;
    Shape s{B, T, c.kv_len, C, HQ, HK, D};
    std::vector<float> go(nq, NAN), gl(nl, NAN), gdq(nq, NAN), gdk(nkv, NAN), gdv(nkv, NAN);
    std::vector<float> out32(r.out.begin(), r.out.end()), lse32(r.lse.begin(), r.lse.end());
    // 8 warps a block, one warp a row, as the backend launches them.
    const unsigned q_blocks = (unsigned)((nl + 7) / 8), kv_blocks = (unsigned)(((size_t)B * C * HK + 7) / 8);
    rb_launch({q_blocks, 1, 1}, 256, [&] { attention_forward(go.data(), gl.data(), r.q.data(), r.k.data(), r.v.data(), s); });
    rb_launch({q_blocks, 1, 1}, 256, [&] {
        attention_backward_dq(gdq.data(), r.dout.data(), r.q.data(), r.k.data(), r.v.data(), out32.data(), lse32.data(), s);
    });
    rb_launch({kv_blocks, 1, 1}, 256, [&] {
        attention_backward_dkv(gdk.data(), gdv.data(), r.dout.data(), r.q.data(), r.k.data(), r.v.data(), out32.data(),
                               lse32.data(), s);
    });
    const std::vector<float>* got[] = {&go, &gl, &gdq, &gdk, &gdv};
    return report(c, r, got, 1e-5);
}

int main() {
    std::mt19937 rng(5);
    bool ok = true;
    const Case cases[] = {
        {1, 1, 1, 1, 1, 1, 2},      {2, 7, 7, 7, 4, 2, 33},     {1, 40, 40, 40, 3, 1, 80},
        {1, 3, 100, 128, 4, 2, 64}, {1, 1, 300, 301, 2, 1, 256}, {2, 17, 17, 17, 2, 2, 64},
    };
    for (const Case& c : cases) ok &= run(c, rng);
    std::printf("%s\n", ok ? "f32 attention (emulated): all passed" : "f32 attention (emulated): FAILED");
    return ok ? 0 : 1;
}
