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
// Before the kernel files: each registers its kernels (RB_EXPORT after every kernel).
#include "registry.h"

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
#include <string>

int main() {
    using namespace rb_emulate;
    const auto& all = kernels();
    uint32_t len;
    while (read_exact(&len, 4)) {
        std::string name(len, '\0');
        if (!read_exact(name.data(), len)) fail("input ends inside a kernel name");
        rb_dim3 grid{value<uint32_t>(), value<uint32_t>(), value<uint32_t>()};
        const uint32_t threads = value<uint32_t>();
        auto k = all.find(name);
        if (k == all.end()) {
            std::fprintf(stderr, "driver: no kernel named %s in this group\n", name.c_str());
            return 2;
        }
        k->second(grid, threads);
    }
    return 0;
}
