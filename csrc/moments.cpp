#include "moments.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

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

// split_block over a block whose first element is `start`, then (rarely) the indices of the masters its residual cannot
// hold, the same test one element at a time (a tie rounded down, a NaN), into exceptions while fewer than `cap` are;
// returns `count` plus their number.
size_t split_listing(const uint32_t* bits, int16_t* res, size_t b, size_t start, int64_t* exceptions, size_t cap,
                     size_t count) {
    if (split_block(bits, res, b) == 0) return count;
    for (size_t i = 0; i < b; ++i) {
        const uint32_t u = bits[i];
        const bool nan = (u & 0x7fffffffu) > kExp;
        const uint32_t upper = (u + ((u >> 16) & 1u) + 0x7fffu) & 0xffff0000u;
        if (nan || static_cast<int32_t>(u - upper) > 0x7fff) {
            if (count < cap) exceptions[count] = static_cast<int64_t>(start + i);
            ++count;
        }
    }
    return count;
}

MA_MOMENT_CLONES void join_block(const uint16_t* __restrict upper, const int16_t* __restrict res,
                                 uint32_t* __restrict out, size_t b) {
    for (size_t i = 0; i < b; ++i)
        out[i] = (static_cast<uint32_t>(upper[i]) << 16) + static_cast<uint32_t>(static_cast<int32_t>(res[i]));
}

}  // namespace

