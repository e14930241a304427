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

// A bf16 parameter holding its fp32 master's upper half (OptimizerPipeline.split in engine/optimizer_pipeline.py).
// master_split: the n int16 residuals at `residual` of the n fp32 masters at `master`: each master's bits less those
// of its bf16 round to nearest even (torch's: a NaN becomes 0x7fc0) shifted up. A master whose difference int16 cannot
// hold (a tie rounded down: +0x8000; a NaN) has its index written to `exceptions` while fewer than `cap` are; returns
// how many there are. master_join: in place, the n bf16 values at data + upper_byte (upper_byte >= 2n) and the n
// residuals become the n fp32 masters at data (ascending through a local block, as bf16_widen).
size_t master_split(const void* master, void* residual, size_t n, int64_t* exceptions, size_t cap);
void master_join(void* data, const void* residual, size_t n, size_t upper_byte);

}  // namespace memascend
