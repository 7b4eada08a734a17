// The emulator's kernels by name, each registered by its own file: RB_EXPORT(name), written
// after every kernel of cu/, makes a launcher that reads the kernel's arguments from stdin
// in its declared order, runs it (cuda_shim.h's rb_launch) and writes every buffer back.
// Included by driver.cpp after cuda_shim.h and before the kernel files; NVRTC never sees
// it (common.cuh defines RB_EXPORT as nothing there).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_shim.h"

namespace rb_emulate {

inline bool read_exact(void* p, size_t n) { return std::fread(p, 1, n, stdin) == n; }

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "driver: %s\n", what);
    std::exit(2);
}

template <typename T>
T value() {
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
T argument(Buffers& b) {
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
Launcher bind(void (*kernel)(A...)) {
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

// Every registered kernel (a function's static, so it exists before the first registration
// whatever the order of static initialization).
inline std::map<std::string, Launcher>& kernels() {
    static std::map<std::string, Launcher> all;
    return all;
}

// Adds a kernel; a second kernel of the same name in one driver is an error.
inline bool add(const char* name, Launcher launch) {
    if (!kernels().emplace(name, std::move(launch)).second) {
        std::fprintf(stderr, "driver: two kernels named %s\n", name);
        std::exit(2);
    }
    return true;
}

}  // namespace rb_emulate

#define RB_EXPORT(name) \
    [[maybe_unused]] static const bool rb_exported_##name = rb_emulate::add(#name, rb_emulate::bind(name));
