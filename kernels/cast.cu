// cast.cu: dst (n, bf16) = src (n, fp32), round to nearest even (NaN stays NaN).
//   launch: grid-stride, 256 threads; groups of 8 (two float4 loads, one 16-byte store)
//   while the pointers are 16-byte aligned, single elements otherwise.
//   numerics: exactly __float2bfloat16_rn (one rounding); bitwise equal to the host cast.
#include "common.cuh"

#define CAST_THREADS 256

__global__ void __launch_bounds__(CAST_THREADS)
cast_from_f32_kernel(bf16 *dst, const float *src, size_t n, size_t nvec) {
    const size_t items = nvec + (n - nvec * 8);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            float v[8];
            load4f(v, src + idx * 8);
            load4f(v + 4, src + idx * 8 + 4);
            store8(dst + idx * 8, v);
        } else {
            const size_t i = nvec * 8 + (idx - nvec);
            dst[i] = f2bf(src[i]);
        }
    }
}

extern "C" int ftk_cast_from_f32(void *dst, const float *src, size_t n, ftk_stream stream) {
    if (n == 0) return 0;
    size_t nvec = aligned16(dst) && aligned16(src) ? n / 8 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 8), CAST_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(CAST_THREADS), 0, stream, cast_from_f32_kernel)(
        (bf16 *)dst, src, n, nvec);
    return launch_check("cast_from_f32");
}
