// fp8_quantize.cu: per-tensor FP8 quantisation of a bf16 tensor (--fp8; backend.h
// fp8_quantize): amax = max |x|, scale = fp8_max / amax (1 when amax is 0 or not finite),
// codes = cvt.rn.satfinite(x * scale), optionally also transposed.
//   pass 1: G = min(ceil(n / (256 * 16)), 1024) blocks of 256 threads, grid-stride over the
//     elements: each thread's max of |x| (fmaxf: NaNs do not count), warp and block max ->
//     partial[b] (fp32, scratch).
//   pass 2: one block: the max of the partials -> stats = {amax, scale, 1 / scale}.
//   pass 3: grid-stride cast, one element per thread: out[r, c] and/or out_t[c, r] (the
//     transposed store is strided: a tiled transpose fused with pass 1 is the follow-up).
//   numerics: max is exact and order-free; scale is one IEEE division, the product x * scale
//     one fp32 rounding, the conversion one more (ties to even, saturating), bitwise the host's
//     fp8_from_float_sat(x * fp8_scale_from_amax(amax)) (src/fp8.c).
#include "common.cuh"

#include <cuda_fp8.h>   // __nv_cvt_float_to_fp8 (cvt.rn.satfinite on sm_89+, its exact software path elsewhere)

#define Q_THREADS 256
#define Q_MAX_BLOCKS 1024

// the format's largest finite value (fmt: fp8_format, 0 = e4m3, 1 = e5m2)
__device__ __forceinline__ float fp8_fmt_max(int fmt) { return fmt == 1 ? 57344.0f : 448.0f; }

__device__ __forceinline__ unsigned char fp8_cvt_sat(float x, int fmt) {
    return (unsigned char)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt == 1 ? __NV_E5M2 : __NV_E4M3);
}

__global__ void __launch_bounds__(Q_THREADS)
fp8_amax_partial_kernel(float *partial, const bf16 *x, size_t n) {
    __shared__ float scratch[32];
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(bf2f(x[i])));
    m = block_max(m, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

__global__ void __launch_bounds__(Q_THREADS)
fp8_amax_final_kernel(float *stats, const float *partial, int G, int fmt) {
    __shared__ float scratch[32];
    float m = 0.0f;
    for (int i = threadIdx.x; i < G; i += blockDim.x) m = fmaxf(m, partial[i]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) {
        // (a tiny amax, below the format's max / FLT_MAX, would make the scale inf: clamped)
        const float scale = m > 0.0f && isfinite(m) ? fminf(fp8_fmt_max(fmt) / m, 3.40282347e38f) : 1.0f;
        stats[0] = m;
        stats[1] = scale;
        stats[2] = 1.0f / scale;
    }
}

__global__ void __launch_bounds__(Q_THREADS)
fp8_cast_kernel(unsigned char *out, unsigned char *out_t, const float *stats, const bf16 *x, int rows, int cols,
                int fmt) {
    const size_t n = (size_t)rows * cols;
    const float scale = stats[1];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const unsigned char q = fp8_cvt_sat(bf2f(x[i]) * scale, fmt);
        if (out) out[i] = q;
        if (out_t) out_t[(i % (size_t)cols) * rows + i / (size_t)cols] = q;
    }
}

extern "C" int ftk_fp8_quantize(void *out, void *out_t, float *stats, const void *inp, int rows, int cols, int fmt,
                                ftk_stream stream) {
    if (fmt != 0 && fmt != 1) return ft_error("fp8_quantize: format %d (0 e4m3, 1 e5m2)", fmt);
    if (rows < 0 || cols < 0) return ft_error("fp8_quantize: shape %d x %d", rows, cols);
    const size_t n = (size_t)rows * cols;
    const size_t g = (n + (size_t)Q_THREADS * 16 - 1) / ((size_t)Q_THREADS * 16);
    const int G = g < 1 ? 1 : g > Q_MAX_BLOCKS ? Q_MAX_BLOCKS : (int)g;
    float *partial = NULL;
    if (ftk_scratch_get((void **)&partial, sizeof(float) * G, stream, "fp8_quantize (partials)") != 0) return -1;
    LAUNCH_KERNEL(dim3(G), dim3(Q_THREADS), 0, stream, fp8_amax_partial_kernel)(partial, (const bf16 *)inp, n);
    int rc = launch_check("fp8_quantize (amax)");
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(1), dim3(Q_THREADS), 0, stream, fp8_amax_final_kernel)(stats, partial, G, fmt);
        rc = launch_check("fp8_quantize (scale)");
    }
    if (rc == 0 && n > 0 && (out || out_t)) {
        LAUNCH_KERNEL(dim3(elementwise_blocks(n, Q_THREADS)), dim3(Q_THREADS), 0, stream, fp8_cast_kernel)(
            (unsigned char *)out, (unsigned char *)out_t, stats, (const bf16 *)inp, rows, cols, fmt);
        rc = launch_check("fp8_quantize (cast)");
    }
    ftk_scratch_put(partial, stream);
    return rc;
}