void bf16_narrow_sr(void* data, size_t n, uint32_t seed, size_t first) {
    if (n == 0) return;
    if (data == nullptr) throw std::invalid_argument("bf16_narrow_sr: null address with numel > 0");
    if (reinterpret_cast<uintptr_t>(data) % 4 != 0) throw std::invalid_argument("bf16_narrow_sr: address not 4-byte aligned");
    auto* bytes = static_cast<unsigned char*>(data);
    uint32_t in[kBlock];
    uint16_t out[kBlock];
    for (size_t start = first; start < first + n; start += kBlock) {
        const size_t b = std::min(kBlock, first + n - start);
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
        count = split_listing(bits, res, b, start, exceptions, cap, count);
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

namespace memascend {

namespace {
constexpr size_t kStepBlock = 1024;

// DeepSpeed's CPU Adam on fp32 values (ops/csrc/includes/cpu_adam.h Step_AVX: the same operations in the same order,
// each correctly rounded, so each element has the bits of its vector loop). No `a * b + c` in the source: the
// compiler contracts only what is written as std::fma. One loop per weight decay mode (L2 into the gradient, decoupled
// into the parameter, none), each without branches, so that it vectorises.
#define MA_ADAM_LOOP(L2, DECOUPLED)                                   \
    for (size_t i = 0; i < b; ++i) {                                  \
        float g = g_in[i];                                            \
        float param = p[i];                                           \
        if (L2) g = std::fma(param, k.weight_decay, g);               \
        float mo = m[i] * k.beta1;                                    \
        mo = std::fma(g, k.beta1_minus1, mo);                         \
        float va = v[i] * k.beta2;                                    \
        const float g2 = g * g;                                       \
        va = std::fma(g2, k.beta2_minus1, va);                        \
        float d = __builtin_sqrtf(va);                                \
        d = std::fma(d, k.bias_correction2, k.eps);                   \
        d = mo / d;                                                   \
        if (DECOUPLED) param = std::fma(param, k.w_decay, param);     \
        p[i] = std::fma(d, k.step_size, param);                       \
        m[i] = mo;                                                    \
        v[i] = va;                                                    \
    }

MA_MOMENT_CLONES void adam_plain(float* __restrict p, const float* __restrict g_in, float* __restrict m,
                                 float* __restrict v, size_t b, const AdamConstants k) {
    MA_ADAM_LOOP(false, false)
}

MA_MOMENT_CLONES void adam_l2(float* __restrict p, const float* __restrict g_in, float* __restrict m,
                              float* __restrict v, size_t b, const AdamConstants k) {
    MA_ADAM_LOOP(true, false)
}

MA_MOMENT_CLONES void adam_decoupled(float* __restrict p, const float* __restrict g_in, float* __restrict m,
                                     float* __restrict v, size_t b, const AdamConstants k) {
    MA_ADAM_LOOP(false, true)
}
#undef MA_ADAM_LOOP

// The next block's inputs on their way into the cache while this one is stepped: the pass streams five arrays at once
// (a 2M-element chunk on the 2-core dev VM, one thread: 3.6 ns per element with these, 3.7-3.9 without).
void prefetch_inputs(const unsigned char* master, const unsigned char* avg, const unsigned char* avg_sq,
                     const int16_t* residual, const float* grad, size_t upper_byte, unsigned flags, size_t start,
                     size_t b) {
    auto lines = [](const void* from, size_t bytes) {
        const auto* c = static_cast<const char*>(from);
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
    };
    if (b == 0) return;
    const bool widen = flags & kWidenMoments;
    lines(avg + (widen ? upper_byte + 2 * start : 4 * start), widen ? 2 * b : 4 * b);
    lines(avg_sq + (widen ? upper_byte + 2 * start : 4 * start), widen ? 2 * b : 4 * b);
    if (flags & kJoinMaster) {
        lines(master + upper_byte + 2 * start, 2 * b);
        lines(residual + start, 2 * b);
    } else {
        lines(master + 4 * start, 4 * b);
    }
    lines(grad + start, 4 * b);
}

void adam_block(float* p, const float* g, float* m, float* v, size_t b, const AdamConstants& k) {
    if (k.weight_decay > 0 && !k.adamw) adam_l2(p, g, m, v, b, k);
    else if (k.weight_decay > 0) adam_decoupled(p, g, m, v, b, k);
    else adam_plain(p, g, m, v, b, k);
}
}  // namespace

size_t adam_step_fused(float* master, int16_t* residual, float* exp_avg, float* exp_avg_sq, const float* grad,
                       size_t n, size_t upper_byte, unsigned flags, const int64_t* fixes, const float* fix_values,
                       size_t fix_count, const AdamConstants& k, uint32_t seed_avg, uint32_t seed_avg_sq,
                       int64_t* exceptions, size_t cap) {
    if (n == 0) return 0;
    if (master == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr || grad == nullptr ||
        ((flags & (kJoinMaster | kSplitMaster)) && residual == nullptr))
        throw std::invalid_argument("adam_step_fused: null address with numel > 0");
    if ((flags & (kWidenMoments | kJoinMaster)) && upper_byte < 2 * n)
        throw std::invalid_argument("adam_step_fused: the bf16 values must start at byte 2n or later");
    auto* mb = reinterpret_cast<unsigned char*>(master);
    auto* ab = reinterpret_cast<unsigned char*>(exp_avg);
    auto* sb = reinterpret_cast<unsigned char*>(exp_avg_sq);
    alignas(64) float p[kStepBlock], g[kStepBlock], m[kStepBlock], v[kStepBlock];
    alignas(64) uint16_t h[kStepBlock], out[kStepBlock];
    alignas(64) int16_t r[kStepBlock];
    size_t fix = 0, count = 0;
    for (size_t start = 0; start < n; start += kStepBlock) {
        const size_t b = std::min(kStepBlock, n - start);
        prefetch_inputs(mb, ab, sb, residual, grad, upper_byte, flags, start + kStepBlock,
                        std::min(kStepBlock, n - std::min(n, start + kStepBlock)));
        // In: every block's reads come before its writes, and the writes (fp32 at 4i, bf16 at 2i) end below the
        // bf16 values of later blocks (at upper_byte + 2i, upper_byte >= 2n), as in bf16_widen and bf16_narrow_sr.
        for (auto [t, bytes] : {std::pair{m, ab}, std::pair{v, sb}}) {
            if (flags & kWidenMoments) {
                std::memcpy(h, bytes + upper_byte + 2 * start, 2 * b);
                widen_block(h, reinterpret_cast<uint32_t*>(t), b);
            } else {
                std::memcpy(t, bytes + 4 * start, 4 * b);
            }
        }
        if (flags & kJoinMaster) {
            std::memcpy(h, mb + upper_byte + 2 * start, 2 * b);
            std::memcpy(r, residual + start, 2 * b);
            join_block(h, r, reinterpret_cast<uint32_t*>(p), b);
            for (; fix < fix_count && static_cast<size_t>(fixes[fix]) < start + b; ++fix)
                p[fixes[fix] - static_cast<int64_t>(start)] = fix_values[fix];
        } else {
            std::memcpy(p, master + start, 4 * b);
        }
        std::memcpy(g, grad + start, 4 * b);
        adam_block(p, g, m, v, b, k);
        std::memcpy(master + start, p, 4 * b);
        if (flags & kSplitMaster) {
            count = split_listing(reinterpret_cast<const uint32_t*>(p), r, b, start, exceptions, cap, count);
            std::memcpy(residual + start, r, 2 * b);
        }
        uint32_t seeds[2] = {seed_avg, seed_avg_sq};
        int which = 0;
        for (auto [t, bytes] : {std::pair{m, ab}, std::pair{v, sb}}) {
            if (flags & kNarrowMoments) {
                narrow_block(reinterpret_cast<const uint32_t*>(t), out, b, static_cast<uint32_t>(start), seeds[which]);
                std::memcpy(bytes + 2 * start, out, 2 * b);
            } else {
                std::memcpy(bytes + 4 * start, t, 4 * b);
            }
            ++which;
        }
    }
    return count;
}

}  // namespace memascend
