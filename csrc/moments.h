// Adam moments kept on the SSD in bf16 (EngineOptions.optimizer_moments = "bf16"): the optimizer pipeline's fp32
// slot buffers are converted in place, so no staging memory is needed.
//
// bf16_narrow_sr: the n fp32 values at `data` become n bf16 values in the first 2n bytes, rounded stochastically
// (a value between two bf16 neighbours goes up with probability equal to its distance from the lower one; Gupta et
// al. 2015). The 16 random bits of element i are a hash (murmur3's finaliser) of i and `seed`: independent of the
// value, so the rounding is unbiased. Infinities and NaNs keep their bits' class (no noise added).
// bf16_widen: the n bf16 values at data + upper_byte (upper_byte >= 2n) become n fp32 values at `data` (exact).
// Both walk ascending through a small local block, so every write lands on bytes already read.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memascend {

void bf16_narrow_sr(void* data, size_t n, uint32_t seed);
void bf16_widen(void* data, size_t n, size_t upper_byte);

}  // namespace memascend
