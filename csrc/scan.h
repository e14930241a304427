// Fused non-finite scan: one pass over a fp16 / bf16 / fp32 buffer, answering "is any element inf
// or nan?" without allocating anything proportional to the element count.
//
// An IEEE value is non-finite exactly when all its exponent bits are set, so the scan works on the
// raw bits: (bits & EXP) == EXP, with EXP = 0x7f800000 (fp32), 0x7c00 (fp16), 0x7f80 (bf16).
// Per block it max-reduces (bits & ~SIGN) -- non-finite iff the max >= EXP -- which compilers turn
// into packed integer max instructions; blocks are spread over std::threads with an early exit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace memascend {

enum class ScanDtype { Float16, BFloat16, Float32 };

// Accepts "float16"/"half"/"fp16", "bfloat16"/"bf16", "float32"/"float"/"fp32" (and "torch.<name>").
ScanDtype parse_scan_dtype(const std::string& name);
size_t scan_dtype_bytes(ScanDtype dt);

// num_threads == 0: use all hardware threads (small inputs stay single-threaded, since starting a
// thread costs more than scanning a few MiB). Throws std::invalid_argument for a null or
// misaligned (not element-aligned) pointer with numel > 0.
bool has_nonfinite(const void* data, size_t numel, ScanDtype dtype, unsigned num_threads = 0);

}  // namespace memascend
