#include "moments.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace memascend {

namespace {
constexpr size_t kBlock = 4096;
constexpr uint32_t kExp = 0x7f800000u;

// The 16 random bits added to element `index` under `seed` (tests/engine/test_native_moments.py mirrors it in numpy).
uint32_t sr_noise(uint64_t index, uint32_t seed) {
    uint32_t h = static_cast<uint32_t>(index) * 0x9e3779b1u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h & 0xffffu;
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
        for (size_t i = 0; i < b; ++i) {
            const uint32_t bits = in[i];
            const uint32_t finite = (bits & kExp) != kExp;
            out[i] = static_cast<uint16_t>((bits + finite * sr_noise(start + i, seed)) >> 16);
        }
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
        for (size_t i = 0; i < b; ++i) out[i] = static_cast<uint32_t>(in[i]) << 16;
        std::memcpy(bytes + 4 * start, out, 4 * b);  // ends at or below the bf16 bytes of later blocks
    }
}

}  // namespace memascend
