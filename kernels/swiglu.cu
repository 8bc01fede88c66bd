// swiglu.cu: SwiGLU activation, out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
//
// forward  out (N, F) = silu(gate) * up; amax (when not NULL) = max |out| over the stored bf16
//          values (--fp8), as rmsnorm_fwd's: zeroed, each block's max joined by an integer
//          atomicMax (common.cuh block_amax_publish)
// backward dgate = dout * up * s * (1 + g (1 - s)), dup = dout * silu(g), s = sigmoid(g);
//          dgate may alias dout when ld == F (every input of an element is read before it
//          is written).
//   layout: gate, up, dgate, dup are (N, F) with row stride ld: the two halves of the fused
//   (N, 2F) gate|up GEMM output (gate = gu, up = gu + F, ld = 2F), or separate buffers
//   (ld = F); out and dout are contiguous (N, F).
//   launch: grid-stride, 256 threads; work items are groups of 8 elements of one row with
//   16-byte loads while F and ld are multiples of 8 and all pointers are 16-byte aligned,
//   else single elements.
//   numerics: fp32, exp via __expf (ex2.approx: a few ulp), one bf16 rounding per output.
#include "common.cuh"

#define SWIGLU_THREADS 256

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + __expf(-g)); }

// work item idx -> (offset in the ld-strided tensors, offset in the contiguous ones), for
// items of `w` elements (8 or 1), F / w items per row
__device__ __forceinline__ void swiglu_item(size_t idx, int F, int ld, int w, size_t *os, size_t *oc) {
    const size_t per_row = (size_t)(F / w);
    const size_t r = idx / per_row, j = (idx - r * per_row) * (size_t)w;
    *os = r * (size_t)ld + j;
    *oc = r * (size_t)F + j;
}

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_fwd_kernel(bf16 *out, float *amax, const bf16 *gate, const bf16 *up, int N, int F, int ld, int vec) {
    __shared__ float scratch[32];
    const int w = vec ? 8 : 1;
    float m = 0.0f;   // max |out| of this thread's stored (rounded) outputs
    const size_t items = (size_t)N * (size_t)(F / w);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t os, oc;
        swiglu_item(idx, F, ld, w, &os, &oc);
        if (vec) {
            float g[8], u[8], y[8];
            load8(g, gate + os);
            load8(u, up + os);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                y[k] = g[k] / (1.0f + __expf(-g[k])) * u[k];
                m = fmaxf(m, fabsf(bf2f(f2bf(y[k]))));
            }
            store8(out + oc, y);
        } else {
            float g = bf2f(gate[os]);
            const bf16 q = f2bf(g / (1.0f + __expf(-g)) * bf2f(up[os]));
            out[oc] = q;
            m = fmaxf(m, fabsf(bf2f(q)));
        }
    }
    if (amax) block_amax_publish(amax, m, scratch);
}

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                  int N, int F, int ld, int vec) {
    const int w = vec ? 8 : 1;
    const size_t items = (size_t)N * (size_t)(F / w);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t os, oc;
        swiglu_item(idx, F, ld, w, &os, &oc);
        if (vec) {
            float g[8], u[8], dy[8], dg[8], du[8];
            load8(g, gate + os);
            load8(u, up + os);
            load8(dy, dout + oc);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float s = sigmoidf_(g[k]);
                dg[k] = dy[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
                du[k] = dy[k] * (g[k] * s);
            }
            store8(dgate + os, dg);
            store8(dup + os, du);
        } else {
            float g = bf2f(gate[os]), u = bf2f(up[os]), dy = bf2f(dout[oc]);
            float s = sigmoidf_(g);
            dgate[os] = f2bf(dy * u * s * (1.0f + g * (1.0f - s)));
            dup[os] = f2bf(dy * (g * s));
        }
    }
}

extern "C" int ftk_swiglu_fwd(void *out, float *amax, const void *gate, const void *up, int N, int F, int ld,
                              ftk_stream stream) {
    if (amax_zero(amax, stream, "swiglu_fwd") != 0) return -1;
    if (N <= 0 || F <= 0) return 0;
    const int vec = F % 8 == 0 && ld % 8 == 0 && aligned16(out) && aligned16(gate) && aligned16(up);
    unsigned blocks = elementwise_blocks((size_t)N * (size_t)(F / (vec ? 8 : 1)), SWIGLU_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(SWIGLU_THREADS), 0, stream, swiglu_fwd_kernel)(
        (bf16 *)out, amax, (const bf16 *)gate, (const bf16 *)up, N, F, ld, vec);
    return launch_check("swiglu_fwd");
}

extern "C" int ftk_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate,
                              const void *up, int N, int F, int ld, ftk_stream stream) {
    if (N <= 0 || F <= 0) return 0;
    const int vec = F % 8 == 0 && ld % 8 == 0 && aligned16(dgate) && aligned16(dup) &&
                    aligned16(dout) && aligned16(gate) && aligned16(up);
    unsigned blocks = elementwise_blocks((size_t)N * (size_t)(F / (vec ? 8 : 1)), SWIGLU_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(SWIGLU_THREADS), 0, stream, swiglu_bwd_kernel)(
        (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, N,
        F, ld, vec);
    return launch_check("swiglu_bwd");
}
