#include "moments.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace memascend {

namespace {
constexpr size_t kBlock = 4096;
constexpr uint32_t kExp = 0x7f800000u;

// The per-block loops are built for baseline x86-64 and dispatched at load time (ifunc) to an AVX2 clone, as the
// scan's (scan.cpp): baseline SSE2 has no 32-bit vector multiply, so the noise hash ran one element at a time
// (~1.7 ns per element: 0.46 s a step for bench-llama-136m's two moments). Same integer arithmetic, same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MA_MOMENT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), noinline))
#else
#define MA_MOMENT_CLONES __attribute__((noinline))
#endif

// The 16 random bits added to element `index` under `seed` (tests/engine/test_native_moments.py mirrors it in numpy).
inline uint32_t sr_noise(uint32_t index, uint32_t seed) {
    uint32_t h = index * 0x9e3779b1u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h & 0xffffu;
}

// `first`: the low 32 bits of the block's first element index (the hash takes the index modulo 2^32).
MA_MOMENT_CLONES void narrow_block(const uint32_t* __restrict in, uint16_t* __restrict out, size_t b, uint32_t first,
                                   uint32_t seed) {
    for (size_t i = 0; i < b; ++i) {
        const uint32_t bits = in[i];
        const uint32_t finite = (bits & kExp) != kExp;
        out[i] = static_cast<uint16_t>((bits + finite * sr_noise(first + static_cast<uint32_t>(i), seed)) >> 16);
    }
}

MA_MOMENT_CLONES void widen_block(const uint16_t* __restrict in, uint32_t* __restrict out, size_t b) {
    for (size_t i = 0; i < b; ++i) out[i] = static_cast<uint32_t>(in[i]) << 16;
}

// Returns how many of the block's masters the residual cannot hold (their indices are found apart: rare).
MA_MOMENT_CLONES size_t split_block(const uint32_t* __restrict bits, int16_t* __restrict res, size_t b) {
    size_t bad = 0;
    for (size_t i = 0; i < b; ++i) {
        const uint32_t u = bits[i];
        const uint32_t nan = (u & 0x7fffffffu) > kExp;
        const uint32_t rne = (u + ((u >> 16) & 1u) + 0x7fffu) & 0xffff0000u;
        const uint32_t upper = nan ? 0x7fc00000u : rne;
        const int32_t diff = static_cast<int32_t>(u - upper);  // wraps: [-0x8000, 0x8000] unless NaN
        res[i] = static_cast<int16_t>(diff);
        bad += nan | static_cast<uint32_t>(diff > 0x7fff);
    }
    return bad;
}

MA_MOMENT_CLONES void join_block(const uint16_t* __restrict upper, const int16_t* __restrict res,
                                 uint32_t* __restrict out, size_t b) {
    for (size_t i = 0; i < b; ++i)
        out[i] = (static_cast<uint32_t>(upper[i]) << 16) + static_cast<uint32_t>(static_cast<int32_t>(res[i]));
}

}  // namespace

void bf16_narrow_sr(void* data, size_t n, uint32_t seed) {
    if (n == 0) return;
    if (data == nullptr) throw std::invalid_argument("bf16_narrow_sr: null address with numel > 0");
    if (reinterpret_cast<uintptr_t>(data) % 4 != 0) throw std::invalid_argument("bf16_narrow_sr: address not 4-byte aligned");
    auto* bytes = static_cast<unsigned char*>(data);
    uint32_t in[kBlock];
    uint16_t out[kBlock];
    for (size_t start = 0; start < n; start += kBlock) {
        const size_t b = std::min(kBlock, n - start);
        std::memcpy(in, bytes + 4 * start, 4 * b);
        narrow_block(in, out, b, static_cast<uint32_t>(start), seed);
        std::memcpy(bytes + 2 * start, out, 2 * b);  // at or below the fp32 bytes read so far
    }
}

void bf16_widen(void* data, size_t n, size_t upper_byte) {
    if (n == 0) return;
    if (data == nullptr) throw std::invalid_argument("bf16_widen: null address with numel > 0");
    if (upper_byte < 2 * n) throw std::invalid_argument("bf16_widen: the bf16 values must start at byte 2n or later");
    auto* bytes = static_cast<unsigned char*>(data);
    uint16_t in[kBlock];
    uint32_t out[kBlock];
    for (size_t start = 0; start < n; start += kBlock) {
        const size_t b = std::min(kBlock, n - start);
        std::memcpy(in, bytes + upper_byte + 2 * start, 2 * b);
        widen_block(in, out, b);
        std::memcpy(bytes + 4 * start, out, 4 * b);  // ends at or below the bf16 bytes of later blocks
    }
}

size_t master_split(const void* master, void* residual, size_t n, int64_t* exceptions, size_t cap) {
    if (n == 0) return 0;
    if (master == nullptr || residual == nullptr) throw std::invalid_argument("master_split: null address with numel > 0");
    const auto* in = static_cast<const unsigned char*>(master);
    auto* out = static_cast<unsigned char*>(residual);
    uint32_t bits[kBlock];
    int16_t res[kBlock];
    size_t count = 0;
    for (size_t start = 0; start < n; start += kBlock) {
        const size_t b = std::min(kBlock, n - start);
        std::memcpy(bits, in + 4 * start, 4 * b);
        if (split_block(bits, res, b) != 0) {
            for (size_t i = 0; i < b; ++i) {  // the same test one element at a time: a tie rounded down, a NaN
                const uint32_t u = bits[i];
                const bool nan = (u & 0x7fffffffu) > kExp;
                const uint32_t upper = (u + ((u >> 16) & 1u) + 0x7fffu) & 0xffff0000u;
                if (nan || static_cast<int32_t>(u - upper) > 0x7fff) {
                    if (count < cap) exceptions[count] = static_cast<int64_t>(start + i);
                    ++count;
                }
            }
        }
        std::memcpy(out + 2 * start, res, 2 * b);
    }
    return count;
}

void master_join(void* data, const void* residual, size_t n, size_t upper_byte) {
    if (n == 0) return;
    if (data == nullptr || residual == nullptr) throw std::invalid_argument("master_join: null address with numel > 0");
    if (upper_byte < 2 * n) throw std::invalid_argument("master_join: the bf16 values must start at byte 2n or later");
    auto* bytes = static_cast<unsigned char*>(data);
    const auto* low = static_cast<const unsigned char*>(residual);
    uint16_t upper[kBlock];
    int16_t res[kBlock];
    uint32_t out[kBlock];
    for (size_t start = 0; start < n; start += kBlock) {
        const size_t b = std::min(kBlock, n - start);
        std::memcpy(upper, bytes + upper_byte + 2 * start, 2 * b);
        std::memcpy(res, low + 2 * start, 2 * b);
        join_block(upper, res, out, b);
        std::memcpy(bytes + 4 * start, out, 4 * b);  // ends at or below the bf16 bytes of later blocks
    }
}

}  // namespace memascend
