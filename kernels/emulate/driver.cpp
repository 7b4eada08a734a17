// Runs any kernel of cu/ on the CPU (through cuda_shim.h) for a caller in another
// language: the Rust tests (kernels/tests/emulated.rs) send launches on stdin
// and compare what comes back with rusting_brain_core's reference ops. No formula lives
// here: the driver only moves bytes.
//
// Built once per group of kernel files (two files may define the same helper type):
// -DRB_GROUP=1 the element-wise, norm, loss, optimizer, embedding, MoE and int8 kernels;
// 2 the f32 attention kernels; 3 the BF16 flash-attention kernels.
//
// A request: u32 name length, the name, grid x y z (u32 each), threads per block (u32),
// then each argument in the kernel's order: a pointer is u64 byte count and the bytes
// (u64::MAX for a null pointer), a value is its bytes as the kernel declares it (a struct
// in its C layout). The answer: every pointer argument's bytes after the launch, in
// order, each as u64 byte count and bytes. Requests follow each other until end of input.
#include "cuda_shim.h"

#if RB_GROUP == 1
#include "cross_entropy.cu"
#include "elementwise.cu"
#include "embedding.cu"
#include "l2norm.cu"
#include "moe.cu"
#include "optim.cu"
#include "q8.cu"
#include "rmsnorm.cu"
#include "rope.cu"
#include "softmax.cu"
#include "swiglu.cu"
#elif RB_GROUP == 2
#include "attention.cu"
#elif RB_GROUP == 3
#include "flash_attention.cu"
#else
#error "RB_GROUP must be 1, 2 or 3"
#endif

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

static bool read_exact(void* p, size_t n) { return std::fread(p, 1, n, stdin) == n; }

static void fail(const char* what) {
    std::fprintf(stderr, "driver: %s\n", what);
    std::exit(2);
}

template <typename T>
static T value() {
    T v;
    if (!read_exact(&v, sizeof v)) fail("input ends inside a value argument");
    return v;
}

struct alignas(16) float4_storage_t {
    unsigned char b[16];
};

struct Buffers {
    // Each pointer argument's bytes, kept in 16-byte aligned storage for vector loads.
    std::vector<std::vector<float4_storage_t>> data;
    std::vector<uint64_t> bytes;
    std::vector<bool> null;
};

template <typename T>
static T argument(Buffers& b) {
    if constexpr (std::is_pointer_v<T>) {
        const uint64_t n = value<uint64_t>();
        if (n == UINT64_MAX) {
            b.data.emplace_back();
            b.bytes.push_back(0);
            b.null.push_back(true);
            return nullptr;
        }
        std::vector<float4_storage_t> store((n + 15) / 16);
        if (n && !read_exact(store.data(), n)) fail("input ends inside a buffer");
        b.data.push_back(std::move(store));
        b.bytes.push_back(n);
        b.null.push_back(false);
        return reinterpret_cast<T>(b.data.back().data());
    } else {
        static_assert(std::is_trivially_copyable_v<T>, "value arguments are plain data");
        return value<T>();
    }
}

using Launcher = std::function<void(rb_dim3, unsigned)>;

// Reads the arguments of `kernel` in order (the braced list evaluates left to right),
// launches it and writes every buffer back.
template <typename... A>
static Launcher bind(void (*kernel)(A...)) {
    return [kernel](rb_dim3 grid, unsigned threads) {
        Buffers b;
        b.data.reserve(sizeof...(A));  // pointers into data stay valid
        std::tuple<A...> args{argument<A>(b)...};
        rb_launch(grid, threads, [&] { std::apply(kernel, args); });
        for (size_t i = 0; i < b.data.size(); i++) {
            if (b.null[i]) continue;
            std::fwrite(&b.bytes[i], 8, 1, stdout);
            std::fwrite(b.data[i].data(), 1, b.bytes[i], stdout);
        }
        std::fflush(stdout);
    };
}

#define K(name) {#name, bind(name)}

int main() {
    const std::map<std::string, Launcher> kernels = {
#if RB_GROUP == 1
        K(cross_entropy), K(fill), K(axpy), K(scale), K(add_bias), K(partial_sums),
        K(activation_forward), K(activation_backward), K(loss_terms), K(loss_backward),
        K(to_bf16), K(embedding_forward), K(embedding_backward), K(sum_of_squares),
        K(moe_combine), K(moe_combine_backward), K(adam_update), K(sgd_update),
        K(quantize_activations), K(q8_matmul), K(q8_embedding), K(rmsnorm_forward),
        K(rmsnorm_backward), K(column_sum_chunks), K(column_sum), K(rope_forward),
        K(rope_backward), K(softmax_forward), K(softmax_backward), K(swiglu_forward),
        K(swiglu_backward),
#elif RB_GROUP == 2
        K(attention_forward), K(attention_backward_dq), K(attention_backward_dkv),
#else
        K(flash_forward_64), K(flash_forward_128), K(flash_backward_kv_64),
        K(flash_backward_kv_128), K(flash_backward_q_64), K(flash_backward_q_128),
        K(flash_delta),
#endif
    };
    uint32_t len;
    while (read_exact(&len, 4)) {
        std::string name(len, '\0');
        if (!read_exact(name.data(), len)) fail("input ends inside a kernel name");
        rb_dim3 grid{value<uint32_t>(), value<uint32_t>(), value<uint32_t>()};
        const uint32_t threads = value<uint32_t>();
        auto k = kernels.find(name);
        if (k == kernels.end()) {
            std::fprintf(stderr, "driver: no kernel named %s in this group\n", name.c_str());
            return 2;
        }
        k->second(grid, threads);
    }
    return 0;
}
