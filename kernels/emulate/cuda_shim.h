// Just enough of CUDA to run a kernel file on the CPU, one std::thread per CUDA thread:
// blocks run one after another (so `__shared__` arrays can be function statics), every
// warp has its own barrier for shuffles and mma.sync, and mma.m16n8k16 (BF16 in, FP32
// accumulate) is computed from the 32 lanes' fragments as the PTX ISA lays them out. It
// checks a kernel's indexing, masking and arithmetic, not its speed or its memory model.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct rb_dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local rb_dim3 threadIdx, blockIdx;
inline rb_dim3 blockDim, gridDim;

using std::max;
using std::min;

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

struct RbWarp {
    std::barrier<> bar{32};
    int i[32];
    unsigned a[32][4], b[32][2];
    float c[32][4];
};
struct RbBlock {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<RbWarp>> warps;
};
inline RbBlock* rb_block = nullptr;

inline void __syncthreads() { rb_block->bar->arrive_and_wait(); }


// A shuffle moves 4 bytes; floats and ints go through the same exchange slots. Every lane
// puts its value in, then takes lane `from(lane)`'s.
template <typename T, typename F>
inline T rb_shuffle(T v, F from) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    RbWarp& w = *rb_block->warps[threadIdx.x >> 5];
    const int lane = threadIdx.x & 31;
    std::memcpy(&w.i[lane], &v, 4);
    w.bar.arrive_and_wait();
    T r;
    std::memcpy(&r, &w.i[from(lane) & 31], 4);
    w.bar.arrive_and_wait();
    return r;
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int off) {
    return rb_shuffle(v, [off](int lane) { return lane ^ off; });
}
// Lane src's value, to every lane.
template <typename T>
inline T __shfl_sync(unsigned, T v, int src) {
    return rb_shuffle(v, [src](int) { return src; });
}

// Four signed bytes of a and b, multiplied and added to c (exact, like the instruction).
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
// The two signed shorts of a times bytes 0, 1 (lo) or 2, 3 (hi) of b, added to c (exact).
inline int __dp2a_lo(int a, int b, int c) {
    return c + (int)(short)a * (int)(signed char)b + (a >> 16) * (int)(signed char)(b >> 8);
}
inline int __dp2a_hi(int a, int b, int c) {
    return c + (int)(short)a * (int)(signed char)(b >> 16) + (a >> 16) * (int)(signed char)(b >> 24);
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

inline float rb_bf16(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

inline void rb_emulated_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    RbWarp& w = *rb_block->warps[threadIdx.x >> 5];
    const int lane = threadIdx.x & 31;
    for (int i = 0; i < 4; i++) w.a[lane][i] = a[i], w.c[lane][i] = c[i];
    w.b[lane][0] = b0;
    w.b[lane][1] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, q = l & 3;
        auto lo = [](unsigned x) { return rb_bf16((unsigned short)(x & 0xffff)); };
        auto hi = [](unsigned x) { return rb_bf16((unsigned short)(x >> 16)); };
        A[g][2 * q] = lo(w.a[l][0]), A[g][2 * q + 1] = hi(w.a[l][0]);
        A[g + 8][2 * q] = lo(w.a[l][1]), A[g + 8][2 * q + 1] = hi(w.a[l][1]);
        A[g][2 * q + 8] = lo(w.a[l][2]), A[g][2 * q + 9] = hi(w.a[l][2]);
        A[g + 8][2 * q + 8] = lo(w.a[l][3]), A[g + 8][2 * q + 9] = hi(w.a[l][3]);
        B[2 * q][g] = lo(w.b[l][0]), B[2 * q + 1][g] = hi(w.b[l][0]);
        B[2 * q + 8][g] = lo(w.b[l][1]), B[2 * q + 9][g] = hi(w.b[l][1]);
    }
    const int g = lane >> 2, q = lane & 3;
    float out[4];
    for (int r = 0; r < 4; r++) {
        const int row = g + 8 * (r >> 1), col = 2 * q + (r & 1);
        float acc = w.c[lane][r];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        out[r] = acc;
    }
    w.bar.arrive_and_wait();
    for (int r = 0; r < 4; r++) c[r] = out[r];
}

// Runs `kernel()` over the grid: `threads` workers, each walking every block in order and
// meeting the others at a barrier between blocks (so the statics standing in for
// `__shared__` belong to one block at a time).
template <typename F>
void rb_launch(rb_dim3 grid, unsigned threads, F kernel) {
    gridDim = grid;
    blockDim = rb_dim3{threads, 1, 1};
    RbBlock block;
    block.bar = std::make_unique<std::barrier<>>(threads);
    for (unsigned i = 0; i < threads / 32; i++) block.warps.push_back(std::make_unique<RbWarp>());
    rb_block = &block;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++)
        ts.emplace_back([&, t] {
            threadIdx = rb_dim3{t, 0, 0};
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = rb_dim3{x, y, z};
                        kernel();
                        block.bar->arrive_and_wait();
                    }
        });
    for (auto& t : ts) t.join();
    rb_block = nullptr;
}
