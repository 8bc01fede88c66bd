// scale.cu: out (n) = alpha * inp, bf16; out may equal inp (the LoRA scaling of an (N, r)
// intermediate: small and memory-bound, so no vector path).
//   launch: grid-stride, 256 threads, one element per thread.
//   numerics: fp32 product, one bf16 rounding.
#include "common.cuh"

#define SCALE_THREADS 256

__global__ void __launch_bounds__(SCALE_THREADS)
scale_kernel(bf16 *out, const bf16 *inp, float alpha, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = f2bf(alpha * bf2f(inp[i]));
}

extern "C" int ftk_scale(void *out, const void *inp, float alpha, size_t n, ftk_stream stream) {
    if (n == 0) return 0;
    LAUNCH_KERNEL(dim3(elementwise_blocks(n, SCALE_THREADS)), dim3(SCALE_THREADS), 0, stream, scale_kernel)(
        (bf16 *)out, (const bf16 *)inp, alpha, n);
    return launch_check("scale");
}
