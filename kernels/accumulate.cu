// accumulate.cu: dst (n, fp32) += alpha * src (n, bf16) (gradient accumulation into fp32).
//   launch: grid-stride, 256 threads; groups of 8 (one 16-byte bf16 load, two float4
//   read-modify-writes) while the pointers are 16-byte aligned, single elements otherwise.
//   numerics: fp32 (alpha * src then add: the CPU op's order), exact up to fp32 rounding.
#include "common.cuh"

#define ACC_THREADS 256

__global__ void __launch_bounds__(ACC_THREADS)
accumulate_kernel(float *dst, const bf16 *src, size_t n, size_t nvec, float alpha) {
    const size_t items = nvec + (n - nvec * 8);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            float s[8], d[8];
            load8(s, src + idx * 8);
            load4f(d, dst + idx * 8);
            load4f(d + 4, dst + idx * 8 + 4);
#pragma unroll
            for (int k = 0; k < 8; k++) d[k] += alpha * s[k];
            store4f(dst + idx * 8, d);
            store4f(dst + idx * 8 + 4, d + 4);
        } else {
            const size_t i = nvec * 8 + (idx - nvec);
            dst[i] += alpha * bf2f(src[i]);
        }
    }
}

extern "C" int ftk_accumulate(float *dst, const void *src, size_t n, float alpha,
                              ftk_stream stream) {
    if (n == 0) return 0;
    size_t nvec = aligned16(dst) && aligned16(src) ? n / 8 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 8), ACC_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(ACC_THREADS), 0, stream, accumulate_kernel)(
        dst, (const bf16 *)src, n, nvec, alpha);
    return launch_check("accumulate");
}
