// swiglu.cu: SwiGLU activation, out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
//
// forward  out (n) = silu(gate) * up
// backward dgate = dout * up * s * (1 + g (1 - s)), dup = dout * silu(g), s = sigmoid(g);
//          dgate may alias dout (every input of an element is read before it is written).
//   launch: grid-stride, 256 threads; work items are groups of 8 elements with 16-byte
//   loads while all pointers are 16-byte aligned, then single elements for the n % 8 tail
//   (or for everything when a pointer is misaligned).
//   numerics: fp32, exp via __expf (ex2.approx: a few ulp), one bf16 rounding per output.
#include "common.cuh"

#define SWIGLU_THREADS 256

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + __expf(-g)); }

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, size_t nvec) {
    const size_t items = nvec + (n - nvec * 8);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            float g[8], u[8], y[8];
            load8(g, gate + idx * 8);
            load8(u, up + idx * 8);
#pragma unroll
            for (int k = 0; k < 8; k++) y[k] = g[k] / (1.0f + __expf(-g[k])) * u[k];
            store8(out + idx * 8, y);
        } else {
            const size_t i = nvec * 8 + (idx - nvec);
            float g = bf2f(gate[i]);
            out[i] = f2bf(g / (1.0f + __expf(-g)) * bf2f(up[i]));
        }
    }
}

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                  size_t n, size_t nvec) {
    const size_t items = nvec + (n - nvec * 8);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            float g[8], u[8], dy[8], dg[8], du[8];
            load8(g, gate + idx * 8);
            load8(u, up + idx * 8);
            load8(dy, dout + idx * 8);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float s = sigmoidf_(g[k]);
                dg[k] = dy[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
                du[k] = dy[k] * (g[k] * s);
            }
            store8(dgate + idx * 8, dg);
            store8(dup + idx * 8, du);
        } else {
            const size_t i = nvec * 8 + (idx - nvec);
            float g = bf2f(gate[i]), u = bf2f(up[i]), dy = bf2f(dout[i]);
            float s = sigmoidf_(g);
            dgate[i] = f2bf(dy * u * s * (1.0f + g * (1.0f - s)));
            dup[i] = f2bf(dy * (g * s));
        }
    }
}

extern "C" int ftk_swiglu_fwd(void *out, const void *gate, const void *up, size_t n,
                              ftk_stream stream) {
    if (n == 0) return 0;
    size_t nvec = aligned16(out) && aligned16(gate) && aligned16(up) ? n / 8 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 8), SWIGLU_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(SWIGLU_THREADS), 0, stream, swiglu_fwd_kernel)(
        (bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n, nvec);
    return launch_check("swiglu_fwd");
}

extern "C" int ftk_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate,
                              const void *up, size_t n, ftk_stream stream) {
    if (n == 0) return 0;
    size_t nvec = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
                          aligned16(up) ? n / 8 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 8), SWIGLU_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(SWIGLU_THREADS), 0, stream, swiglu_bwd_kernel)(
        (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, n,
        nvec);
    return launch_check("swiglu_bwd");
}
