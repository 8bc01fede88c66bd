// backend_cpu_internal.h: what the CPU backend's files share (backend_cpu.c,
// backend_cpu_attention.c). Nothing outside the CPU backend includes it.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// ----------------------------------------------------------------------------
// scratch

// Scratch slots: each is one buffer kept for the life of the process and grown (never
// shrunk) when a call needs more, so steady-state steps allocate nothing.
enum { CPU_SCRATCH_ATTENTION, CPU_SCRATCH_PARTIALS, CPU_SCRATCH_COUNT };

// A 64-byte aligned buffer of at least `nfloats` floats for `slot`, or NULL with ft_error
// set. Call from serial code only (not inside a parallel region); the pointer stays valid
// until the next call for the same slot.
float *cpu_scratch(int slot, size_t nfloats);

// ----------------------------------------------------------------------------
// vector code

// CPU_VECTOR_CLONES on a function with hot `omp simd` loops compiles it three times
// (AVX-512, AVX2, the x86-64 baseline's SSE2) and picks the best for the running CPU when
// the program loads (GCC function multi-versioning; exp-heavy loops run 2-4x faster than
// in SSE2). Results are deterministic on a given machine; lane counts, hence summation
// orders, differ between the versions. Elsewhere (other architectures, other compilers):
// one version for the compiler's target.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_VECTOR_CLONES
#endif

// cond ? a : b on the bits, so that the compiler's default -ftrapping-math does not turn
// it into a branch (a float select may not be if-converted; this one vectorises)
static inline float cpu_select(int cond, float a, float b) {
    uint32_t ua, ub, mask = -(uint32_t)(cond != 0);
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    uint32_t r = (ua & mask) | (ub & ~mask);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

// e^x in fp32 within ~1 ulp, written so that loops under `#pragma omp simd` vectorise
// (glibc's expf is a scalar call). e^x = 2^n e^r with n = round(x / ln 2) and
// r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts, so r is exact to ~2^-32); e^r by its
// Taylor series to r^7, whose truncation error r^8/8! <= 5.3e-9 is below half an ulp;
// 2^n put straight into the exponent bits. x < -87 gives 0 (the true value is below
// 1.7e-38, the edge of the normal range), x > 88 gives +inf, NaN stays NaN.
static inline float cpu_expf(float x) {
    const float round_magic = 12582912.0f;   // 1.5 * 2^23: adding it rounds to an integer
    const int under = x < -87.0f, over = x > 88.0f;
    float xc = cpu_select(under, -87.0f, cpu_select(over, 88.0f, x));
    float n = (xc * 1.44269504088896341f + round_magic) - round_magic;
    float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;   // n in [-126, 127]: a normal 2^n
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return cpu_select(under, 0.0f, cpu_select(over, __builtin_inff(), p * scale));
}

// max of x[0..n) (-inf when n = 0), in 16 lanes that vectorise (an `omp simd
// reduction(max)` keeps its accumulator in memory at -O2: several times slower)
static inline float cpu_row_max(const float *x, int n) {
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = -__builtin_inff();
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
    for (; j < n; j++) lane[0] = x[j] > lane[0] ? x[j] : lane[0];
    float m = lane[0];
    for (int l = 1; l < 16; l++) m = lane[l] > m ? lane[l] : m;
    return m;
}

// ----------------------------------------------------------------------------
// attention (backend_cpu_attention.c), contracts as in backend.h

int cpu_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                      int T, int H, int KVH, int D, const int32_t *seg);
int cpu_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out,
                      const float *lse, const void *q, const void *k, const void *v, int B, int T,
                      int H, int KVH, int D, const int32_t *seg);

// ----------------------------------------------------------------------------
// FP8 (backend_cpu_fp8.c), contracts as in backend.h

#include "dtype.h"
#include "fp8.h"
int cpu_fp8_quantize(void *out, void *out_t, float *stats, const void *inp, int rows, int cols, fp8_format fmt);
int cpu_fp8_cast(void *out, void *out_t, float *stats, const float *amax, const void *inp, int rows, int cols,
                 fp8_format fmt);
// max |x| over x (n) (NaNs do not count; 0 for n = 0): fp8_quantize's amax, and rmsnorm_fwd's
// and swiglu_fwd's when asked
float cpu_amax(const float *x, size_t n);
int cpu_matmul_fp8(void *out, const void *a, fp8_format a_fmt, const float *a_stats, const void *b, fp8_format b_fmt,
                   const float *b_stats, int M, int N, int K, int accumulate, st_dtype out_dtype);
