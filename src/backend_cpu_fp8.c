// backend_cpu_fp8.c: the CPU backend's FP8 ops (backend.h fp8_quantize, fp8_cast, matmul_fp8), the
// reference the CUDA backend's kernels and cuBLASLt FP8 GEMMs are tested against. The
// conversions are src/fp8.c's; the GEMM decodes the codes to fp32 (exact) and multiplies
// with OpenBLAS.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cpu_internal.h"
#include "common.h"
#include "fp8.h"

float cpu_amax(const float *x, size_t n) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));   // fmaxf: NaNs do not count
    return amax;
}

// 0, or -1 with a line naming `op` (a format that is none, a negative shape)
static int fp8_args(const char *op, int rows, int cols, fp8_format fmt) {
    if (fmt >= FP8_FORMAT_COUNT) return ft_error("%s: format %d (0 e4m3, 1 e5m2)", op, (int)fmt);
    if (rows < 0 || cols < 0) return ft_error("%s: shape %d x %d", op, rows, cols);
    return 0;
}

int cpu_fp8_cast(void *out, void *out_t, float *stats, const float *amax, const void *inp, int rows, int cols,
                 fp8_format fmt) {
    TRY(fp8_args("fp8_cast", rows, cols, fmt));
    const float *x = inp;
    const size_t n = (size_t)rows * cols;
    const float a = *amax, scale = fp8_scale_from_amax(a, fmt);
    stats[0] = a;
    stats[1] = scale;
    stats[2] = 1.0f / scale;
    uint8_t *o = out, *ot = out_t;
    for (size_t i = 0; i < n; i++) {
        const uint8_t q = fp8_from_float_sat(x[i] * scale, fmt);
        if (o) o[i] = q;
        if (ot) ot[(i % (size_t)cols) * (size_t)rows + i / (size_t)cols] = q;
    }
    return 0;
}

int cpu_fp8_quantize(void *out, void *out_t, float *stats, const void *inp, int rows, int cols, fp8_format fmt) {
    TRY(fp8_args("fp8_quantize", rows, cols, fmt));
    const float amax = rows > 0 && cols > 0 ? cpu_amax(inp, (size_t)rows * cols) : 0.0f;
    return cpu_fp8_cast(out, out_t, stats, &amax, inp, rows, cols, fmt);
}

// codes (n) -> fp32 values (exact)
static void decode(float *dst, const uint8_t *src, size_t n, fp8_format fmt) {
    float lut[256];
    for (int c = 0; c < 256; c++) lut[c] = fp8_to_float((uint8_t)c, fmt);
    for (size_t i = 0; i < n; i++) dst[i] = lut[src[i]];
}

int cpu_matmul_fp8(void *out, const void *a, fp8_format a_fmt, const float *a_stats, const void *b, fp8_format b_fmt,
                   const float *b_stats, int M, int N, int K, int accumulate, st_dtype out_dtype) {
    if (a_fmt >= FP8_FORMAT_COUNT || b_fmt >= FP8_FORMAT_COUNT || (a_fmt == FP8_E5M2 && b_fmt == FP8_E5M2))
        return ft_error("matmul_fp8: formats %s x %s (e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3)", fp8_name(a_fmt),
                        fp8_name(b_fmt));
    if (out_dtype != ST_F32)   // the storage dtype, and an fp32 gradient's: one and the same here
        return ft_error("matmul_fp8: output dtype %s on the fp32 CPU backend", st_dtype_name(out_dtype));
    if (M <= 0 || N <= 0 || K <= 0 || K % 16 != 0)   // the CUDA backend's rule (Hopper's), kept by the reference
        return ft_error("matmul_fp8: shape M %d N %d K %d (K a multiple of 16: the FP8 GEMM's rows)", M, N, K);
    float *fa = malloc(sizeof(float) * ((size_t)M * K + (size_t)N * K));
    if (!fa) return ft_error("matmul_fp8: out of host memory (%d x %d x %d)", M, N, K);
    float *fb = fa + (size_t)M * K;
    decode(fa, a, (size_t)M * K, a_fmt);
    decode(fb, b, (size_t)N * K, b_fmt);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, a_stats[2] * b_stats[2], fa, K, fb, K,
                accumulate ? 1.0f : 0.0f, out, N);
    free(fa);
    return 0;
}
