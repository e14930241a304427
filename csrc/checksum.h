// CRC-32C (Castagnoli, the iSCSI / ext4 / RocksDB polynomial 0x1EDC6F41) for the Direct NVMe
// store's per-chunk checksums.
//
// x86-64 with SSE4.2: the crc32 instruction, three chunks in lockstep (the instruction has a
// 3-cycle latency and 1-cycle throughput, so three independent streams keep it busy without the
// shift-and-combine step a single-buffer interleave needs). Elsewhere, or with
// MEMASCEND_CRC32C=portable: slicing-by-8 tables. Both give identical results (tested against
// the RFC 3720 vectors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace memascend {

// Standard CRC-32C of `n` bytes continuing from `crc` (0 for a fresh checksum):
// crc32c_update(crc32c_update(0, a), b) == crc32c of a||b.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t n);

// The checksums of consecutive `chunk_bytes` chunks of the concatenation of `segments`
// ((address, bytes) pairs); the last chunk may be shorter. Chunks may span segments.
std::vector<uint32_t> crc32c_chunks(const std::vector<std::pair<uintptr_t, size_t>>& segments, size_t chunk_bytes);

// "sse4.2" or "portable": what crc32c_update uses on this CPU / with this environment.
const char* crc32c_backend();

}  // namespace memascend
