// lmhead_xent.cu: the fused softmax + cross-entropy step of the lm_head, one chunk of rows.
//
// The lm_head's three products (logits = x W^T, dx = dlogits W, dW += dlogits^T x) are
// cuBLASLt GEMMs issued by the CUDA backend (src/backend_cuda.c, cu_lmhead_xent); this
// kernel is what sits between them. Given a chunk of fp32 logits (rows, V), row stride V:
//   per row: m = max, lse = m + log(sum exp(l - m)), loss = lse - l[target]; when training
//   the row is overwritten IN PLACE by bf16 g = softmax - onehot(target), UNSCALED: the
//   backend's dx and dW GEMMs apply dloss as their fp32 alpha. While the softmax is flat
//   (early training) the target entry p_t - 1 is nearly the same number on every row and
//   rounds to the same bf16 value: a systematic error of the gradient's scale. Unscaled it
//   is near -1, where that error is below min(p_t, 2^-9) (p_t ~ 1/V when flat); scaled by
//   dloss first (as autocast's bf16 backward does) it would be up to 2^-8 whatever V is.
//   row r's V bf16 values occupy the first 2V bytes of its own 4V fp32 bytes, so as a bf16
//   matrix the chunk has row stride 2V elements (the GEMMs take that leading dimension).
//   Rows with target -100 get loss 0 and dlogits 0; a target outside [0, V) gives a NaN
//   loss (the host validates targets) and dlogits 0.
//
// launch: one block of 256 threads per row (block max and sum reductions, three passes
//   over the row: max, sum of exp, write). The in-place write goes in strides of
//   XENT_THREADS * XENT_UNROLL elements: every thread reads its XENT_UNROLL values of the
//   stride, the block synchronises, then writes their bf16 dlogits. The bf16 elements
//   [j0, j0 + S) of a stride starting at j0 lie in fp32 elements [j0/2, j0/2 + S/2), all of
//   which (j0/2 + S/2 <= j0 + S) were read in this or an earlier stride: no value is
//   overwritten before every thread has read it.
// numerics: fp32 max and sums over V, exp via __expf, log via logf; losses fp32; dlogits
//   one bf16 rounding.
#include "common.cuh"

#define XENT_THREADS 256
#define XENT_UNROLL 4

// row r of dlogits (bf16, V values) over row r of logits (fp32): strides as in the header
__device__ __forceinline__ void xent_write_dlogits(float *l, int V, int tgt, float lse) {
    bf16 *d = reinterpret_cast<bf16 *>(l);
    for (int j0 = 0; j0 < V; j0 += XENT_THREADS * XENT_UNROLL) {
        float g[XENT_UNROLL];
#pragma unroll
        for (int q = 0; q < XENT_UNROLL; q++) {
            const int j = j0 + q * XENT_THREADS + (int)threadIdx.x;
            g[q] = j < V ? __expf(l[j] - lse) - (j == tgt ? 1.0f : 0.0f) : 0.0f;
        }
        __syncthreads();                                   // the stride is read by everyone
#pragma unroll
        for (int q = 0; q < XENT_UNROLL; q++) {
            const int j = j0 + q * XENT_THREADS + (int)threadIdx.x;
            if (j < V) d[j] = f2bf(g[q]);
        }
    }
}

// one block per row of the chunk; logits (rows, V) fp32, rewritten as bf16 rows of stride 2V
__global__ void __launch_bounds__(XENT_THREADS)
lmhead_xent_rows_kernel(float *losses, float *logits, const int32_t *targets, int V, int backward) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    float *l = logits + (size_t)r * V;
    const int tgt = targets[r];
    if (tgt == -100 || tgt < 0 || tgt >= V) {              // uniform over the block
        if (threadIdx.x == 0) losses[r] = tgt == -100 ? 0.0f : __int_as_float(0x7fc00000);
        if (backward) {
            bf16 *d = reinterpret_cast<bf16 *>(l);
            for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = f2bf(0.0f);
        }
        return;
    }
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(l[j] - m);
    s = block_sum(s, scratch);
    const float lse = m + logf(s);
    if (threadIdx.x == 0) losses[r] = lse - l[tgt];
    if (backward) xent_write_dlogits(l, V, tgt, lse);
}

extern "C" int ftk_lmhead_xent_rows(float *losses, float *logits, const int32_t *targets, int rows,
                                    int V, int backward, ftk_stream stream) {
    if (rows <= 0) return 0;
    if (V <= 0) return ft_error("lmhead_xent: bad vocab size V=%d", V);
    LAUNCH_KERNEL(dim3(rows), dim3(XENT_THREADS), 0, stream, lmhead_xent_rows_kernel)(
        losses, logits, targets, V, backward);
    return launch_check("lmhead_xent (softmax rows)");
}
