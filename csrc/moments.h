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

// `first` > 0: elements [first, first + n) only (the fp32 value of element i at data + 4i, its bf16 to data + 2i, its
// noise from index i), so that a buffer can be narrowed in ascending parts (each once) between other work.
void bf16_narrow_sr(void* data, size_t n, uint32_t seed, size_t first = 0);
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

namespace memascend {

// DeepSpeed's CPU Adam step constants as its op computes them for the call (cpu_adam.h: update_state, Step_AVX).
struct AdamConstants {
    float beta1, beta2, beta1_minus1, beta2_minus1, eps, bias_correction2, step_size, weight_decay, w_decay;
    bool adamw;
};

constexpr unsigned kWidenMoments = 1, kJoinMaster = 2, kSplitMaster = 4, kNarrowMoments = 8;

// One optimizer chunk's step in one pass over it (engine/one_pass_step.py): per block of elements, exp_avg / exp_avg_sq
// widened from bf16 at byte upper_byte (kWidenMoments; else fp32 in place), the master joined from its bf16 upper
// halves at byte upper_byte and its residual (kJoinMaster, then the `fixes` masters, ascending indices; else fp32 in
// place), DeepSpeed's Adam with `k` on the fp32 gradient, the master (fp32, in place) split again into its residual
// (kSplitMaster: as master_split, exceptions' indices out, returns their count) and the moments narrowed with
// stochastic rounding (kNarrowMoments, as bf16_narrow_sr with the seeds; else fp32 in place). The bits of those
// functions and of DeepSpeed's vector loop, one after the other over the whole chunk.
size_t adam_step_fused(float* master, int16_t* residual, float* exp_avg, float* exp_avg_sq, const float* grad,
                       size_t n, size_t upper_byte, unsigned flags, const int64_t* fixes, const float* fix_values,
                       size_t fix_count, const AdamConstants& k, uint32_t seed_avg, uint32_t seed_avg_sq,
                       int64_t* exceptions, size_t cap);

}  // namespace memascend
