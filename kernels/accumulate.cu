// accumulate.cu: dst (n, fp32) += alpha * src (n, bf16 or fp32) (gradient accumulation into
// fp32; fp32 sources are --reduce_dtype fp32's reduce-scatter outputs).
//   launch: grid-stride, 256 threads; groups of 8 (one 16-byte bf16 load or two float4 loads,
//   two float4 read-modify-writes) while the pointers are 16-byte aligned, single elements
//   otherwise.
//   numerics: fp32 (alpha * src then add: the CPU op's order), exact up to fp32 rounding.
#include "common.cuh"

#define ACC_THREADS 256

__device__ __forceinline__ void acc_load8(float out[8], const bf16 *p) { load8(out, p); }
__device__ __forceinline__ void acc_load8(float out[8], const float *p) {
    load4f(out, p);
    load4f(out + 4, p + 4);
}
__device__ __forceinline__ float acc_load1(const bf16 *p) { return bf2f(*p); }
__device__ __forceinline__ float acc_load1(const float *p) { return *p; }

// the grid-stride loop of both kernels: nvec groups of 8, then the n - 8 nvec single elements
template <typename T>
__device__ __forceinline__ void accumulate_items(float *dst, const T *src, size_t n, size_t nvec, float alpha) {
    const size_t items = nvec + (n - nvec * 8);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            float s[8], d[8];
            acc_load8(s, src + idx * 8);
            load4f(d, dst + idx * 8);
            load4f(d + 4, dst + idx * 8 + 4);
#pragma unroll
            for (int k = 0; k < 8; k++) d[k] += alpha * s[k];
            store4f(dst + idx * 8, d);
            store4f(dst + idx * 8 + 4, d + 4);
        } else {
            const size_t i = nvec * 8 + (idx - nvec);
            dst[i] += alpha * acc_load1(src + i);
        }
    }
}

__global__ void __launch_bounds__(ACC_THREADS)
accumulate_bf16_kernel(float *dst, const bf16 *src, size_t n, size_t nvec, float alpha) {
    accumulate_items(dst, src, n, nvec, alpha);
}

__global__ void __launch_bounds__(ACC_THREADS)
accumulate_f32_kernel(float *dst, const float *src, size_t n, size_t nvec, float alpha) {
    accumulate_items(dst, src, n, nvec, alpha);
}

extern "C" int ftk_accumulate(float *dst, const void *src, int src_f32, size_t n, float alpha,
                              ftk_stream stream) {
    if (n == 0) return 0;
    size_t nvec = aligned16(dst) && aligned16(src) ? n / 8 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 8), ACC_THREADS);
    if (src_f32)
        LAUNCH_KERNEL(dim3(blocks), dim3(ACC_THREADS), 0, stream, accumulate_f32_kernel)(
            dst, (const float *)src, n, nvec, alpha);
    else
        LAUNCH_KERNEL(dim3(blocks), dim3(ACC_THREADS), 0, stream, accumulate_bf16_kernel)(
            dst, (const bf16 *)src, n, nvec, alpha);
    return launch_check("accumulate");
}
