// embedding.cu: token embedding lookup and its deterministic backward.
//
// forward  out (N, C) = wte (V, C)[tokens (N)]
//   launch: grid N (one block per row), 128 threads; each thread copies 8 columns per
//   16-byte load/store (C % 8 == 0 and 16-byte aligned pointers), else bf16 by bf16.
//   A token outside [0, V) yields a NaN row (the host validates tokens before upload).
//   numerics: a copy, exact.
//
// backward dwte (V, C) += sum over rows n with tokens[n] == v of dout[n]  (bf16, or fp32: dw_f32)
//   Deterministic without atomics or sorting: the block of row n works only if n is the
//   FIRST row holding its token (scan of tokens[0..n), __syncthreads_or); it then gathers
//   every later row with the same token in ascending order (tiles of 128 tokens, a warp
//   ballot per tile), sums them in fp32 registers and adds the sum to dwte once.
//   launch: grid (N, ceil(C / 1024)), 128 threads, each owns 8 consecutive columns.
//   cost: O(N^2 / 128) token comparisons per column chunk (cheap for N = B*T up to ~32k),
//   one read of dout, one read-modify-write of the touched dwte rows.
//   numerics: fp32 sum in row order, one rounding of (dwte + sum) per element to dwte's dtype.
//   Out-of-range tokens are skipped.
#include "common.cuh"

#define EMB_THREADS 128
#define EMB_COLS (EMB_THREADS * 8)

__global__ void __launch_bounds__(EMB_THREADS)
embedding_fwd_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte, int C, int V, int vec) {
    const int n = blockIdx.x;
    const int tok = tokens[n];
    bf16 *o = out + (size_t)n * C;
    if (tok < 0 || tok >= V) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = f2bf(__int_as_float(0x7fc00000));
        return;
    }
    const bf16 *w = wte + (size_t)tok * C;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(o + c) = *reinterpret_cast<const uint4 *>(w + c);
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = w[c];
    }
}

__global__ void __launch_bounds__(EMB_THREADS)
embedding_bwd_kernel(void *dwte, int dw_f32, const bf16 *dout, const int32_t *tokens, int N, int C,
                     int V, int vec) {
    __shared__ unsigned tile_mask[EMB_THREADS / 32];
    const int n = blockIdx.x;
    const int tok = tokens[n];
    if (tok < 0 || tok >= V) return;                       // uniform over the block

    // 1. does an earlier row hold the same token? then that row's block does the work
    int seen = 0;
    for (int m = threadIdx.x; m < n; m += blockDim.x) seen |= tokens[m] == tok;
    if (__syncthreads_or(seen)) return;                    // uniform over the block

    // 2. fp32 sum of the rows n, and later rows with the same token, in ascending order
    const int c0 = blockIdx.y * EMB_COLS + threadIdx.x * 8;
    const int ncols = c0 < C ? (C - c0 < 8 ? C - c0 : 8) : 0;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = 0.0f;
    auto add_row = [&](int m) {
        const bf16 *g = dout + (size_t)m * C + c0;
        if (vec && ncols == 8) {
            float v[8];
            load8(v, g);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += v[k];
        } else {
            for (int k = 0; k < ncols; k++) acc[k] += bf2f(g[k]);
        }
    };
    add_row(n);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int m0 = n + 1; m0 < N; m0 += EMB_THREADS) {
        const int m = m0 + threadIdx.x;
        unsigned ballot = __ballot_sync(0xffffffffu, m < N && tokens[m] == tok);
        if (lane == 0) tile_mask[warp] = ballot;
        __syncthreads();
#pragma unroll 1
        for (int w = 0; w < EMB_THREADS / 32; w++) {
            unsigned bits = tile_mask[w];
            while (bits) {
                int b = __ffs((int)bits) - 1;
                bits &= bits - 1;
                add_row(m0 + w * 32 + b);
            }
        }
        __syncthreads();                                   // tile_mask is reused
    }

    // 3. one rounding into the gradient
    if (dw_f32) {
        float *d = (float *)dwte + (size_t)tok * C + c0;
        for (int k = 0; k < ncols; k++) d[k] += acc[k];
        return;
    }
    bf16 *d = (bf16 *)dwte + (size_t)tok * C + c0;
    if (vec && ncols == 8) {
        float v[8];
        load8(v, d);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] += acc[k];
        store8(d, v);
    } else {
        for (int k = 0; k < ncols; k++) d[k] = f2bf(bf2f(d[k]) + acc[k]);
    }
}

extern "C" int ftk_embedding_fwd(void *out, const int32_t *tokens, const void *wte, int N, int C,
                                 int V, ftk_stream stream) {
    if (N <= 0 || C <= 0) return 0;
    int vec = C % 8 == 0 && aligned16(out) && aligned16(wte);
    LAUNCH_KERNEL(dim3(N), dim3(EMB_THREADS), 0, stream, embedding_fwd_kernel)(
        (bf16 *)out, tokens, (const bf16 *)wte, C, V, vec);
    return launch_check("embedding_fwd");
}

extern "C" int ftk_embedding_bwd(void *dwte, int dw_f32, const void *dout, const int32_t *tokens,
                                 int N, int C, int V, ftk_stream stream) {
    if (N <= 0 || C <= 0) return 0;
    int vec = C % 8 == 0 && (dw_f32 || aligned16(dwte)) && aligned16(dout);
    dim3 grid(N, ceil_div(C, EMB_COLS));
    LAUNCH_KERNEL(grid, dim3(EMB_THREADS), 0, stream, embedding_bwd_kernel)(
        dwte, dw_f32, (const bf16 *)dout, tokens, N, C, V, vec);
    return launch_check("embedding_bwd");
}
