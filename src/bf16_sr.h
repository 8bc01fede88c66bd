// bf16_sr.h: stochastic rounding of fp32 to bf16 with counter-based random bits, shared by
// the CPU backend's AdamW and the CUDA kernel (kernels/adamw.cu), which must produce the same
// bits. The bits of an element are a hash of (seed, optimizer step, which moment, the
// element's index among the model's parameters: the flat layout without the units' padding,
// which depends on the shard size): no random state, the same bits on any world size, shard
// size or device.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define FT_SR_FN __host__ __device__ static inline
#else
#define FT_SR_FN static inline
#endif

// a 32-bit finaliser (every input bit reaches every output bit; a bijection)
FT_SR_FN uint32_t ft_sr_mix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

// the key of one stream: moment `which` (0 exp_avg, 1 exp_avg_sq) of optimizer step `step`
FT_SR_FN uint32_t ft_sr_key(uint32_t seed, uint32_t step, uint32_t which) {
    return ft_sr_mix32(seed ^ ft_sr_mix32(step * 2u + which + 0x9e3779b9u));
}

// the 32 random bits of global element `gi` in the stream `key`
FT_SR_FN uint32_t ft_sr_bits(uint32_t key, uint64_t gi) {
    return ft_sr_mix32((uint32_t)gi ^ ft_sr_mix32(key + (uint32_t)(gi >> 32) * 0x9e3779b9u));
}

// fp32 (its bits u) to bf16 bits, rounded up in magnitude with probability (the dropped 16
// bits) / 2^16 using the low 16 bits of r: unbiased, E[result] = the fp32 value. Inf and NaN
// are rounded to nearest even (NaN kept quiet). Adding to the magnitude bits carries into the
// exponent where it should (up to inf past the largest finite bf16).
FT_SR_FN uint16_t ft_f32_to_bf16_sr(uint32_t u, uint32_t r) {
    if ((u & 0x7f800000u) == 0x7f800000u) {
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
        return (uint16_t)(u >> 16);
    }
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}
