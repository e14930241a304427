#include "checksum.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define MEMASCEND_X86 1
#endif

namespace memascend {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected 0x1EDC6F41

struct Tables {
    uint32_t t[8][256];
    Tables() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
};

const Tables& tables() {
    static const Tables tb;
    return tb;
}

// Raw state update (no pre/post inversion), slicing-by-8.
uint32_t sw_raw(uint32_t c, const uint8_t* p, size_t n) {
    const Tables& tb = tables();
    while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
        c = (c >> 8) ^ tb.t[0][(c ^ *p++) & 0xFF];
        --n;
    }
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        v ^= c;  // little-endian: the low 4 bytes take the running state
        c = tb.t[7][v & 0xFF] ^ tb.t[6][(v >> 8) & 0xFF] ^ tb.t[5][(v >> 16) & 0xFF] ^ tb.t[4][(v >> 24) & 0xFF] ^
            tb.t[3][(v >> 32) & 0xFF] ^ tb.t[2][(v >> 40) & 0xFF] ^ tb.t[1][(v >> 48) & 0xFF] ^ tb.t[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ tb.t[0][(c ^ *p++) & 0xFF];
    return c;
}

void sw_three(uint32_t* c, const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, size_t n) {
    c[0] = sw_raw(c[0], p0, n);
    c[1] = sw_raw(c[1], p1, n);
    c[2] = sw_raw(c[2], p2, n);
}

#ifdef MEMASCEND_X86
__attribute__((target("sse4.2"))) uint32_t hw_raw(uint32_t c, const uint8_t* p, size_t n) {
    while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
        c = _mm_crc32_u8(c, *p++);
        --n;
    }
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    c = static_cast<uint32_t>(c64);
    while (n--) c = _mm_crc32_u8(c, *p++);
    return c;
}

// Three equal-length streams in lockstep: independent dependency chains fill the pipeline.
__attribute__((target("sse4.2"))) void hw_three(uint32_t* c, const uint8_t* p0, const uint8_t* p1,
                                                const uint8_t* p2, size_t n) {
    uint64_t a = c[0], b = c[1], d = c[2];
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v0, v1, v2;
        std::memcpy(&v0, p0 + i, 8);
        std::memcpy(&v1, p1 + i, 8);
        std::memcpy(&v2, p2 + i, 8);
        a = _mm_crc32_u64(a, v0);
        b = _mm_crc32_u64(b, v1);
        d = _mm_crc32_u64(d, v2);
    }
    c[0] = hw_raw(static_cast<uint32_t>(a), p0 + i, n - i);
    c[1] = hw_raw(static_cast<uint32_t>(b), p1 + i, n - i);
    c[2] = hw_raw(static_cast<uint32_t>(d), p2 + i, n - i);
}
#endif

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);
using ThreeFn = void (*)(uint32_t*, const uint8_t*, const uint8_t*, const uint8_t*, size_t);

struct Impl {
    RawFn raw = sw_raw;
    ThreeFn three = sw_three;
    const char* name = "portable";
    Impl() {
        const char* env = std::getenv("MEMASCEND_CRC32C");
        const bool force_portable = env && std::string(env) == "portable";
#ifdef MEMASCEND_X86
        if (!force_portable && __builtin_cpu_supports("sse4.2")) {
            raw = hw_raw;
            three = hw_three;
            name = "sse4.2";
        }
#else
        (void)force_portable;
#endif
    }
};

const Impl& impl() {
    static const Impl i;
    return i;
}

}  // namespace

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
    return ~impl().raw(~crc, static_cast<const uint8_t*>(data), n);
}

const char* crc32c_backend() { return impl().name; }

std::vector<uint32_t> crc32c_chunks(const std::vector<std::pair<uintptr_t, size_t>>& segments, size_t chunk_bytes) {
    if (chunk_bytes == 0) throw std::invalid_argument("crc32c_chunks: chunk_bytes must be positive");
    const Impl& f = impl();
    size_t total = 0;
    for (const auto& s : segments) total += s.second;
    std::vector<uint32_t> out;
    out.reserve((total + chunk_bytes - 1) / chunk_bytes);
    uint32_t state = ~0u;  // raw state of the chunk being built
    size_t filled = 0;     // bytes of the current chunk already consumed
    for (const auto& seg : segments) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(seg.first);
        size_t n = seg.second;
        while (n) {
            if (filled == 0 && n >= 3 * chunk_bytes) {
                // Whole chunks inside this segment: three at a time.
                uint32_t c[3] = {~0u, ~0u, ~0u};
                f.three(c, p, p + chunk_bytes, p + 2 * chunk_bytes, chunk_bytes);
                out.push_back(~c[0]);
                out.push_back(~c[1]);
                out.push_back(~c[2]);
                p += 3 * chunk_bytes;
                n -= 3 * chunk_bytes;
                continue;
            }
            const size_t take = std::min(n, chunk_bytes - filled);
            state = f.raw(state, p, take);
            filled += take;
            p += take;
            n -= take;
            if (filled == chunk_bytes) {
                out.push_back(~state);
                state = ~0u;
                filled = 0;
            }
        }
    }
    if (filled) out.push_back(~state);
    return out;
}

}  // namespace memascend
