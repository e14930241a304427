#include "scan.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

namespace memascend {

namespace {

// Build once for baseline x86-64 and dispatch at load time (ifunc) to an AVX2 clone, so
// the wheel runs anywhere yet uses wide vectors where present. Other compilers/arches: baseline.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MA_SCAN_CLONES __attribute__((target_clones("avx2", "default"), noinline))
#else
#define MA_SCAN_CLONES __attribute__((noinline))
#endif

// Elements per block: large enough to amortise the early-exit check, small enough to stay in L1/L2.
constexpr size_t kBlockElems = 16384;
// Below this many elements per thread, threads cost more than they save.
constexpr size_t kMinElemsPerThread = size_t(1) << 20;

// Masked values are < 2^15 (resp. 2^31), so signed max is exact and maps to pmaxsw / pmaxsd.
MA_SCAN_CLONES bool block_nonfinite_u16(const uint16_t* __restrict p, size_t n, int16_t exp_mask) {
    int16_t m = 0;
    for (size_t i = 0; i < n; ++i) {
        int16_t v = static_cast<int16_t>(p[i] & 0x7fff);
        m = v > m ? v : m;
    }
    return m >= exp_mask;
}

MA_SCAN_CLONES bool block_nonfinite_u32(const uint32_t* __restrict p, size_t n) {
    int32_t m = 0;
    for (size_t i = 0; i < n; ++i) {
        int32_t v = static_cast<int32_t>(p[i] & 0x7fffffffu);
        m = v > m ? v : m;
    }
    return m >= 0x7f800000;
}

struct Range {
    const void* data;
    size_t begin, end;
};

bool scan_range(const Range& r, ScanDtype dt, const std::atomic<bool>& found) {
    for (size_t b = r.begin; b < r.end; b += kBlockElems) {
        if (found.load(std::memory_order_relaxed)) return false;  // another thread already answered
        const size_t n = std::min(kBlockElems, r.end - b);
        bool hit;
        switch (dt) {
            case ScanDtype::Float32: hit = block_nonfinite_u32(static_cast<const uint32_t*>(r.data) + b, n); break;
            case ScanDtype::Float16: hit = block_nonfinite_u16(static_cast<const uint16_t*>(r.data) + b, n, 0x7c00); break;
            default: hit = block_nonfinite_u16(static_cast<const uint16_t*>(r.data) + b, n, 0x7f80); break;
        }
        if (hit) return true;
    }
    return false;
}

}  // namespace

ScanDtype parse_scan_dtype(const std::string& name_in) {
    std::string name = name_in.rfind("torch.", 0) == 0 ? name_in.substr(6) : name_in;
    if (name == "float16" || name == "half" || name == "fp16") return ScanDtype::Float16;
    if (name == "bfloat16" || name == "bf16") return ScanDtype::BFloat16;
    if (name == "float32" || name == "float" || name == "fp32") return ScanDtype::Float32;
    throw std::invalid_argument("unsupported dtype '" + name_in + "' for the non-finite scan (use float16, bfloat16 or float32)");
}

size_t scan_dtype_bytes(ScanDtype dt) { return dt == ScanDtype::Float32 ? 4 : 2; }

bool has_nonfinite(const void* data, size_t numel, ScanDtype dt, unsigned num_threads) {
    if (numel == 0) return false;
    const size_t esize = scan_dtype_bytes(dt);
    if (data == nullptr) throw std::invalid_argument("has_nonfinite: null address with numel > 0");
    if (reinterpret_cast<uintptr_t>(data) % esize != 0)
        throw std::invalid_argument("has_nonfinite: address is not aligned to the element size (" + std::to_string(esize) + " bytes)");

    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    size_t nthreads = num_threads ? num_threads : hw;
    nthreads = std::min(nthreads, std::max<size_t>(1, numel / kMinElemsPerThread));
    std::atomic<bool> found{false};
    if (nthreads <= 1) return scan_range({data, 0, numel}, dt, found);

    // Contiguous ranges, split on block boundaries (keeps each thread's loads sequential).
    const size_t blocks = (numel + kBlockElems - 1) / kBlockElems;
    const size_t per = (blocks + nthreads - 1) / nthreads;
    std::vector<std::thread> workers;  // O(threads), not O(numel)
    workers.reserve(nthreads - 1);
    auto run = [&](size_t t) {
        const size_t b = std::min(numel, t * per * kBlockElems);
        const size_t e = std::min(numel, (t + 1) * per * kBlockElems);
        if (b < e && scan_range({data, b, e}, dt, found)) found.store(true, std::memory_order_relaxed);
    };
    size_t t = 1;
    try {
        for (; t < nthreads; ++t) workers.emplace_back(run, t);
    } catch (const std::system_error&) {
        // Could not start more threads: scan the remaining ranges here instead.
        for (size_t u = t; u < nthreads; ++u) run(u);
    }
    run(0);
    for (auto& w : workers) w.join();
    return found.load();
}

}  // namespace memascend
