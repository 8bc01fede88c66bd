// add.cu: out (n) = a + b, bf16; out may alias a or b. And out (n) = alpha * inp (scale).
//   launch: grid-stride, 256 threads; groups of 8 elements with 16-byte loads while all
//   pointers are 16-byte aligned, single elements for the tail or misaligned pointers.
//   numerics: fp32 add of the two bf16 values, one bf16 rounding.
#include "common.cuh"

#define ADD_THREADS 256

__global__ void __launch_bounds__(ADD_THREADS)
add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n, size_t nvec) {
    const size_t items = nvec + (n - nvec * 8);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            float x[8], y[8];
            load8(x, a + idx * 8);
            load8(y, b + idx * 8);
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] += y[k];
            store8(out + idx * 8, x);
        } else {
            const size_t i = nvec * 8 + (idx - nvec);
            out[i] = f2bf(bf2f(a[i]) + bf2f(b[i]));
        }
    }
}

extern "C" int ftk_add(void *out, const void *a, const void *b, size_t n, ftk_stream stream) {
    if (n == 0) return 0;
    size_t nvec = aligned16(out) && aligned16(a) && aligned16(b) ? n / 8 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 8), ADD_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(ADD_THREADS), 0, stream, add_kernel)(
        (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n, nvec);
    return launch_check("add");
}

// out (n) = alpha * inp: one element per thread, fp32 product, one bf16 rounding (the LoRA
// scaling of an (N, r) intermediate: small and memory-bound, no vector path needed)
__global__ void __launch_bounds__(ADD_THREADS)
scale_kernel(bf16 *out, const bf16 *inp, float alpha, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = f2bf(alpha * bf2f(inp[i]));
}

extern "C" int ftk_scale(void *out, const void *inp, float alpha, size_t n, ftk_stream stream) {
    if (n == 0) return 0;
    LAUNCH_KERNEL(dim3(elementwise_blocks(n, ADD_THREADS)), dim3(ADD_THREADS), 0, stream, scale_kernel)(
        (bf16 *)out, (const bf16 *)inp, alpha, n);
    return launch_check("scale");
}
